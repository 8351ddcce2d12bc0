// The fleet page: each machine's latest prediction, riskiest first (summary cards, risk map, table), and a feed of
// recent alerts, kept current by the live tail of predictions and alerts.

import { formatTime } from "./chart.js";
import { h, scheduleRender, view } from "./dom.js";
import { ago, ms, pct } from "./format.js";
import { LEVEL_NAMES, RiskBands } from "./risk.js";

const FEED_LENGTH = 60;
const TABLE_COLUMNS = ["#", "Machine", "Risk", "Level", "Top kind", "At risk since", "Alerts", "Last window", "Model", "Edge"];

export async function showFleet({ state, api, startLive }) {
  state.page = "fleet";
  document.body.dataset.ready = "";
  const [summary, page, alerts] = await Promise.all([api(`/fleet/summary`), api(`/machines/at-risk?limit=1000`), api(`/alerts?limit=8`)]);
  state.bands = new RiskBands(summary.threshold, summary.operating_point);
  state.fleet = { rows: new Map(page.items.map((r) => [r.machine_id, r])), total: page.total, flash: new Set() };
  document.getElementById("live-feed")?.replaceChildren();
  renderFleet(state);
  for (const a of alerts.items) feedItem(state.bands, "alert", alertText(a), a.risk, a.at);
  startLive({ topic: ["predictions", "alerts"] }, (event, payload) => onFleetEvent(state, event, payload));
}

function renderFleet(state) {
  const { fleet, bands } = state;
  if (!fleet || state.page !== "fleet") return;
  const machines = sortedMachines(fleet);
  const newest = newestWindow(machines);
  const content = h(
    "div",
    {},
    h(
      "div",
      { class: "page-head" },
      h("div", {}, h("h1", { text: "Fleet risk" }), h("div", { class: "sub", text: bands.threshold === null ? "Each machine's latest prediction, riskiest first. At risk means at or above its model's alert threshold." : `Each machine's latest prediction, riskiest first. At risk means ≥ ${pct(bands.threshold)}.` })),
    ),
    renderSummary(fleet, bands),
    h(
      "div",
      { class: "grid cols-main" },
      h(
        "div",
        { class: "grid" },
        h("section", { class: "panel" }, h("header", {}, h("h2", { text: "Risk map" }), h("span", { class: "hint", text: "colour = risk band; click a machine" })), h("div", { class: "panel-body" }, renderTiles(machines, bands))),
        h(
          "section",
          { class: "panel" },
          h("header", {}, h("h2", { text: "Machines by risk" }), h("span", { class: "hint", text: fleet.total > machines.length ? `top ${machines.length} of ${fleet.total}` : `${machines.length} machines` })),
          machines.length ? renderTable(machines, newest, bands) : h("div", { class: "empty", text: "No predictions stored yet. Start an edge agent and the pipeline." }),
        ),
      ),
      feedPanel(),
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

function sortedMachines(fleet) {
  return [...fleet.rows.values()].sort((a, b) => b.max_risk - a.max_risk || a.machine_id.localeCompare(b.machine_id));
}

function newestWindow(rows) {
  return rows.reduce((best, r) => (!best || r.window_end > best ? r.window_end : best), null);
}

function renderSummary(fleet, bands) {
  const rows = [...fleet.rows.values()];
  const atRisk = rows.filter((r) => r.max_risk >= r.threshold).length;
  const alerts = rows.reduce((n, r) => n + (r.open_alerts?.length ?? 0), 0);
  const newest = newestWindow(rows);
  const edges = new Set(rows.map((r) => r.edge_id)).size;
  const card = (label, value, extra = {}) =>
    h("div", { class: `card ${extra.class ?? ""}`, dataset: { card: extra.key ?? label } }, h("div", { class: "label", text: label }), h("div", { class: `value ${extra.small ? "small" : ""}`, text: value }));
  return h(
    "section",
    { class: "cards", id: "fleet-cards" },
    card("Machines", String(fleet.total), { key: "machines" }),
    card(bands.threshold === null ? "At risk" : `At risk ≥ ${pct(bands.threshold)}`, String(atRisk), { key: "at-risk", class: atRisk ? "alarm" : "" }),
    card("Open alerts", String(alerts), { key: "alerts", class: alerts ? "alarm" : "" }),
    card("Edges", String(edges), { key: "edges" }),
    card("Newest window", newest ? formatTime(ms(newest)) : "–", { key: "newest", small: true }),
  );
}

function renderTiles(machines, bands) {
  return h(
    "div",
    { class: "tiles", id: "risk-map" },
    machines.map((r) =>
      h(
        "a",
        { class: `tile ${bands.level(r.max_risk, r.threshold)}`, href: machineLink(r.machine_id), title: `${r.machine_id}: ${pct(r.max_risk)} ${r.top_kind}`, dataset: { machine: r.machine_id } },
        h("div", { class: "id", text: r.machine_id }),
        h("div", { class: "pct", text: pct(r.max_risk) }),
      ),
    ),
  );
}

function machineLink(id) {
  return `#/machine/${encodeURIComponent(id)}`;
}

function renderTable(machines, newest, bands) {
  return h(
    "div",
    { class: "table-wrap" },
    h(
      "table",
      { id: "fleet-table" },
      h("thead", {}, h("tr", {}, TABLE_COLUMNS.map((t, i) => h("th", { class: `${i === 0 ? "right" : ""} ${i > 6 ? "hide-sm" : ""}`, text: t })))),
      h("tbody", {}, machines.map((r, i) => tableRow(r, i + 1, newest, bands))),
    ),
  );
}

function tableRow(r, rank, newest, bands) {
  const band = bands.level(r.max_risk, r.threshold);
  return h(
    "tr",
    { dataset: { machine: r.machine_id, risk: String(r.max_risk) } },
    h("td", { class: "right muted num", text: String(rank) }),
    h("td", {}, h("a", { href: machineLink(r.machine_id), class: "mono", text: r.machine_id })),
    h("td", {}, riskCell(r.max_risk, r.threshold, bands)),
    h("td", {}, h("span", { class: `pill ${band}`, title: `alert threshold ${pct(r.threshold)}`, text: LEVEL_NAMES[band] })),
    h("td", {}, h("span", { class: "kind", text: r.top_kind })),
    h("td", { class: "num" }, r.elevated_since ? h("span", { class: "since", title: r.elevated_since }, h("span", { text: `${ago(r.elevated_since, ms(newest))}` }), h("small", { text: formatTime(ms(r.elevated_since)) })) : h("span", { class: "muted", text: "–" })),
    h("td", {}, (r.open_alerts ?? []).length ? r.open_alerts.map((a) => h("span", { class: "pill high", title: `raised ${a.raised_at}`, text: a.kind })) : h("span", { class: "muted", text: "–" })),
    h("td", { class: "num hide-sm", text: formatTime(ms(r.window_end)) }),
    h("td", { class: "mono hide-sm", text: r.model_version }),
    h("td", { class: "hide-sm", text: r.edge_id }),
  );
}

function riskCell(risk, threshold, bands) {
  const bar = h("span", { class: bands.level(risk, threshold) });
  bar.style.width = `${Math.max(2, Math.round(risk * 100))}%`;
  return h("div", { class: "riskcell" }, h("div", { class: "bar" }, bar), h("span", { class: "riskval", text: pct(risk) }));
}

// ---------------------------------------------------------------------------------------------------------------
// The live feed: kept across redraws of the page, newest on top, the recent alerts it opened with below.

function feedPanel() {
  const feed = document.getElementById("live-feed") ?? h("ul", { class: "feed", id: "live-feed" });
  return h(
    "aside",
    { class: "panel" },
    h("header", {}, h("h2", { text: "Live" }), h("span", { class: "hint", text: "new predictions and alerts on top; recent alerts below" })),
    feed.children.length ? feed : h("div", {}, h("div", { class: "empty", id: "feed-empty", text: "Waiting for new predictions…" }), feed),
  );
}

// when: the time of a stored alert (appended below); none for a live one (prepended, stamped now).
function feedItem(bands, kind, text, risk, when = null, threshold = bands.operatingPoint.default_threshold) {
  const feed = document.getElementById("live-feed");
  if (!feed) return;
  document.getElementById("feed-empty")?.remove();
  const badge = h("span", { class: `badge ${kind === "alert" ? "alert" : bands.level(risk, threshold)}` });
  const stamp = when ? formatTime(ms(when)) : new Date().toLocaleTimeString([], { hour12: false });
  const item = h("li", { class: when ? "past" : "new", dataset: { kind } }, badge, h("span", { class: "what", text }), h("span", { class: "when", text: stamp }));
  if (when) feed.append(item);
  else feed.prepend(item);
  while (feed.children.length > FEED_LENGTH) feed.lastChild.remove();
}

function alertText(a) {
  return `${a.state === "raised" ? "▲ alert" : "▼ cleared"} ${a.machine_id} ${a.kind}`;
}

function onFleetEvent(state, event, payload) {
  const { fleet, bands } = state;
  if (!fleet) return;
  const m = payload.message;
  if (event === "prediction") {
    if (takePrediction(fleet, bands, m, payload)) scheduleRender(() => renderFleet(state));
    feedItem(bands, "prediction", `${m.machine_id} ${pct(payload.max_risk)} ${payload.top_kind}`, payload.max_risk, null, bands.thresholdFor(m.model_name, m.threshold));
  } else if (event === "alert") {
    const row = fleet.rows.get(m.machine_id);
    if (row) {
      const others = (row.open_alerts ?? []).filter((a) => a.kind !== m.kind);
      row.open_alerts = m.state === "raised" ? [...others, { kind: m.kind, raised_at: m.at, risk: m.risk }] : others;
      fleet.flash.add(m.machine_id);
      scheduleRender(() => renderFleet(state));
    }
    feedItem(bands, "alert", alertText(m), m.risk);
  }
}

// A live prediction becomes its machine's row when it is newer than the row's; whether it did.
function takePrediction(fleet, bands, m, payload) {
  const row = fleet.rows.get(m.machine_id);
  const newer = !row || m.window_end > row.window_end || (m.window_end === row.window_end && m.seq > row.seq);
  if (!newer) return false;
  const threshold = bands.thresholdFor(m.model_name, m.threshold);
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
  return true;
}
