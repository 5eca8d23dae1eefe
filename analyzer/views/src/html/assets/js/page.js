// ---- page ----
function renderSummary() {
  const runs = data.diff ? data.runs : view().runs.map((i) => data.runs[i]);
  $("summary").textContent = runs.map((r) => (runs.length > 1 ? r.name + ": " : "") + "peak used " + fmtBytes(r.peak_used_bytes) +
    " at " + fmtNs(r.peak_used_ns) + ", peak acquired " + fmtBytes(r.peak_acquired_bytes) + ", " + fmtNs(r.duration_ns)).join("; ");
}

function renderView() {
  state.range = state.range || fullRange();
  renderSummary();
  renderStackBy();
  renderCategories();
  renderPhases();
  renderTimelines();
  renderFlame();
  renderTables();
  if (data.runs.length && data.runs.some((r) => r.t.length)) goToPeak();
}

function init() {
  $("title").textContent = data.title;
  if (data.views.length > 1) {
    const sel = $("rank");
    data.views.forEach((v, i) => sel.append(el("option", { value: String(i) }, v.name)));
    if (data.diff) sel.value = "1";
    state.view = Number(sel.value);
    sel.addEventListener("change", () => { state.view = Number(sel.value); state.selected = null; renderView(); });
    $("rank-label").hidden = false;
  }
  for (const m of ["used", "acquired", "peak", "time"]) {
    const b = el("button", { "data-metric": m }, m);
    b.addEventListener("click", () => { state.metric = m; renderFlame(); });
    $("metrics").append(b);
  }
  let pending = 0;
  $("search").addEventListener("input", (ev) => {
    clearTimeout(pending);
    pending = setTimeout(() => { state.search = ev.target.value; if (mainFlame) mainFlame.draw(); }, 60);
  });
  $("flame-reset").addEventListener("click", () => mainFlame && mainFlame.reset());
  $("go-peak").addEventListener("click", goToPeak);
  $("zoom-reset").addEventListener("click", () => { state.range = fullRange(); drawTimelines(); });
  let resize = 0;
  window.addEventListener("resize", () => {
    clearTimeout(resize);
    resize = setTimeout(() => { drawTimelines(); if (mainFlame) mainFlame.draw(); }, 100);
  });
  if (data.oom) {
    $("oom-text").textContent = data.oom;
    $("oom-section").hidden = false;
  }
  renderView();
  window.poolsight = { data, state, selectInstant, goToPeak, setStackBy, timelines: () => state.timelines,
    charts: () => state.charts };
  window.poolsightReadyMs = performance.now();
  document.body.dataset.ready = "1";
}

init();
