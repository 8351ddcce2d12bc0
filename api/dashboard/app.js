// Precursor dashboard: fleet overview, machine page and model rollout, kept current by the live tail.
// Plain ES modules, no framework, no external assets.

import { drawChart, escapeHtml, formatTime } from "./chart.js";
import { takeToken } from "./fragment.js";
import { renderFlow } from "./flow.js";
import { LiveTail } from "./live.js";

const TOKEN_KEY = "precursor.token";
const HOUR = 3600e3;
const PALETTE = ["#13294b", "#e4572e", "#2f9e66", "#3b7dd8", "#d79b00", "#8e44ad", "#16a085", "#c0392b"];

const state = {
  token: null,
  // A fixed threshold asked of the API; null: each machine is judged at its model's operating point (below).
  threshold: null,
  // The rule the pipeline alerts by (the fleet summary's operating_point), so live predictions are judged alike.
  operatingPoint: { default_threshold: 0.7, threshold: null, model_thresholds: {}, clear_factor: 0.6 },
  machineThreshold: 0.7,
  live: null,
  page: null,
  fleet: null,
  machine: null,
};

// ---------------------------------------------------------------------------------------------------------------
// Small helpers

function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// The threshold a prediction of `modelName` carrying `own` is judged at: the same rule as contracts/alerting.py.
export function thresholdFor(modelName, own) {
  const op = state.operatingPoint;
  if (state.threshold !== null && state.threshold !== undefined) return state.threshold;
  if (Object.hasOwn(op.model_thresholds ?? {}, modelName)) return op.model_thresholds[modelName];
  if (op.threshold !== null && op.threshold !== undefined) return op.threshold;
  return own ?? op.default_threshold;
}

// Bands against the operating point: high = at risk (alerts raise here), elevated = in the hysteresis gap (an alert
// already raised stays), low = below where alerts clear; critical = high and at 90 % or more.
export function level(risk, threshold) {
  if (risk >= threshold && risk >= 0.9) return "critical";
  if (risk >= threshold) return "high";
  if (risk >= threshold * state.operatingPoint.clear_factor) return "elevated";
  return "low";
}

const LEVEL_NAMES = { low: "Low", elevated: "Elevated", high: "High", critical: "Critical" };

function pct(v) {
  return v === null || v === undefined ? "–" : `${Math.round(v * 100)}%`;
}

function ms(iso) {
  return iso ? Date.parse(iso) : null;
}

function ago(iso, reference) {
  if (!iso) return "–";
  const diff = (reference ?? Date.now()) - Date.parse(iso);
  const hours = diff / HOUR;
  if (Math.abs(hours) < 1) return `${Math.max(0, Math.round(diff / 60e3))} min`;
  if (Math.abs(hours) < 48) return `${hours.toFixed(hours < 10 ? 1 : 0)} h`;
  return `${(hours / 24).toFixed(1)} d`;
}

class HttpError extends Error {
  constructor(status, detail) {
    super(detail);
    this.status = status;
  }
}

async function api(path) {
  const response = await fetch(`/api/v1${path}`, {
    headers: { Authorization: `Bearer ${state.token}`, Accept: "application/json" },
    cache: "no-store",
  });
  if (response.status === 401) {
    signOut("The token was not accepted. Paste a valid one.");
    throw new HttpError(401, "unauthorized");
  }
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new HttpError(response.status, body.detail ?? response.statusText);
  return body;
}

function view() {
  return document.getElementById("view");
}

function showError(err) {
  if (err instanceof HttpError && err.status === 401) return;
  view().replaceChildren(h("div", { class: "banner", role: "alert", text: `Could not load: ${err.message}` }));
}

// ---------------------------------------------------------------------------------------------------------------
// Authentication: the token comes from the URL fragment (never sent to the server) or the sign-in form.

function takeTokenFromFragment() {
  const { token, rest } = takeToken(location.hash);
  if (token === null) return;
  sessionStorage.setItem(TOKEN_KEY, token);
  history.replaceState(null, "", rest);
}

function askForToken(message) {
  const dialog = document.getElementById("sign-in");
  const error = document.getElementById("sign-in-error");
  error.hidden = !message;
  error.textContent = message ?? "";
  if (!dialog.open) dialog.showModal();
}

function signOut(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  state.token = null;
  stopLive();
  document.getElementById("sign-out").hidden = true;
  askForToken(message);
}

// ---------------------------------------------------------------------------------------------------------------
// Live status and subscriptions

function setLiveState(value) {
  const node = document.getElementById("live-status");
  const text = { live: "live", connecting: "connecting…", error: "reconnecting…", off: "not live", unauthorized: "no access" };
  node.dataset.state = value;
  node.querySelector(".live-text").textContent = text[value] ?? value;
  if (value === "unauthorized") signOut("The token was not accepted. Paste a valid one.");
}

function stopLive() {
  if (state.live) state.live.stop();
  state.live = null;
  setLiveState("off");
}

function startLive(params, onEvent) {
  stopLive();
  state.live = new LiveTail({ token: state.token, params, onEvent, onState: setLiveState }).start();
}

// ---------------------------------------------------------------------------------------------------------------
// Fleet overview

function riskCell(risk, threshold) {
  const bar = h("span", { class: level(risk, threshold) });
  bar.style.width = `${Math.max(2, Math.round(risk * 100))}%`;
  return h("div", { class: "riskcell" }, h("div", { class: "bar" }, bar), h("span", { class: "riskval", text: pct(risk) }));
}

function sortedMachines(fleet) {
  return [...fleet.rows.values()].sort((a, b) => b.max_risk - a.max_risk || a.machine_id.localeCompare(b.machine_id));
}

function renderSummary(fleet) {
  const rows = [...fleet.rows.values()];
  const atRisk = rows.filter((r) => r.max_risk >= r.threshold).length;
  const alerts = rows.reduce((n, r) => n + (r.open_alerts?.length ?? 0), 0);
  const newest = rows.reduce((best, r) => (!best || r.window_end > best ? r.window_end : best), null);
  const edges = new Set(rows.map((r) => r.edge_id)).size;
  const card = (label, value, extra = {}) =>
    h("div", { class: `card ${extra.class ?? ""}`, dataset: { card: extra.key ?? label } }, h("div", { class: "label", text: label }), h("div", { class: `value ${extra.small ? "small" : ""}`, text: value }));
  return h(
    "section",
    { class: "cards", id: "fleet-cards" },
    card("Machines", String(fleet.total), { key: "machines" }),
    card(state.threshold === null ? "At risk" : `At risk ≥ ${pct(state.threshold)}`, String(atRisk), { key: "at-risk", class: atRisk ? "alarm" : "" }),
    card("Open alerts", String(alerts), { key: "alerts", class: alerts ? "alarm" : "" }),
    card("Edges", String(edges), { key: "edges" }),
    card("Newest window", newest ? formatTime(ms(newest)) : "–", { key: "newest", small: true }),
  );
}

function renderTiles(machines) {
  return h(
    "div",
    { class: "tiles", id: "risk-map" },
    machines.map((r) =>
      h(
        "a",
        { class: `tile ${level(r.max_risk, r.threshold)}`, href: `#/machine/${encodeURIComponent(r.machine_id)}`, title: `${r.machine_id}: ${pct(r.max_risk)} ${r.top_kind}`, dataset: { machine: r.machine_id } },
        h("div", { class: "id", text: r.machine_id }),
        h("div", { class: "pct", text: pct(r.max_risk) }),
      ),
    ),
  );
}

function renderTable(machines, newest) {
  const body = machines.map((r, i) =>
    h(
      "tr",
      { dataset: { machine: r.machine_id, risk: String(r.max_risk) } },
      h("td", { class: "right muted num", text: String(i + 1) }),
      h("td", {}, h("a", { href: `#/machine/${encodeURIComponent(r.machine_id)}`, class: "mono", text: r.machine_id })),
      h("td", {}, riskCell(r.max_risk, r.threshold)),
      h("td", {}, h("span", { class: `pill ${level(r.max_risk, r.threshold)}`, title: `alert threshold ${pct(r.threshold)}`, text: LEVEL_NAMES[level(r.max_risk, r.threshold)] })),
      h("td", {}, h("span", { class: "kind", text: r.top_kind })),
      h("td", { class: "num" }, r.elevated_since ? h("span", { class: "since", title: r.elevated_since }, h("span", { text: `${ago(r.elevated_since, ms(newest))}` }), h("small", { text: formatTime(ms(r.elevated_since)) })) : h("span", { class: "muted", text: "–" })),
      h("td", {}, (r.open_alerts ?? []).length ? r.open_alerts.map((a) => h("span", { class: "pill high", title: `raised ${a.raised_at}`, text: a.kind })) : h("span", { class: "muted", text: "–" })),
      h("td", { class: "num hide-sm", text: formatTime(ms(r.window_end)) }),
      h("td", { class: "mono hide-sm", text: r.model_version }),
      h("td", { class: "hide-sm", text: r.edge_id }),
    ),
  );
  return h(
    "div",
    { class: "table-wrap" },
    h(
      "table",
      { id: "fleet-table" },
      h("thead", {}, h("tr", {}, ["#", "Machine", "Risk", "Level", "Top kind", "At risk since", "Alerts", "Last window", "Model", "Edge"].map((t, i) => h("th", { class: `${i === 0 ? "right" : ""} ${i > 6 ? "hide-sm" : ""}`, text: t })))),
      h("tbody", {}, body),
    ),
  );
}

function renderFleet() {
  const fleet = state.fleet;
  if (!fleet || state.page !== "fleet") return;
  const machines = sortedMachines(fleet);
  const newest = machines.reduce((best, r) => (!best || r.window_end > best ? r.window_end : best), null);
  const feed = document.getElementById("live-feed") ?? h("ul", { class: "feed", id: "live-feed" });
  const content = h(
    "div",
    {},
    h(
      "div",
      { class: "page-head" },
      h("div", {}, h("h1", { text: "Fleet risk" }), h("div", { class: "sub", text: state.threshold === null ? "Each machine's latest prediction, riskiest first. At risk means at or above its model's alert threshold." : `Each machine's latest prediction, riskiest first. At risk means ≥ ${pct(state.threshold)}.` })),
    ),
    renderSummary(fleet),
    h(
      "div",
      { class: "grid cols-main" },
      h(
        "div",
        { class: "grid" },
        h("section", { class: "panel" }, h("header", {}, h("h2", { text: "Risk map" }), h("span", { class: "hint", text: "colour = risk band; click a machine" })), h("div", { class: "panel-body" }, renderTiles(machines))),
        h(
          "section",
          { class: "panel" },
          h("header", {}, h("h2", { text: "Machines by risk" }), h("span", { class: "hint", text: fleet.total > machines.length ? `top ${machines.length} of ${fleet.total}` : `${machines.length} machines` })),
          machines.length ? renderTable(machines, newest) : h("div", { class: "empty", text: "No predictions stored yet. Start an edge agent and the pipeline." }),
        ),
      ),
      h(
        "aside",
        { class: "panel" },
        h("header", {}, h("h2", { text: "Live" }), h("span", { class: "hint", text: "new predictions and alerts on top; recent alerts below" })),
        feed.children.length ? feed : h("div", {}, h("div", { class: "empty", id: "feed-empty", text: "Waiting for new predictions…" }), feed),
      ),
    ),
  );
  view().replaceChildren(content);
  for (const machine of fleet.flash) {
    document.querySelector(`#fleet-table tr[data-machine="${CSS.escape(machine)}"]`)?.classList.add("flash");
    document.querySelector(`#risk-map [data-machine="${CSS.escape(machine)}"]`)?.classList.add("flash");
  }
  fleet.flash.clear();
  document.body.dataset.ready = "fleet";
}

let renderQueued = false;
function scheduleRender(render) {
  if (renderQueued) return;
  renderQueued = true;
  requestAnimationFrame(() => {
    renderQueued = false;
    render();
  });
}

function feedItem(kind, text, risk, when = null, threshold = state.operatingPoint.default_threshold) {
  const feed = document.getElementById("live-feed");
  if (!feed) return;
  document.getElementById("feed-empty")?.remove();
  const badge = h("span", { class: `badge ${kind === "alert" ? "alert" : level(risk, threshold)}` });
  const stamp = when ? formatTime(ms(when)) : new Date().toLocaleTimeString([], { hour12: false });
  const item = h("li", { class: when ? "past" : "new", dataset: { kind } }, badge, h("span", { class: "what", text }), h("span", { class: "when", text: stamp }));
  if (when) feed.append(item);
  else feed.prepend(item);
  while (feed.children.length > 60) feed.lastChild.remove();
}

function onFleetEvent(event, payload) {
  const fleet = state.fleet;
  if (!fleet) return;
  const m = payload.message;
  if (event === "prediction") {
    const row = fleet.rows.get(m.machine_id);
    const newer = !row || m.window_end > row.window_end || (m.window_end === row.window_end && m.seq > row.seq);
    if (newer) {
      const threshold = thresholdFor(m.model_name, m.threshold);
      const wasRisky = row && row.max_risk >= row.threshold;
      const risky = payload.max_risk >= threshold;
      const since = risky ? (wasRisky ? row.elevated_since : m.window_end) : null;
      if (!row) fleet.total += 1;
      fleet.rows.set(m.machine_id, {
        ...(row ?? { open_alerts: [] }),
        machine_id: m.machine_id,
        max_risk: payload.max_risk,
        top_kind: payload.top_kind,
        risk: m.risk,
        window_start: m.window_start,
        window_end: m.window_end,
        model_name: m.model_name,
        model_version: m.model_version,
        edge_id: m.edge_id,
        seq: m.seq,
        threshold,
        elevated_since: since,
      });
      fleet.flash.add(m.machine_id);
      scheduleRender(renderFleet);
    }
    feedItem("prediction", `${m.machine_id} ${pct(payload.max_risk)} ${payload.top_kind}`, payload.max_risk, null, thresholdFor(m.model_name, m.threshold));
  } else if (event === "alert") {
    const row = fleet.rows.get(m.machine_id);
    if (row) {
      const others = (row.open_alerts ?? []).filter((a) => a.kind !== m.kind);
      row.open_alerts = m.state === "raised" ? [...others, { kind: m.kind, raised_at: m.at, risk: m.risk }] : others;
      fleet.flash.add(m.machine_id);
      scheduleRender(renderFleet);
    }
    feedItem("alert", `${m.state === "raised" ? "▲ alert" : "▼ cleared"} ${m.machine_id} ${m.kind}`, m.risk);
  }
}

async function showFleet() {
  state.page = "fleet";
  document.body.dataset.ready = "";
  const [summary, page, alerts] = await Promise.all([api(`/fleet/summary`), api(`/machines/at-risk?limit=1000`), api(`/alerts?limit=8`)]);
  state.threshold = summary.threshold;
  state.operatingPoint = summary.operating_point;
  state.fleet = { rows: new Map(page.items.map((r) => [r.machine_id, r])), total: page.total, flash: new Set() };
  document.getElementById("live-feed")?.replaceChildren();
  renderFleet();
  for (const a of alerts.items) feedItem("alert", `${a.state === "raised" ? "▲ alert" : "▼ cleared"} ${a.machine_id} ${a.kind}`, a.risk, a.at);
  startLive({ topic: ["predictions", "alerts"] }, onFleetEvent);
}

// ---------------------------------------------------------------------------------------------------------------
// Machine page

const RANGES = [
  ["24h", 24 * HOUR],
  ["3d", 72 * HOUR],
  ["7d", 168 * HOUR],
  ["30d", 720 * HOUR],
  ["All", null],
];

function riskChartSpec(machine) {
  const t = machine.timeline;
  const points = t.risk.map((p) => ({ t: ms(p.t), v: p.risk }));
  const markers = [];
  const spans = [];
  for (const f of t.failures) {
    markers.push({ t: ms(f.failed_at), shape: "line", color: "#b3141c", label: `✕ ${f.failure_kind}`, kind: "failure", title: `failure ${f.failure_kind} ${formatTime(ms(f.failed_at))}` });
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

// Why: for each alert it raised, what moved the risk most, as the edge found it by occlusion on its model (the
// reasons of the prediction that raised it), newest first; and for the latest prediction where the edge explained it.
function reasonList(reasons) {
  return h(
    "span",
    { class: "reasons" },
    reasons.flatMap((r, i) => [i ? "; " : null, h("span", { class: `reason ${r.kind}`, title: `${r.kind} ${r.name}: the risk fell by ${pct(r.risk_drop)} without it`, text: r.text })]),
  );
}

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

function renderMachine() {
  const machine = state.machine;
  if (!machine || state.page !== "machine") return;
  const t = machine.timeline;
  const s = t.summary;
  const latest = s.latest;
  const risk = latest ? latest.max_risk : 0;
  const ranges = h(
    "div",
    { class: "ranges", role: "group", "aria-label": "time range" },
    RANGES.map(([label]) => h("button", { type: "button", class: machine.range === label ? "on" : "", onclick: () => loadMachine(machine.id, label), text: label })),
  );
  const riskBox = h("div", { id: "risk-chart" });
  const legend = h(
    "div",
    { class: "legend" },
    h("span", {}, h("i", { class: "risk" }), "predicted risk (peak per bucket)"),
    h("span", {}, h("i", { class: "threshold" }), "alert threshold"),
    h("span", {}, h("i", { class: "failure" }), "failure"),
    h("span", {}, h("i", { class: "lead" }), "lead time"),
    h("span", {}, h("i", { class: "alert" }), "alert"),
    h("span", {}, h("i", { class: "maint" }), "maintenance"),
  );
  const sensorNames = Object.keys(t.telemetry);
  const sensorBoxes = sensorNames.map((name) => ({ name, box: h("div", { class: "sensor-chart" }) }));
  const failures = t.failures;
  const content = h(
    "div",
    {},
    h(
      "div",
      { class: "page-head" },
      h(
        "div",
        {},
        h("div", { class: "muted" }, h("a", { href: "#/", text: "← Fleet" })),
        h(
          "div",
          { class: "machine-head" },
          h("h1", { class: "mono", id: "machine-title", text: machine.id }),
          h("span", { class: `bigrisk ${level(risk, state.machineThreshold)}`, id: "machine-risk", text: pct(risk) }),
          h("span", { class: `pill ${level(risk, state.machineThreshold)}`, text: LEVEL_NAMES[level(risk, state.machineThreshold)] }),
          latest ? h("span", { class: "kind", text: latest.top_kind }) : null,
        ),
        h(
          "div",
          { class: "facts" },
          h("span", {}, "last window ", h("b", { id: "machine-last", text: latest ? formatTime(ms(latest.window_end)) : "–" })),
          h("span", {}, "edge ", h("b", { text: (s.edges ?? []).join(", ") || "–" })),
          h("span", {}, "model ", h("b", { id: "machine-model", text: latest ? latest.model_version : "–" })),
          h("span", {}, "predictions ", h("b", { text: String(s.predictions) })),
          h("span", {}, "failures ", h("b", { text: String(s.events.failure ?? 0) })),
        ),
      ),
      ranges,
    ),
    h(
      "section",
      { class: "panel" },
      h("header", {}, h("h2", { text: "Predicted risk over time" }), legend),
      h("div", { class: "panel-body" }, t.risk.length ? riskBox : h("div", { class: "empty", text: "No predictions in this range." })),
    ),
    reasonsPanel(t),
    h(
      "div",
      { class: "grid cols-main" },
      h(
        "section",
        { class: "panel" },
        h("header", {}, h("h2", { text: "Sensors" }), h("span", { class: "hint", text: "mean with min–max band, on the risk chart's time axis; failures marked" })),
        h(
          "div",
          { class: "panel-body" },
          sensorNames.length
            ? h("div", { class: "sensors", id: "sensor-charts" }, sensorBoxes.map(({ name, box }) => sensorPanel(name, t.telemetry[name], box)))
            : h("div", { class: "empty", text: "No telemetry summaries for this machine: raw telemetry stays at the edge; an edge sends per-sensor summaries with telemetry_summaries: {enabled: true} in its config." }),
        ),
      ),
      h(
        "section",
        { class: "panel" },
        h("header", {}, h("h2", { text: "Failures and lead time" })),
        failures.length
          ? h(
              "div",
              { class: "table-wrap" },
              h(
                "table",
                { id: "failures-table", class: "compact" },
                h("thead", {}, h("tr", {}, ["Failed", "Kind", "Lead time", "Peak"].map((x) => h("th", { text: x })))),
                h(
                  "tbody",
                  {},
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
                ),
              ),
            )
          : h("div", { class: "empty", text: "No failures in this range." }),
        h("header", {}, h("h2", { text: "Recent events" })),
        t.events.length
          ? h(
              "ul",
              { class: "feed", id: "events-list" },
              t.events.slice(0, 25).map((e) =>
                h("li", {}, h("span", { class: `badge ${e.kind === "failure" ? "critical" : e.kind === "maintenance" ? "low" : e.kind === "error" ? "elevated" : "alert"}` }), h("span", { class: "what mono", text: e.event }), h("span", { class: "when", text: formatTime(ms(e.ts)) })),
              ),
            )
          : h("div", { class: "empty", text: "No events in this range." }),
      ),
    ),
  );
  view().replaceChildren(content);
  if (t.risk.length) drawChart(riskBox, riskChartSpec(machine));
  for (const { name, box } of sensorBoxes) {
    const points = t.telemetry[name].map((p) => ({ t: ms(p.t), v: p.mean, lo: p.min, hi: p.max }));
    drawChart(box, {
      height: 150,
      xMin: machine.xMin,
      xMax: machine.xMax,
      series: [{ label: name, color: PALETTE[sensorNames.indexOf(name) % PALETTE.length], points, width: 1.5 }],
      markers: t.failures.map((f) => ({ t: ms(f.failed_at), shape: "line", color: "#b3141c", width: 1.5, kind: "failure" })),
      yFormat: (v) => (Math.abs(v) >= 100 ? v.toFixed(0) : v.toFixed(1)),
      label: `${name} of ${machine.id}`,
    });
  }
  document.body.dataset.ready = "machine";
}

function onMachineEvent(event, payload) {
  const machine = state.machine;
  if (!machine || event !== "prediction") return;
  const m = payload.message;
  const t = machine.timeline;
  t.risk.push({ t: m.window_end, risk: payload.max_risk, risk_mean: payload.max_risk, top_kind: payload.top_kind, windows: 1 });
  t.summary.latest = { ...m, max_risk: payload.max_risk, top_kind: payload.top_kind };
  t.summary.predictions += 1;
  const end = ms(m.window_end);
  if (machine.xMax !== undefined && end > machine.xMax) {
    const width = machine.xMax - machine.xMin;
    machine.xMax = end;
    if (machine.range !== "All") machine.xMin = end - width;
  }
  scheduleRender(renderMachine);
}

async function loadMachine(id, range) {
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
  renderMachine();
  if (!state.live || state.live.params.machine_id !== id) startLive({ topic: "predictions", machine_id: id }, onMachineEvent);
}

// ---------------------------------------------------------------------------------------------------------------
// Models: rollout per edge, versions and quality

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

const SVG_NS = "http://www.w3.org/2000/svg";

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  for (const child of children.flat()) if (child) node.appendChild(child);
  return node;
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

function arrow(raw, calibrated, digits) {
  if (raw === null && calibrated === null) return "–";
  const f = (v) => (v === null ? "–" : v.toFixed(digits));
  return `${f(raw)} → ${f(calibrated)}`;
}

// calibration: the API's /models/calibration answer, or a string saying why there is none.
function calibrationSection(calibration) {
  const body =
    typeof calibration === "string"
      ? h("div", { class: "empty", id: "calibration-none", text: calibration })
      : !calibration.length
        ? h("div", { class: "empty", id: "calibration-none", text: "No registered versions: the API reads them from the model registry named by PRECURSOR_API_MODEL_REGISTRY." })
        : h(
            "div",
            { class: "table-wrap" },
            h(
              "table",
              { id: "calibration-table", class: "compact" },
              h("thead", {}, h("tr", {}, ["Version", "Map", "a", "b", "Fitted on", "ECE raw → calibrated", "Brier raw → calibrated", "Reliability", "Why"].map((x) => h("th", { text: x })))),
              h(
                "tbody",
                {},
                calibration.map((c) => {
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
                }),
              ),
            ),
          );
  return h(
    "section",
    { class: "panel", id: "calibration" },
    h("header", {}, h("h2", { text: "Calibration per version" }), h("span", { class: "hint", text: "the map each signed artifact carries, and its validation figures (10 equal-width bins)" })),
    body,
  );
}

function renderModels(rollout, versions, quality, calibration) {
  const known = [...new Set(versions.map((v) => v.model_version).concat(rollout.flatMap((e) => e.versions.map((v) => v.model_version))))].sort();
  const colour = (version) => PALETTE[known.indexOf(version) % PALETTE.length];
  const cards = rollout.map((e) => {
    const stack = h("div", { class: "stack" });
    for (const v of e.versions) {
      const part = h("span", { title: `${v.model_version}: ${v.machines} machines` });
      part.style.width = `${(100 * v.machines) / Math.max(1, e.machines)}%`;
      part.style.background = colour(v.model_version);
      stack.appendChild(part);
    }
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
      stack,
      h("div", { class: "stack-legend" }, e.versions.map((v) => {
        const dot = h("i");
        dot.style.background = colour(v.model_version);
        return h("span", {}, dot, `${v.model_version} · ${v.machines}`);
      })),
    );
  });
  const qualityBox = h("div", { id: "quality-chart" });
  const qualityLegend = h("div", { class: "legend" }, known.map((version) => {
    const swatch = h("i");
    swatch.style.background = colour(version);
    return h("span", {}, swatch, version);
  }));
  const score = known.map((version) => {
    const rows = quality.filter((q) => q.model_version === version);
    const sum = (key) => rows.reduce((n, q) => n + (q[key] ?? 0), 0);
    const tp = sum("tp");
    const leads = rows.filter((q) => q.mean_lead_time_h !== null && q.failures_caught);
    const caught = leads.reduce((n, q) => n + q.failures_caught, 0);
    const lead = caught ? leads.reduce((n, q) => n + q.mean_lead_time_h * q.failures_caught, 0) / caught : null;
    return { version, windows: sum("windows"), precision: tp + sum("fp") ? tp / (tp + sum("fp")) : null, recall: tp + sum("fn") ? tp / (tp + sum("fn")) : null, failures: sum("failures"), caught: sum("failures_caught"), lead };
  }).filter((r) => r.windows);
  const content = h(
    "div",
    {},
    h("div", { class: "page-head" }, h("div", {}, h("h1", { text: "Models" }), h("div", { class: "sub", text: "Rollout per edge, versions in use, and how good each version is." }))),
    h("section", { class: "grid" }, h("h2", { text: "Rollout per edge" }), rollout.length ? h("div", { class: "edges", id: "rollout" }, cards) : h("div", { class: "panel empty", text: "No edges have reported yet." })),
    h(
      "div",
      { class: "grid cols-main" },
      h(
        "section",
        { class: "panel" },
        h("header", {}, h("h2", { text: "Quality per version over time" }), h("span", { class: "hint", text: "precision (solid) and recall (dashed) per day" })),
        h("div", { class: "panel-body" }, quality.length ? h("div", {}, qualityLegend, qualityBox) : h("div", { class: "empty", text: "No predictions with a known outcome yet." })),
        score.length
          ? h(
              "div",
              { class: "table-wrap" },
              h(
                "table",
                { id: "scorecard", class: "compact" },
                h("thead", {}, h("tr", {}, ["Version", "Windows", "Precision", "Recall", "Failures caught", "Mean lead time"].map((x) => h("th", { text: x })))),
                h("tbody", {}, score.map((r) => h("tr", { dataset: { version: r.version } }, h("td", { class: "mono", text: r.version }), h("td", { class: "num", text: String(r.windows) }), h("td", { class: "num", text: pct(r.precision) }), h("td", { class: "num", text: pct(r.recall) }), h("td", { class: "num", text: `${r.caught} of ${r.failures}` }), h("td", { class: "num", text: r.lead === null ? "–" : `${r.lead.toFixed(1)} h` })))),
              ),
            )
          : null,
      ),
      h(
        "section",
        { class: "panel" },
        h("header", {}, h("h2", { text: "Versions per edge" })),
        h(
          "div",
          { class: "table-wrap" },
          h(
            "table",
            { id: "versions-table", class: "compact" },
            h("thead", {}, h("tr", {}, ["Edge", "Version", "Machines", "Last window"].map((x) => h("th", { text: x })))),
            h("tbody", {}, versions.map((v) => h("tr", {}, h("td", { text: v.edge_id }), h("td", { class: "mono", text: v.model_version }), h("td", { class: "num", text: String(v.machines) }), h("td", { class: "num", text: formatTime(ms(v.last_window_end)) })))),
          ),
        ),
      ),
    ),
  );
  content.appendChild(calibrationSection(calibration));
  view().replaceChildren(content);
  if (quality.length) {
    const series = [];
    for (const version of known) {
      const rows = quality.filter((q) => q.model_version === version);
      if (!rows.length) continue;
      series.push({ label: `${version} precision`, color: colour(version), points: rows.map((q) => ({ t: ms(q.bucket_start), v: q.precision })) });
      series.push({ label: `${version} recall`, color: colour(version), width: 1.2, points: rows.map((q) => ({ t: ms(q.bucket_start), v: q.recall })) });
    }
    drawChart(qualityBox, { height: 240, yMin: 0, yMax: 1, yFormat: (v) => `${Math.round(v * 100)}%`, series, label: "quality per model version" });
    qualityBox.querySelectorAll("path[data-series$='recall']").forEach((p) => p.setAttribute("stroke-dasharray", "5 4"));
  }
  document.body.dataset.ready = "models";
}

async function showModels() {
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

// ---------------------------------------------------------------------------------------------------------------
// Dataflow: the stages from reading to store, redrawn every few seconds while the page is open.

const FLOW_REFRESH_MS = 5000;
let flowTimer = null;

async function showFlow() {
  state.page = "flow";
  stopLive();
  const report = await api("/flow");
  if (state.page !== "flow") return;
  view().replaceChildren(renderFlow(report));
  document.body.dataset.ready = "flow";
  clearTimeout(flowTimer);
  flowTimer = setTimeout(() => showFlow().catch(showError), FLOW_REFRESH_MS);
}

// ---------------------------------------------------------------------------------------------------------------
// Routing

async function route() {
  if (!state.token) {
    askForToken();
    return;
  }
  clearTimeout(flowTimer);
  const hash = location.hash || "#/";
  const page = hash.startsWith("#/models") ? "models" : hash.startsWith("#/flow") ? "flow" : "fleet";
  for (const link of document.querySelectorAll("[data-nav]")) {
    link.classList.toggle("active", link.dataset.nav === page);
  }
  try {
    const machine = hash.match(/^#\/machine\/(.+)$/);
    if (machine) await loadMachine(decodeURIComponent(machine[1]), "7d");
    else if (page === "models") await showModels();
    else if (page === "flow") await showFlow();
    else await showFleet();
  } catch (err) {
    showError(err);
  }
}

function init() {
  takeTokenFromFragment();
  state.token = sessionStorage.getItem(TOKEN_KEY);
  document.getElementById("sign-out").hidden = !state.token;
  document.getElementById("sign-out").addEventListener("click", () => signOut());
  document.getElementById("sign-in-form").addEventListener("submit", () => {
    const value = document.getElementById("token-input").value.trim();
    if (!value) return;
    sessionStorage.setItem(TOKEN_KEY, value);
    state.token = value;
    document.getElementById("sign-out").hidden = false;
    route();
  });
  window.addEventListener("hashchange", route);
  let resizeTimer = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => (state.page === "machine" ? renderMachine() : null), 150);
  });
  route();
}

init();
