// Building the page: one element builder for HTML and one for SVG, the table every page lays its rows in, the element
// every page draws into, and at most one redraw per animation frame however many live events arrive.

const SVG_NS = "http://www.w3.org/2000/svg";

// An HTML element. attrs: "class", "text" (its text), "dataset", "on<event>" (a listener), any other attribute;
// null, undefined and false leave an attribute or a child out, so optional parts can be written inline.
export function h(tag, attrs = {}, ...children) {
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

// An SVG element: every attribute set as given; falsy children are left out.
export function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  for (const child of children.flat()) if (child) node.appendChild(child);
  return node;
}

// A compact table in its scrolling wrapper: a heading per column and the given rows (tr elements).
export function table(id, headings, rows) {
  return h(
    "div",
    { class: "table-wrap" },
    h("table", { id, class: "compact" }, h("thead", {}, h("tr", {}, headings.map((x) => h("th", { text: x })))), h("tbody", {}, rows)),
  );
}

// The element each page replaces with its content.
export function view() {
  return document.getElementById("view");
}

// A burst of live events costs one redraw: the first schedules `render` for the next frame, the rest find it queued.
let renderQueued = false;
export function scheduleRender(render) {
  if (renderQueued) return;
  renderQueued = true;
  requestAnimationFrame(() => {
    renderQueued = false;
    render();
  });
}
