// The flow page: the dataflow from reading to store, stage by stage, with the bottleneck marked; the figures behind
// each stage and what a prediction costs. It draws the API's /flow answer and nothing else, redrawn every few seconds
// while the page is open.

import { formatTime } from "./chart.js";
import { h, table, view } from "./dom.js";

const REFRESH_MS = 5000;

export async function showFlow(shell) {
  const { state, api, stopLive } = shell;
  state.page = "flow";
  stopLive();
  const report = await api("/flow");
  if (state.page !== "flow") return;
  view().replaceChildren(renderFlow(report));
  document.body.dataset.ready = "flow";
  clearTimeout(state.flowTimer);
  state.flowTimer = setTimeout(() => showFlow(shell).catch(shell.showError), REFRESH_MS);
}

export function rate(value) {
  if (value === null || value === undefined) return "–";
  if (value >= 100) return `${Math.round(value).toLocaleString("en")}/s`;
  return `${value.toFixed(value >= 10 ? 1 : 2)}/s`;
}

function num(value, digits = 1) {
  return value === null || value === undefined ? "–" : value.toLocaleString("en", { maximumFractionDigits: digits });
}

// Three significant figures: CPU seconds range from milliseconds (scoring) to hours (retraining).
function sig(value) {
  return value === null || value === undefined ? "–" : Number(value.toPrecision(3)).toLocaleString("en");
}

function age(iso, now) {
  const s = Math.max(0, (now - Date.parse(iso)) / 1000);
  return s < 90 ? `${Math.round(s)} s ago` : `${Math.round(s / 60)} min ago`;
}

const STATE_PILL = { ok: "ok", behind: "failing", idle: "neutral", unknown: "degraded" };

function stageBox(stage) {
  return h(
    "article",
    { class: `flow-stage ${stage.state}${stage.bottleneck ? " bottleneck" : ""}`, dataset: { stage: stage.name, state: stage.state, bottleneck: String(stage.bottleneck) } },
    h("div", { class: "flow-stage-head" }, h("h2", { text: stage.title }), h("span", { class: `pill ${STATE_PILL[stage.state]}`, text: stage.state })),
    stage.bottleneck ? h("div", { class: "flow-mark", text: "bottleneck" }) : null,
    h(
      "dl",
      {},
      h("dt", { text: "in" }),
      h("dd", { class: "num", dataset: { field: "in" }, text: rate(stage.input_per_s) }),
      h("dt", { text: "out" }),
      h("dd", { class: "num", dataset: { field: "out" }, text: rate(stage.output_per_s) }),
      h("dt", { text: "waiting" }),
      h("dd", { class: "num", dataset: { field: "backlog" }, title: stage.backlog_what, text: stage.backlog === null ? "–" : stage.backlog.toLocaleString("en") }),
    ),
    h("p", { class: "flow-reason", text: stage.reason }),
  );
}

function diagram(report) {
  const parts = [];
  report.stages.forEach((stage, i) => {
    if (i) parts.push(h("div", { class: "flow-arrow", "aria-hidden": "true" }, h("span", { text: "→" })));
    parts.push(stageBox(stage));
  });
  return h("section", { class: "flow-diagram", id: "flow-stages", role: "list", "aria-label": "stages from reading to store" }, parts);
}

function panel(title, hint, body) {
  return h("section", { class: "panel" }, h("header", {}, h("h2", { text: title }), hint ? h("span", { class: "hint", text: hint }) : null), body);
}

function empty(text) {
  return h("div", { class: "empty", text });
}

function edgesPanel(report, now) {
  const rows = report.edges.map((e) =>
    h(
      "tr",
      { dataset: { edge: e.edge_id } },
      h("td", { class: "mono", text: e.edge_id }),
      h("td", { class: "num", text: rate(e.flow.readings_per_s) }),
      h("td", { class: "num", text: rate(e.flow.windows_per_s) }),
      h("td", { class: "num", text: rate(e.flow.predictions_per_s) }),
      h("td", { class: "num", text: e.flow.scoring_ms_p50 === null ? "–" : `${num(e.flow.scoring_ms_p50, 2)} / ${num(e.flow.scoring_ms_p95, 2)} ms` }),
      h("td", { class: "num", text: `${Math.round(e.flow.scoring_busy * 100)}%` }),
      h("td", { class: "num", text: `${e.outbox_depth.toLocaleString("en")} (${num(e.outbox_lag_s, 0)} s)` }),
      h("td", { class: "num", text: num(e.flow.cpu_s, 1) }),
      h("td", {}, h("span", { class: `pill ${e.health}`, text: e.health }), " ", h("span", { class: "muted", text: age(e.heartbeat_at, now) })),
    ),
  );
  return panel(
    "Edge agents",
    "from each edge's newest heartbeat",
    rows.length ? table("flow-edges", ["Edge", "Readings", "Windows", "Predictions", "Scoring p50 / p95", "Scorer busy", "Outbox (oldest)", "CPU s", "Heartbeat"], rows) : empty("No edge has sent a heartbeat with flow figures lately."),
  );
}

function topicsPanel(report) {
  const rows = report.topics.map((t) =>
    h(
      "tr",
      { dataset: { topic: t.topic, lag: t.lag } },
      h("td", { class: "mono", text: t.topic }),
      h("td", { class: "num", text: t.lag.toLocaleString("en") }),
      h("td", { class: "num", text: rate(t.produced_per_s) }),
      h("td", { class: "num", text: `${t.committed.toLocaleString("en")} of ${t.end.toLocaleString("en")}` }),
      h("td", { class: "num", text: t.last_produced_at ? formatTime(Date.parse(t.last_produced_at)) : "–" }),
    ),
  );
  return panel("Kafka topics", "lag of the ingest's consumer group", rows.length ? table("flow-topics", ["Topic", "Lag", "Arriving", "Ingested", "Newest record"], rows) : empty("Kafka could not be read."));
}

function pipelinePanel(report) {
  const steps = report.pipeline_steps.map((s) => h("tr", { dataset: { step: s.name } }, h("td", { text: s.name }), h("td", { class: "num", text: s.elements.toLocaleString("en") }), h("td", { class: "num", text: rate(s.per_s) })));
  const st = report.store;
  const rows = Object.entries(st.rows).map(([name, n]) => h("tr", {}, h("td", { class: "mono", text: name }), h("td", { class: "num", text: n.toLocaleString("en") })));
  return h(
    "div",
    { class: "grid flow-two" },
    panel("Pipeline steps", `elements over the last ${report.window_s} s`, table("flow-steps", ["Step", "Elements", "Per second"], steps)),
    panel(
      "Store",
      st.last_run_at ? `last run ${formatTime(Date.parse(st.last_run_at))}` : "no run recorded",
      h(
        "div",
        {},
        h(
          "dl",
          { class: "flow-facts", id: "flow-store" },
          h("dt", { text: "Writes" }),
          h("dd", { class: "num", text: String(st.writes) }),
          h("dt", { text: "Write latency" }),
          h("dd", { class: "num", text: st.write_ms_mean === null ? "–" : `${num(st.write_ms_mean, 0)} ms mean, ${num(st.write_ms_max, 0)} ms max` }),
          h("dt", { text: "Share of run time" }),
          h("dd", { class: "num", text: st.write_share === null ? "–" : `${Math.round(st.write_share * 100)}%` }),
        ),
        table("flow-rows", ["Table", "Rows"], rows),
      ),
    ),
  );
}

function costPanel(report) {
  const rows = report.costs.map((c) =>
    h(
      "tr",
      { dataset: { part: c.part, source: c.energy_source } },
      h("td", { text: c.part }),
      h("td", { class: "num", dataset: { field: "cpu" }, text: c.cpu_s_per_1000 === null ? "–" : `${sig(c.cpu_s_per_1000)} s` }),
      h("td", { class: "num", dataset: { field: "energy" }, text: c.energy_j_per_1000 === null ? "–" : `${sig(c.energy_j_per_1000)} J (${sig(c.energy_j_per_1000 / 3600)} Wh)` }),
      h("td", { class: "num", text: `${sig(c.cpu_s)} CPU-s over ${c.predictions.toLocaleString("en")} ${c.per}` }),
      h("td", { class: "muted", title: c.basis, text: c.energy_source === "rapl" ? "RAPL counters" : "power model" }),
    ),
  );
  return h(
    "section",
    { class: "panel", id: "flow-costs" },
    h("header", {}, h("h2", { text: "Cost per 1,000 predictions" }), h("span", { class: "hint", text: `energy where not measured: ${report.energy_model}` })),
    rows.length ? table("flow-cost-table", ["Part", "CPU", "Energy", "Measured over", "Energy from"], rows) : empty("Nothing measured yet."),
  );
}

// The whole page for one /flow answer.
export function renderFlow(report) {
  const now = Date.parse(report.at);
  const behind = report.bottleneck !== null;
  return h(
    "div",
    { class: "flow-page" },
    h("div", { class: "page-head" }, h("div", {}, h("h1", { text: "Dataflow" }), h("div", { class: "sub", text: `From reading to store; rates over the last ${report.window_s} s, as of ${formatTime(now)}.` }))),
    h("div", { class: `flow-verdict ${behind ? "behind" : "ok"}`, id: "flow-verdict", role: "status", dataset: { bottleneck: report.bottleneck ?? "" }, text: report.verdict }),
    diagram(report),
    report.problems.length ? h("ul", { class: "banner flow-problems" }, report.problems.map((p) => h("li", { text: p }))) : null,
    edgesPanel(report, now),
    h("div", { class: "grid flow-two" }, topicsPanel(report), costPanel(report)),
    pipelinePanel(report),
    h("p", { class: "muted flow-rule", id: "flow-rule" }, h("b", { text: "Bottleneck rule. " }), report.rule),
  );
}
