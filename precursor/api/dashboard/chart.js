// Time-series charts in plain SVG: lines with optional min/max bands, threshold lines, markers and shaded spans.
// No library: the dashboard must work with every asset served by the Precursor process itself.

import { HOUR } from "./format.js";

const SVG = "http://www.w3.org/2000/svg";

function el(name, attrs = {}, parent = null) {
  const node = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  if (parent) parent.appendChild(node);
  return node;
}

// Colours for series that carry no colour of their own meaning (model versions, sensors), in the order they are given.
export const PALETTE = ["#13294b", "#e4572e", "#2f9e66", "#3b7dd8", "#d79b00", "#8e44ad", "#16a085", "#c0392b"];

const DAY = 24 * HOUR;
const STEPS = [5 * 60e3, 15 * 60e3, 30 * 60e3, HOUR, 2 * HOUR, 3 * HOUR, 6 * HOUR, 12 * HOUR, DAY, 2 * DAY, 3 * DAY, 4 * DAY, 7 * DAY, 14 * DAY, 30 * DAY];
const MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];

function pad(n) { return String(n).padStart(2, "0"); }

export function formatTime(ms, withDate = true) {
  const d = new Date(ms);
  const time = `${pad(d.getUTCHours())}:${pad(d.getUTCMinutes())}`;
  return withDate ? `${MONTHS[d.getUTCMonth()]} ${d.getUTCDate()} ${time}` : time;
}

function timeTicks(lo, hi, maxTicks) {
  const span = Math.max(hi - lo, 1);
  const step = STEPS.find((s) => span / s <= maxTicks) ?? STEPS[STEPS.length - 1];
  const first = Math.ceil(lo / step) * step;
  const ticks = [];
  for (let t = first; t <= hi; t += step) ticks.push(t);
  return { ticks, step };
}

function tickLabel(t, step) {
  const d = new Date(t);
  if (step >= DAY) return `${MONTHS[d.getUTCMonth()]} ${d.getUTCDate()}`;
  if (d.getUTCHours() === 0 && d.getUTCMinutes() === 0) return `${MONTHS[d.getUTCMonth()]} ${d.getUTCDate()}`;
  return formatTime(t, false);
}

function niceTicks(lo, hi, count) {
  const span = hi - lo || 1;
  const raw = span / count;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => span / s <= count) ?? mag * 10;
  const ticks = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) ticks.push(Number(v.toFixed(10)));
  return ticks;
}

/**
 * Draw (or redraw) a chart into `container`.
 * spec: { height, xMin, xMax, yMin, yMax, yFormat, series: [{label, color, points: [{t, v, lo?, hi?}], width?}],
 *         thresholds: [{v, color, label}], spans: [{from, to, color, label}], markers: [{t, color, label, shape}] }
 * Times are epoch milliseconds.
 */
export function drawChart(container, spec) {
  container.classList.add("chart");
  container.replaceChildren();
  const width = Math.max(container.clientWidth || 600, 240);
  const height = spec.height ?? 240;
  const m = { top: 14, right: 14, bottom: 26, left: 44 };
  const w = width - m.left - m.right;
  const h = height - m.top - m.bottom;
  const all = spec.series.flatMap((s) => s.points);
  const times = all.map((p) => p.t).concat((spec.markers ?? []).map((k) => k.t));
  let xMin = spec.xMin ?? Math.min(...times);
  let xMax = spec.xMax ?? Math.max(...times);
  if (!Number.isFinite(xMin) || !Number.isFinite(xMax)) { xMin = Date.now() - DAY; xMax = Date.now(); }
  if (xMax <= xMin) { xMin -= HOUR; xMax += HOUR; }
  let yMin = spec.yMin;
  let yMax = spec.yMax;
  if (yMin === undefined || yMax === undefined) {
    const values = all.flatMap((p) => [p.v, p.lo, p.hi]).filter((v) => v !== null && v !== undefined && Number.isFinite(v));
    const lo = values.length ? Math.min(...values) : 0;
    const hi = values.length ? Math.max(...values) : 1;
    const padY = (hi - lo) * 0.08 || Math.abs(hi) * 0.1 || 1;
    yMin = yMin ?? lo - padY;
    yMax = yMax ?? hi + padY;
  }
  const x = (t) => m.left + ((t - xMin) / (xMax - xMin)) * w;
  const y = (v) => m.top + (1 - (v - yMin) / (yMax - yMin)) * h;
  const svg = el("svg", { viewBox: `0 0 ${width} ${height}`, height, role: "img", "aria-label": spec.label ?? "chart" }, container);

  const axis = el("g", { class: "axis" }, svg);
  for (const v of niceTicks(yMin, yMax, Math.max(3, Math.round(h / 45)))) {
    el("line", { class: "grid-line", x1: m.left, x2: m.left + w, y1: y(v), y2: y(v) }, axis);
    const label = el("text", { x: m.left - 8, y: y(v) + 4, "text-anchor": "end" }, axis);
    label.textContent = spec.yFormat ? spec.yFormat(v) : String(v);
  }
  const { ticks, step } = timeTicks(xMin, xMax, Math.max(3, Math.floor(w / 90)));
  for (const t of ticks) {
    el("line", { class: "axis-line", x1: x(t), x2: x(t), y1: m.top + h, y2: m.top + h + 4 }, axis);
    const label = el("text", { x: x(t), y: m.top + h + 17, "text-anchor": "middle" }, axis);
    label.textContent = tickLabel(t, step);
  }
  el("line", { class: "axis-line", x1: m.left, x2: m.left + w, y1: m.top + h, y2: m.top + h }, axis);

  const clipId = `clip-${Math.random().toString(36).slice(2)}`;
  const clip = el("clipPath", { id: clipId }, el("defs", {}, svg));
  el("rect", { x: m.left, y: m.top - 2, width: w, height: h + 4 }, clip);
  const plot = el("g", { "clip-path": `url(#${clipId})` }, svg);

  for (const span of spec.spans ?? []) {
    const x0 = x(span.from);
    const x1 = x(span.to);
    el("rect", { x: Math.min(x0, x1), y: m.top, width: Math.max(Math.abs(x1 - x0), 1.5), height: h, fill: span.color, "data-kind": "span" }, plot);
    if (span.label && Math.abs(x1 - x0) > 36) {
      const text = el("text", { x: (x0 + x1) / 2, y: m.top + 12, "text-anchor": "middle", "font-size": 10.5, fill: span.textColor ?? "#8a2a10", "font-weight": 600 }, plot);
      text.textContent = span.label;
    }
  }
  for (const th of spec.thresholds ?? []) {
    el("line", { x1: m.left, x2: m.left + w, y1: y(th.v), y2: y(th.v), stroke: th.color, "stroke-width": 1.2, "stroke-dasharray": "5 4" }, plot);
    if (th.label) {
      const text = el("text", { x: m.left + w - 4, y: y(th.v) - 4, "text-anchor": "end", "font-size": 10.5, fill: th.color, "font-weight": 600 }, plot);
      text.textContent = th.label;
    }
  }
  for (const s of spec.series) {
    const banded = s.points.filter((p) => p.lo !== null && p.lo !== undefined && p.hi !== null && p.hi !== undefined);
    if (banded.length > 1) {
      const top = banded.map((p) => `${x(p.t).toFixed(1)},${y(p.hi).toFixed(1)}`);
      const bottom = banded.slice().reverse().map((p) => `${x(p.t).toFixed(1)},${y(p.lo).toFixed(1)}`);
      el("polygon", { points: top.concat(bottom).join(" "), fill: s.color, opacity: 0.13 }, plot);
    }
    const pts = s.points.filter((p) => p.v !== null && p.v !== undefined && Number.isFinite(p.v));
    if (pts.length === 1) {
      el("circle", { cx: x(pts[0].t), cy: y(pts[0].v), r: 3, fill: s.color }, plot);
    } else if (pts.length > 1) {
      const d = pts.map((p, i) => `${i ? "L" : "M"}${x(p.t).toFixed(1)},${y(p.v).toFixed(1)}`).join("");
      if (s.fill) {
        el("path", { d: `${d}L${x(pts[pts.length - 1].t).toFixed(1)},${y(yMin)}L${x(pts[0].t).toFixed(1)},${y(yMin)}Z`, fill: s.fill, opacity: 0.5 }, plot);
      }
      el("path", { d, fill: "none", stroke: s.color, "stroke-width": s.width ?? 1.8, "stroke-linejoin": "round", "stroke-linecap": "round", "data-series": s.label ?? "" }, plot);
    }
  }
  for (const mk of spec.markers ?? []) {
    const mx = x(mk.t);
    if (mk.shape === "line") {
      el("line", { x1: mx, x2: mx, y1: m.top, y2: m.top + h, stroke: mk.color, "stroke-width": mk.width ?? 2, "data-marker": mk.kind ?? "" }, plot);
      if (mk.label) {
        const text = el("text", { x: mx + 3, y: m.top + h - 5, "font-size": 10.5, fill: mk.color, "font-weight": 700 }, plot);
        text.textContent = mk.label;
      }
    } else if (mk.shape === "tick") {
      el("line", { x1: mx, x2: mx, y1: m.top + h - 9, y2: m.top + h, stroke: mk.color, "stroke-width": 2, "data-marker": mk.kind ?? "" }, plot);
    } else {
      const my = mk.v !== undefined ? y(mk.v) : m.top + 6;
      el("path", { d: `M${mx},${my - 6}L${mx + 5.5},${my + 4}L${mx - 5.5},${my + 4}Z`, fill: mk.color, stroke: "#fff", "stroke-width": 1, "data-marker": mk.kind ?? "" }, plot);
    }
  }

  // Hover: a crosshair and the nearest value of each series.
  const cross = el("line", { class: "crosshair", y1: m.top, y2: m.top + h, x1: 0, x2: 0, visibility: "hidden" }, svg);
  const overlay = el("rect", { x: m.left, y: m.top, width: w, height: h, fill: "transparent" }, svg);
  const tooltip = document.getElementById("tooltip");
  overlay.addEventListener("mousemove", (event) => {
    const box = svg.getBoundingClientRect();
    const px = ((event.clientX - box.left) / box.width) * width;
    const t = xMin + ((px - m.left) / w) * (xMax - xMin);
    cross.setAttribute("x1", px);
    cross.setAttribute("x2", px);
    cross.setAttribute("visibility", "visible");
    const lines = [`<b>${formatTime(t)}</b>`];
    for (const s of spec.series) {
      let best = null;
      for (const p of s.points) if (best === null || Math.abs(p.t - t) < Math.abs(best.t - t)) best = p;
      if (best && best.v !== null && best.v !== undefined) lines.push(`${s.label ?? ""}: ${spec.yFormat ? spec.yFormat(best.v) : best.v.toFixed(2)}`);
    }
    for (const mk of spec.markers ?? []) if (mk.label && Math.abs(x(mk.t) - px) < 6) lines.push(mk.title ?? mk.label);
    if (tooltip) {
      tooltip.innerHTML = lines.map(escapeHtml).join("<br>").replaceAll("&lt;b&gt;", "<b>").replaceAll("&lt;/b&gt;", "</b>");
      tooltip.hidden = false;
      tooltip.style.left = `${event.clientX + 14}px`;
      tooltip.style.top = `${event.clientY + 12}px`;
    }
  });
  overlay.addEventListener("mouseleave", () => {
    cross.setAttribute("visibility", "hidden");
    if (tooltip) tooltip.hidden = true;
  });
  return { x, y, xMin, xMax };
}

export function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}
