// The models page: which version each edge runs and whether it proves who it is, the versions in use, how good each
// version is over time, and the calibration each signed artifact carries.

import { PALETTE, drawChart, formatTime } from "./chart.js";
import { h, svg, table, view } from "./dom.js";
import { ms, pct } from "./format.js";
import { HttpError } from "./http.js";

export async function showModels({ state, api, stopLive }) {
  state.page = "models";
  document.body.dataset.ready = "";
  // An unreadable registry (503) says why on the page; the rest of the page still renders.
  const calibration = api("/models/calibration").catch((err) => {
    if (err instanceof HttpError && err.status !== 401) return err.message;
    throw err;
  });
  const [rollout, versions, quality, calibrations] = await Promise.all([api("/models/rollout"), api("/models/versions"), api("/models/quality?bucket=1d"), calibration]);
  renderModels(rollout, versions, quality, calibrations);
  stopLive();
}

function renderModels(rollout, versions, quality, calibration) {
  const known = [...new Set(versions.map((v) => v.model_version).concat(rollout.flatMap((e) => e.versions.map((v) => v.model_version))))].sort();
  // One colour per version, the same in the rollout bars, their legends and the quality chart.
  const colour = (version) => PALETTE[known.indexOf(version) % PALETTE.length];
  const qualityBox = h("div", { id: "quality-chart" });
  const content = h(
    "div",
    {},
    h("div", { class: "page-head" }, h("div", {}, h("h1", { text: "Models" }), h("div", { class: "sub", text: "Rollout per edge, versions in use, and how good each version is." }))),
    h("section", { class: "grid" }, h("h2", { text: "Rollout per edge" }), rollout.length ? h("div", { class: "edges", id: "rollout" }, rollout.map((e) => edgeCard(e, colour))) : h("div", { class: "panel empty", text: "No edges have reported yet." })),
    h("div", { class: "grid cols-main" }, qualityPanel(known, quality, colour, qualityBox), versionsPanel(versions)),
  );
  content.appendChild(calibrationSection(calibration));
  view().replaceChildren(content);
  if (quality.length) drawQualityChart(qualityBox, known, quality, colour);
  document.body.dataset.ready = "models";
}

// ---------------------------------------------------------------------------------------------------------------
// Rollout per edge

function edgeCard(e, colour) {
  const beat = e.heartbeat;
  return h(
    "article",
    { class: "panel edge", dataset: { edge: e.edge_id, status: e.status, flags: e.identity.flags.join(" ") } },
    h("div", { class: "row" }, h("span", { class: "name mono", text: e.edge_id }), h("span", { class: `pill ${e.status}`, text: e.status === "current" ? "up to date" : e.status })),
    h(
      "dl",
      {},
      h("dt", { text: "Runs" }),
      h("dd", { class: "mono", text: e.running_version ?? "–" }),
      h("dt", { text: "Newest" }),
      h("dd", { class: "mono", text: e.newest_version ?? "–" }),
      h("dt", { text: "Machines" }),
      h("dd", { text: `${e.on_newest} of ${e.machines} on newest` }),
      h("dt", { text: "Health" }),
      h("dd", {}, beat ? h("span", { class: `pill ${beat.health}`, text: beat.health }) : h("span", { class: "muted", text: "no heartbeat stored" })),
      beat ? h("dt", { text: "Heartbeat" }) : null,
      beat ? h("dd", { class: "num", text: `${formatTime(ms(beat.heartbeat_at))} · lag ${beat.lag_s.toFixed(1)} s · outbox ${beat.outbox_depth}` }) : null,
      h("dt", { text: "Identity" }),
      h("dd", { class: "identity" }, identityPills(e.identity)),
    ),
    versionStack(e, colour),
    h("div", { class: "stack-legend" }, e.versions.map((v) => h("span", {}, swatch(colour(v.model_version)), `${v.model_version} · ${v.machines}`))),
  );
}

// The edge's machines as one bar, a part per version as wide as its share.
function versionStack(e, colour) {
  const stack = h("div", { class: "stack" });
  for (const v of e.versions) {
    const part = h("span", { title: `${v.model_version}: ${v.machines} machines` });
    part.style.width = `${(100 * v.machines) / Math.max(1, e.machines)}%`;
    part.style.background = colour(v.model_version);
    stack.appendChild(part);
  }
  return stack;
}

function swatch(color) {
  const node = h("i");
  node.style.background = color;
  return node;
}

// Whether an edge proves who it is: its heartbeats verified against the enrolled-edges file, or flagged.
function identityPills(identity) {
  const pills = [];
  if (identity.trust === "verified") pills.push(h("span", { class: "pill ok", text: "verified", title: "signed by a key enrolled for this edge" }));
  if (identity.flags.includes("unsigned")) pills.push(h("span", { class: "pill degraded", dataset: { flag: "unsigned" }, text: "unsigned", title: "its newest heartbeat carries no signature: enroll it with `precursor edge enroll`" }));
  if (identity.flags.includes("forged")) {
    const last = identity.last_forged_at ? `last ${formatTime(ms(identity.last_forged_at))}: ${identity.last_forged_reason}` : "";
    pills.push(h("span", { class: "pill failing", dataset: { flag: "forged" }, text: `forged × ${identity.forged}`, title: `heartbeats in its name that it did not sign; ${last}` }));
  }
  if (identity.flags.includes("unknown_model")) pills.push(h("span", { class: "pill failing", dataset: { flag: "unknown_model" }, text: "unknown model", title: "it runs a model whose hash is no release in the registry" }));
  return pills.length ? pills : h("span", { class: "muted", text: "no heartbeat stored" });
}

// ---------------------------------------------------------------------------------------------------------------
// Quality per version: precision and recall per day, and a scorecard over the whole range

function qualityPanel(known, quality, colour, qualityBox) {
  const legend = h("div", { class: "legend" }, known.map((version) => h("span", {}, swatch(colour(version)), version)));
  const scores = versionScores(known, quality);
  return h(
    "section",
    { class: "panel" },
    h("header", {}, h("h2", { text: "Quality per version over time" }), h("span", { class: "hint", text: "precision (solid) and recall (dashed) per day" })),
    h("div", { class: "panel-body" }, quality.length ? h("div", {}, legend, qualityBox) : h("div", { class: "empty", text: "No predictions with a known outcome yet." })),
    scores.length ? scorecard(scores) : null,
  );
}

// Each version's daily counts summed: precision, recall, failures caught and the lead time averaged per failure caught.
function versionScores(known, quality) {
  return known
    .map((version) => {
      const rows = quality.filter((q) => q.model_version === version);
      const sum = (key) => rows.reduce((n, q) => n + (q[key] ?? 0), 0);
      const tp = sum("tp");
      const leads = rows.filter((q) => q.mean_lead_time_h !== null && q.failures_caught);
      const caught = leads.reduce((n, q) => n + q.failures_caught, 0);
      const lead = caught ? leads.reduce((n, q) => n + q.mean_lead_time_h * q.failures_caught, 0) / caught : null;
      return { version, windows: sum("windows"), precision: tp + sum("fp") ? tp / (tp + sum("fp")) : null, recall: tp + sum("fn") ? tp / (tp + sum("fn")) : null, failures: sum("failures"), caught: sum("failures_caught"), lead };
    })
    .filter((r) => r.windows);
}

function scorecard(scores) {
  return table(
    "scorecard",
    ["Version", "Windows", "Precision", "Recall", "Failures caught", "Mean lead time"],
    scores.map((r) => h("tr", { dataset: { version: r.version } }, h("td", { class: "mono", text: r.version }), h("td", { class: "num", text: String(r.windows) }), h("td", { class: "num", text: pct(r.precision) }), h("td", { class: "num", text: pct(r.recall) }), h("td", { class: "num", text: `${r.caught} of ${r.failures}` }), h("td", { class: "num", text: r.lead === null ? "–" : `${r.lead.toFixed(1)} h` }))),
  );
}

function drawQualityChart(box, known, quality, colour) {
  const series = [];
  for (const version of known) {
    const rows = quality.filter((q) => q.model_version === version);
    if (!rows.length) continue;
    series.push({ label: `${version} precision`, color: colour(version), points: rows.map((q) => ({ t: ms(q.bucket_start), v: q.precision })) });
    series.push({ label: `${version} recall`, color: colour(version), width: 1.2, points: rows.map((q) => ({ t: ms(q.bucket_start), v: q.recall })) });
  }
  drawChart(box, { height: 240, yMin: 0, yMax: 1, yFormat: (v) => `${Math.round(v * 100)}%`, series, label: "quality per model version" });
  box.querySelectorAll("path[data-series$='recall']").forEach((p) => p.setAttribute("stroke-dasharray", "5 4"));
}

// ---------------------------------------------------------------------------------------------------------------
// Versions per edge

function versionsPanel(versions) {
  return h(
    "section",
    { class: "panel" },
    h("header", {}, h("h2", { text: "Versions per edge" })),
    table(
      "versions-table",
      ["Edge", "Version", "Machines", "Last window"],
      versions.map((v) => h("tr", {}, h("td", { text: v.edge_id }), h("td", { class: "mono", text: v.model_version }), h("td", { class: "num", text: String(v.machines) }), h("td", { class: "num", text: formatTime(ms(v.last_window_end)) }))),
    ),
  );
}

// ---------------------------------------------------------------------------------------------------------------
// Calibration per version

// calibration: the API's /models/calibration answer, or a string saying why there is none.
function calibrationSection(calibration) {
  const body =
    typeof calibration === "string"
      ? h("div", { class: "empty", id: "calibration-none", text: calibration })
      : !calibration.length
        ? h("div", { class: "empty", id: "calibration-none", text: "No registered versions: the API reads them from the model registry named by PRECURSOR_API_MODEL_REGISTRY." })
        : calibrationTable(calibration);
  return h(
    "section",
    { class: "panel", id: "calibration" },
    h("header", {}, h("h2", { text: "Calibration per version" }), h("span", { class: "hint", text: "the map each signed artifact carries, and its validation figures (10 equal-width bins)" })),
    body,
  );
}

function calibrationTable(calibration) {
  return table("calibration-table", ["Version", "Map", "a", "b", "Fitted on", "ECE raw → calibrated", "Brier raw → calibrated", "Reliability", "Why"], calibration.map(calibrationRow));
}

function calibrationRow(c) {
  const key = { version: c.version, model: c.model_name };
  if (c.error) return h("tr", { dataset: { ...key, error: "true" } }, h("td", { class: "mono", text: c.version }), h("td", { colspan: 8, class: "failing wrap", text: `unreadable: ${c.error}` }));
  const m = c.calibration;
  const v = c.validation;
  return h(
    "tr",
    { dataset: { ...key, method: m.method, identity: String(c.is_identity) } },
    h("td", { class: "mono", text: c.version }),
    h("td", { text: c.is_identity ? "identity" : m.method }),
    h("td", { class: "num", text: m.a.toFixed(3) }),
    h("td", { class: "num", text: m.b.toFixed(3) }),
    h("td", { class: "num", text: `${m.fitted_on} (${m.positives} failed)` }),
    h("td", { class: "num", dataset: { field: "ece" }, text: arrow(v.ece_raw, v.ece_calibrated, 3) }),
    h("td", { class: "num", dataset: { field: "brier" }, text: arrow(v.brier_raw, v.brier_calibrated, 4) }),
    h("td", {}, v.reliability ? reliabilityDiagram(v.reliability) : h("span", { class: "muted", text: "no bins recorded" })),
    h("td", { class: "muted wrap", text: m.reason || "–" }),
  );
}

function arrow(raw, calibrated, digits) {
  if (raw === null && calibrated === null) return "–";
  const f = (v) => (v === null ? "–" : v.toFixed(digits));
  return `${f(raw)} → ${f(calibrated)}`;
}

// A reliability diagram from a version's validation bins: mean risk (x) against how often those windows failed (y),
// the diagonal where the two agree; each point's area grows with its bin's share of windows.
function reliabilityDiagram(bins, size = 120) {
  const pad = 6;
  const span = size - 2 * pad;
  const at = (x, y) => [pad + x * span, pad + (1 - y) * span];
  const total = bins.reduce((n, b) => n + b.count, 0) || 1;
  const used = bins.filter((b) => b.count && b.mean_predicted !== null && b.observed_rate !== null);
  const points = used.map((b) => at(b.mean_predicted, b.observed_rate));
  const [x0, y0] = at(0, 0);
  const [x1, y1] = at(1, 1);
  return svg(
    "svg",
    { class: "reliability", width: size, height: size, viewBox: `0 0 ${size} ${size}`, role: "img", "aria-label": "reliability diagram on validation" },
    svg("rect", { x: pad, y: pad, width: span, height: span, fill: "none", stroke: "currentColor", "stroke-opacity": 0.25 }),
    svg("line", { x1: x0, y1: y0, x2: x1, y2: y1, stroke: "currentColor", "stroke-opacity": 0.4, "stroke-dasharray": "3 3" }),
    points.length > 1 ? svg("polyline", { points: points.map((p) => p.join(",")).join(" "), fill: "none", stroke: "#3b82f6", "stroke-width": 1.5 }) : null,
    used.map((b, i) => svg("circle", { cx: points[i][0], cy: points[i][1], r: (1.5 + 4 * Math.sqrt(b.count / total)).toFixed(2), fill: "#3b82f6", "data-count": b.count })),
  );
}
