// The data, the page's state, formatting, colors and the tooltip, which every part uses.
const data = JSON.parse(document.getElementById("poolsight-data").textContent);
const $ = (id) => document.getElementById(id);
const frames = data.frames;
const BAND_COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
  "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#8cd17d"];
const OTHER_COLOR = "#c7c7c7";
// PyTorch's memory categories keep their color in every view.
const CATEGORY_COLORS = { parameter: "#4e79a7", buffer: "#9c755f", input: "#76b7b2",
  activation: "#f28e2b", temporary: "#edc948", gradient: "#e15759", optimizer_state: "#59a14f",
  "(unlabelled)": "#bab0ac", "before recording": "#d3d3d3" };
// What the timeline can be stacked by, in the order the control offers them.
const STACKINGS = ["category", "phase", "module", "stack"];
const OTHER_LABEL = { stack: "other stacks", category: "other categories", module: "other modules",
  phase: "other stacks (not kept: phase unknown)" };
// Phases that keep their color in every view.
const PHASE_COLORS = { forward: "#4e79a7", backward: "#e15759", "optimizer step": "#59a14f",
  "(no phase)": "#bab0ac" };
// Tables the category section shows instead of the tables section (the phase section shows
// "phases-table").
const CATEGORY_TABLES = ["categories-table", "modules-table"];
const RUN_COLORS = ["#1f77b4", "#d62728"];
const ROW = 18;

const state = {
  view: 0,
  metric: data.diff ? "used" : "peak",
  search: "",
  flameZoom: null,
  range: null, // [ns0, ns1] shared by every timeline: one axis
  selected: null, // {run, point}
  timelines: [],
  charts: [],
  // How the timeline is stacked: a category when the trace has them, else by stack.
  stackBy: data.runs.some((r) => r.bands.some((b) => b.by === "category")) ? "category" : "stack",
};

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  if (attrs) for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  return e;
}

// Sizes as the seed tables print them: 1024 steps, `%3.2f` and the unit.
function fmtBytes(b) {
  const units = ["B", "KB", "MB", "GB", "TB", "PB", "EB"];
  let v = Math.abs(b), u = 0;
  while (v >= 1024 && u < units.length - 1) { v /= 1024; u++; }
  return (b < 0 ? "-" : "") + fixed2(v) + units[u];
}
// `%.2f` as Python and the CLI print it: a tie goes to the even digit (12.125 reads 12.12,
// where toFixed says 12.13). A size over a power of 1024 times 100 is exact, ties included.
function fixed2(v) {
  const x = v * 100, n = Math.floor(x), d = x - n;
  return ((d > 0.5 || (d === 0.5 && n % 2 === 1) ? n + 1 : n) / 100).toFixed(2);
}
function fmtNs(ns) {
  const a = Math.abs(ns);
  if (a >= 1e9) return (ns / 1e9).toFixed(3) + " s";
  if (a >= 1e6) return (ns / 1e6).toFixed(2) + " ms";
  if (a >= 1e3) return (ns / 1e3).toFixed(2) + " us";
  return Math.round(ns) + " ns";
}
function fmtCount(n) { return String(n).replace(/\B(?=(\d{3})+(?!\d))/g, ","); }
function fmtMetric(metric, v) { return metric === "time" ? fmtNs(v) : fmtBytes(v); }

// A canvas sized to its box at the screen's pixel ratio, cleared: its 2D context, width and height
// in CSS pixels.
function freshCanvas(canvas) {
  const dpr = window.devicePixelRatio || 1;
  const W = canvas.clientWidth, H = canvas.clientHeight;
  canvas.width = Math.round(W * dpr); canvas.height = Math.round(H * dpr);
  const g = canvas.getContext("2d");
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, W, H);
  g.font = "11px system-ui, sans-serif";
  return { g, W, H };
}

function view() { return data.views[state.view]; }
// A run's bands split one way ("stack", "category", "phase", "module"); by stack when it has
// no other.
function bandsBy(run, by) { return run.bands.find((b) => b.by === by) || run.bands[0]; }
function shownBands(run) { return bandsBy(run, state.stackBy); }
function groupPath(bs, g) { return bs.paths[g].map((f) => frames[f]); }
// The color of a band: its position among the run's own bands; a category's own color.
function bandColor(bs, j) {
  const name = bs.names[bs.top[j]];
  if (bs.by === "category" && CATEGORY_COLORS[name]) return CATEGORY_COLORS[name];
  if (bs.by === "phase" && PHASE_COLORS[name]) return PHASE_COLORS[name];
  return BAND_COLORS[j % BAND_COLORS.length];
}
function categoryColor(run, name) {
  const bs = bandsBy(run, "category");
  const j = bs.by === "category" ? bs.top.findIndex((g) => bs.names[g] === name) : -1;
  return j >= 0 ? bandColor(bs, j) : CATEGORY_COLORS[name] || OTHER_COLOR;
}

// ---- tooltip ----
const tooltip = $("tooltip");
function showTip(ev, text) {
  tooltip.textContent = text;
  tooltip.hidden = false;
  const x = Math.min(ev.clientX + 14, window.innerWidth - tooltip.offsetWidth - 8);
  const y = Math.min(ev.clientY + 14, window.innerHeight - tooltip.offsetHeight - 8);
  tooltip.style.left = Math.max(0, x) + "px";
  tooltip.style.top = Math.max(0, y) + "px";
}
function hideTip() { tooltip.hidden = true; }
