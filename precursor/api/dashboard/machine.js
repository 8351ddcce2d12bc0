// The machine page: its predicted risk over time with failures, lead times, alerts and maintenance marked; why its
// alerts were raised; its sensors on the same time axis; its failures and recent events. New predictions arrive live.

import { PALETTE, drawChart, formatTime } from "./chart.js";
import { h, scheduleRender, table, view } from "./dom.js";
import { HOUR, ms, pct } from "./format.js";
import { LEVEL_NAMES } from "./risk.js";

const RANGES = [
  ["24h", 24 * HOUR],
  ["3d", 72 * HOUR],
  ["7d", 168 * HOUR],
  ["30d", 720 * HOUR],
  ["All", null],
];

const FAILURE_RED = "#b3141c";

// Loads `id`'s timeline over `range` (a RANGES label), draws it and follows its new predictions live.
export async function showMachine(shell, id, range) {
  const { state, api, startLive } = shell;
  state.page = "machine";
  document.body.dataset.ready = "";
  const summary = await api(`/machines/${encodeURIComponent(id)}`);
  const span = RANGES.find(([label]) => label === range)?.[1] ?? null;
  const last = summary.last_window_end ?? new Date().toISOString();
  const first = summary.first_window_end ?? last;
  const params = new URLSearchParams({ points: "600" });
  let xMin = ms(first);
  const xMax = ms(last);
  if (span) {
    params.set("since", new Date(xMax - span).toISOString());
    xMin = Math.max(xMin, xMax - span);
  }
  const timeline = await api(`/machines/${encodeURIComponent(id)}/timeline?${params}`);
  state.machineThreshold = timeline.threshold;
  state.machine = { id, range, timeline, xMin, xMax };
  renderMachine(shell);
  if (!state.live || state.live.params.machine_id !== id) startLive({ topic: "predictions", machine_id: id }, (event, payload) => onMachineEvent(shell, event, payload));
}

export function renderMachine(shell) {
  const { state } = shell;
  const machine = state.machine;
  if (!machine || state.page !== "machine") return;
  const t = machine.timeline;
  const riskBox = h("div", { id: "risk-chart" });
  const sensorBoxes = Object.keys(t.telemetry).map((name) => ({ name, box: h("div", { class: "sensor-chart" }) }));
  view().replaceChildren(
    h(
      "div",
      {},
      pageHead(shell, machine),
      riskPanel(t, riskBox),
      reasonsPanel(t),
      h("div", { class: "grid cols-main" }, sensorsPanel(t, sensorBoxes), failuresPanel(t)),
    ),
  );
  // Charts are drawn once their boxes are in the page: they take the width they are given.
  if (t.risk.length) drawChart(riskBox, riskChartSpec(machine));
  sensorBoxes.forEach(({ name, box }, i) => drawChart(box, sensorChartSpec(machine, name, PALETTE[i % PALETTE.length])));
  document.body.dataset.ready = "machine";
}

function onMachineEvent(shell, event, payload) {
  const machine = shell.state.machine;
  if (!machine || event !== "prediction") return;
  const m = payload.message;
  const t = machine.timeline;
  t.risk.push({ t: m.window_end, risk: payload.max_risk, risk_mean: payload.max_risk, top_kind: payload.top_kind, windows: 1 });
  t.summary.latest = { ...m, max_risk: payload.max_risk, top_kind: payload.top_kind };
  t.summary.predictions += 1;
  // The time axis follows the newest window; a fixed range keeps its width.
  const end = ms(m.window_end);
  if (machine.xMax !== undefined && end > machine.xMax) {
    const width = machine.xMax - machine.xMin;
    machine.xMax = end;
    if (machine.range !== "All") machine.xMin = end - width;
  }
  scheduleRender(() => renderMachine(shell));
}

// ---------------------------------------------------------------------------------------------------------------
// The head: which machine, how risky now, the facts of its latest window, and the time range

function pageHead(shell, machine) {
  const s = machine.timeline.summary;
  return h("div", { class: "page-head" }, h("div", {}, h("div", { class: "muted" }, h("a", { href: "#/", text: "← Fleet" })), headline(shell.state, machine.id, s.latest), facts(s)), rangeButtons(shell, machine));
}

function headline(state, id, latest) {
  const risk = latest ? latest.max_risk : 0;
  const band = state.bands.level(risk, state.machineThreshold);
  return h(
    "div",
    { class: "machine-head" },
    h("h1", { class: "mono", id: "machine-title", text: id }),
    h("span", { class: `bigrisk ${band}`, id: "machine-risk", text: pct(risk) }),
    h("span", { class: `pill ${band}`, text: LEVEL_NAMES[band] }),
    latest ? h("span", { class: "kind", text: latest.top_kind }) : null,
  );
}

function facts(s) {
  const latest = s.latest;
  return h(
    "div",
    { class: "facts" },
    h("span", {}, "last window ", h("b", { id: "machine-last", text: latest ? formatTime(ms(latest.window_end)) : "–" })),
    h("span", {}, "edge ", h("b", { text: (s.edges ?? []).join(", ") || "–" })),
    h("span", {}, "model ", h("b", { id: "machine-model", text: latest ? latest.model_version : "–" })),
    h("span", {}, "predictions ", h("b", { text: String(s.predictions) })),
    h("span", {}, "failures ", h("b", { text: String(s.events.failure ?? 0) })),
  );
}

function rangeButtons(shell, machine) {
  return h(
    "div",
    { class: "ranges", role: "group", "aria-label": "time range" },
    RANGES.map(([label]) => h("button", { type: "button", class: machine.range === label ? "on" : "", onclick: () => showMachine(shell, machine.id, label), text: label })),
  );
}

// ---------------------------------------------------------------------------------------------------------------
// Predicted risk over time

function riskPanel(t, riskBox) {
  return h(
    "section",
    { class: "panel" },
    h("header", {}, h("h2", { text: "Predicted risk over time" }), riskLegend()),
    h("div", { class: "panel-body" }, t.risk.length ? riskBox : h("div", { class: "empty", text: "No predictions in this range." })),
  );
}

function riskLegend() {
  return h(
    "div",
    { class: "legend" },
    h("span", {}, h("i", { class: "risk" }), "predicted risk (peak per bucket)"),
    h("span", {}, h("i", { class: "threshold" }), "alert threshold"),
    h("span", {}, h("i", { class: "failure" }), "failure"),
    h("span", {}, h("i", { class: "lead" }), "lead time"),
    h("span", {}, h("i", { class: "alert" }), "alert"),
    h("span", {}, h("i", { class: "maint" }), "maintenance"),
  );
}

function riskChartSpec(machine) {
  const t = machine.timeline;
  const points = t.risk.map((p) => ({ t: ms(p.t), v: p.risk }));
  const markers = [];
  const spans = [];
  for (const f of t.failures) {
    markers.push({ t: ms(f.failed_at), shape: "line", color: FAILURE_RED, label: `✕ ${f.failure_kind}`, kind: "failure", title: `failure ${f.failure_kind} ${formatTime(ms(f.failed_at))}` });
    if (f.warned_at) spans.push({ from: ms(f.warned_at), to: ms(f.failed_at), color: "rgba(228, 87, 46, 0.16)", label: `lead ${f.lead_time_h.toFixed(1)} h` });
  }
  for (const a of t.alerts) {
    markers.push({ t: ms(a.at), v: a.state === "raised" ? Math.min(a.risk, 0.97) : Math.max(a.risk, 0.03), shape: "triangle", color: a.state === "raised" ? "#ffb020" : "#2f9e66", kind: `alert-${a.state}`, label: `alert ${a.state}`, title: `alert ${a.state}: ${a.kind} ${pct(a.risk)}` });
  }
  for (const e of t.events) {
    if (e.kind === "maintenance") markers.push({ t: ms(e.ts), shape: "tick", color: "#3b7dd8", kind: "maintenance", label: "", title: e.event });
  }
  return {
    height: 280,
    yMin: 0,
    yMax: 1,
    yFormat: (v) => `${Math.round(v * 100)}%`,
    xMin: machine.xMin,
    xMax: machine.xMax,
    series: [{ label: "risk", color: "#13294b", points, width: 2, fill: "rgba(19, 41, 75, 0.06)" }],
    thresholds: [{ v: t.threshold, color: "#e4572e", label: `alert threshold ${pct(t.threshold)}` }],
    spans,
    markers,
    label: `predicted risk of ${machine.id}`,
  };
}

// ---------------------------------------------------------------------------------------------------------------
// Why: for each alert it raised, what moved the risk most, as the edge found it by occlusion on its model (the
// reasons of the prediction that raised it), newest first; and for the latest prediction where the edge explained it.

function reasonsPanel(t) {
  const latest = t.summary.latest;
  const raised = t.alerts.filter((a) => a.state === "raised").sort((a, b) => (a.at < b.at ? 1 : a.at > b.at ? -1 : 0)).slice(0, 8);
  return h(
    "section",
    { class: "panel", id: "reasons-panel" },
    h("header", {}, h("h2", { text: "Why: the reasons of its alerts" }), h("span", { class: "hint", text: "what moved the risk most, as the edge found it" })),
    latest?.reasons?.length ? h("p", { class: "why-now", id: "latest-reasons" }, h("b", { text: "Latest window: " }), reasonList(latest.reasons)) : null,
    raised.length
      ? h(
          "ul",
          { class: "feed why", id: "alert-reasons" },
          raised.map((a) =>
            h(
              "li",
              { dataset: { at: a.at, kind: a.kind } },
              h("span", { class: "when", text: `${formatTime(ms(a.at))} · ${a.kind} ${pct(a.risk)}` }),
              a.reasons?.length ? reasonList(a.reasons) : h("span", { class: "muted", text: "no reasons: its edge does not explain this model" }),
            ),
          ),
        )
      : h("div", { class: "empty", text: "No alerts raised in this range." }),
  );
}

function reasonList(reasons) {
  return h(
    "span",
    { class: "reasons" },
    reasons.flatMap((r, i) => [i ? "; " : null, h("span", { class: `reason ${r.kind}`, title: `${r.kind} ${r.name}: the risk fell by ${pct(r.risk_drop)} without it`, text: r.text })]),
  );
}

// ---------------------------------------------------------------------------------------------------------------
// Sensors: the edge's per-sensor summaries, each on the risk chart's time axis

function sensorsPanel(t, sensorBoxes) {
  return h(
    "section",
    { class: "panel" },
    h("header", {}, h("h2", { text: "Sensors" }), h("span", { class: "hint", text: "mean with min–max band, on the risk chart's time axis; failures marked" })),
    h(
      "div",
      { class: "panel-body" },
      sensorBoxes.length
        ? h("div", { class: "sensors", id: "sensor-charts" }, sensorBoxes.map(({ name, box }) => sensorPanel(name, t.telemetry[name], box)))
        : h("div", { class: "empty", text: "No telemetry summaries for this machine: raw telemetry stays at the edge; an edge sends per-sensor summaries with telemetry_summaries: {enabled: true} in its config." }),
    ),
  );
}

// One sensor's chart with its name and latest value (the newest summary's last reading).
function sensorPanel(name, points, box) {
  const newest = points.length ? points[points.length - 1] : null;
  const last = newest && newest.last !== null && newest.last !== undefined ? newest.last : null;
  return h(
    "div",
    { class: "sensor", "data-sensor": name, "data-points": String(points.length), "data-last": last === null ? "" : String(last) },
    h("h3", {}, name, last === null ? null : h("span", { class: "last", text: ` last ${Math.abs(last) >= 100 ? last.toFixed(0) : last.toFixed(2)}`, title: newest ? `at ${formatTime(ms(newest.t))}` : "" })),
    box,
  );
}

function sensorChartSpec(machine, name, color) {
  const t = machine.timeline;
  return {
    height: 150,
    xMin: machine.xMin,
    xMax: machine.xMax,
    series: [{ label: name, color, points: t.telemetry[name].map((p) => ({ t: ms(p.t), v: p.mean, lo: p.min, hi: p.max })), width: 1.5 }],
    markers: t.failures.map((f) => ({ t: ms(f.failed_at), shape: "line", color: FAILURE_RED, width: 1.5, kind: "failure" })),
    yFormat: (v) => (Math.abs(v) >= 100 ? v.toFixed(0) : v.toFixed(1)),
    label: `${name} of ${machine.id}`,
  };
}

// ---------------------------------------------------------------------------------------------------------------
// Failures with their lead times, and recent events

function failuresPanel(t) {
  return h(
    "section",
    { class: "panel" },
    h("header", {}, h("h2", { text: "Failures and lead time" })),
    t.failures.length ? failuresTable(t.failures) : h("div", { class: "empty", text: "No failures in this range." }),
    h("header", {}, h("h2", { text: "Recent events" })),
    t.events.length ? eventsList(t.events.slice(0, 25)) : h("div", { class: "empty", text: "No events in this range." }),
  );
}

function failuresTable(failures) {
  return table(
    "failures-table",
    ["Failed", "Kind", "Lead time", "Peak"],
    failures.map((f) =>
      h(
        "tr",
        {},
        h("td", { class: "num", text: formatTime(ms(f.failed_at)) }),
        h("td", {}, h("span", { class: "kind", text: f.failure_kind })),
        h("td", { class: "num" }, f.lead_time_h !== null ? h("b", { text: `${f.lead_time_h.toFixed(1)} h` }) : h("span", { class: "pill critical", text: "missed" })),
        h("td", { class: "num", text: pct(f.peak_risk) }),
      ),
    ),
  );
}

function eventsList(events) {
  return h(
    "ul",
    { class: "feed", id: "events-list" },
    events.map((e) => h("li", {}, h("span", { class: `badge ${eventBadge(e.kind)}` }), h("span", { class: "what mono", text: e.event }), h("span", { class: "when", text: formatTime(ms(e.ts)) }))),
  );
}

function eventBadge(kind) {
  if (kind === "failure") return "critical";
  if (kind === "maintenance") return "low";
  if (kind === "error") return "elevated";
  return "alert";
}
