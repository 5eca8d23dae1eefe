// ---- memory by category ----
// The categories table's figures (the replay's, as `poolsight categories` prints them): the
// bytes of each category at the peak as one bar, each category over time, and the tables.
function renderCategories() {
  const section = $("categories-section");
  const v = view();
  const table = data.diff ? null : v.tables.find((t) => t.id === "categories-table");
  state.charts = [];
  section.hidden = !table;
  if (!table) return;
  const runs = v.runs.map((i) => data.runs[i]);
  const peak = runs.reduce((a, r) => (r.peak_used_bytes > a.peak_used_bytes ? r : a), runs[0]);
  const total = table.rows.reduce((a, c) => a + c.at_peak_bytes, 0);
  const bar = $("category-peak"), key = $("category-key");
  bar.textContent = ""; key.textContent = "";
  for (const c of table.rows) {
    const color = categoryColor(peak, c.category);
    const share = c.at_peak_bytes / Math.max(1, total) * 100;
    const text = c.category + " " + fmtBytes(c.at_peak_bytes) + " (" + share.toFixed(1) + "%)";
    const part = el("span", { "data-category": c.category, "data-bytes": String(c.at_peak_bytes) });
    part.style.width = share + "%";
    part.style.background = color;
    part.addEventListener("mousemove", (ev) => showTip(ev, text + " of the " + fmtBytes(total) + " live at the peak"));
    part.addEventListener("mouseleave", hideTip);
    bar.append(part);
    const item = el("span", { "data-category": c.category });
    const sw = el("span", { class: "swatch" });
    sw.style.background = color;
    item.append(sw, document.createTextNode(text));
    key.append(item);
  }
  bar.dataset.totalBytes = String(total);
  const charts = $("category-charts");
  charts.textContent = "";
  for (const r of runs) {
    if (bandsBy(r, "category").by !== "category") continue;
    state.charts.push(CategoryChart(charts, r, runs.length > 1));
  }
  const holder = $("category-tables");
  holder.textContent = "";
  for (const id of CATEGORY_TABLES) {
    const t = v.tables.find((x) => x.id === id);
    if (t) renderTable(holder, t);
  }
}

// Each category's live bytes over time, one line each, on the timeline's axis.
function CategoryChart(container, run, titled) {
  if (titled) container.append(el("div", { class: "run-title" }, run.name));
  const canvas = el("canvas", { class: "timeline category-chart" });
  container.append(canvas);
  const bs = bandsBy(run, "category");
  const series = bs.names.map(() => new Float64Array(run.t.length));
  bs.live.forEach((flat, i) => {
    for (let j = 0; j < flat.length; j += 2) series[flat[j]][i] = flat[j + 1];
  });
  let ymax = 1;
  for (const s of series) for (const v of s) ymax = Math.max(ymax, v);
  ymax *= 1.08;
  const M = { l: 72, r: 12, t: 10, b: 24 };
  let W = 0, H = 0;
  const X = (ns) => M.l + (ns - state.range[0]) / (state.range[1] - state.range[0]) * (W - M.l - M.r);
  const NS = (x) => state.range[0] + (x - M.l) / (W - M.l - M.r) * (state.range[1] - state.range[0]);
  const Y = (b) => H - M.b - b / ymax * (H - M.t - M.b);
  const endOf = (i) => (i + 1 < run.t.length ? run.t[i + 1] : run.t[i] + run.bucket_ns);
  function draw() {
    const c = freshCanvas(canvas), g = c.g;
    W = c.W; H = c.H;
    g.strokeStyle = "#ddd"; g.fillStyle = "#555"; g.lineWidth = 1;
    g.textAlign = "right";
    const ys = byteStep(ymax, 3);
    for (let v = 0; v <= ymax; v += ys) {
      const y = Math.round(Y(v)) + 0.5;
      g.beginPath(); g.moveTo(M.l, y); g.lineTo(W - M.r, y); g.stroke();
      g.fillText(fmtBytes(v), M.l - 4, y + 4);
    }
    g.textAlign = "center";
    const xs = niceStep(state.range[1] - state.range[0], Math.max(2, Math.floor(W / 110)));
    for (let v = Math.ceil(state.range[0] / xs) * xs; v <= state.range[1]; v += xs) g.fillText(fmtNs(v), X(v), H - 6);
    g.save();
    g.beginPath(); g.rect(M.l, 0, W - M.l - M.r, H - M.b); g.clip();
    g.lineWidth = 1.5;
    series.forEach((s, c) => {
      g.strokeStyle = categoryColor(run, bs.names[c]);
      g.beginPath();
      for (let i = 0; i < run.t.length; i++) {
        const y = Y(s[i]);
        if (i === 0) g.moveTo(X(run.t[i]), y); else g.lineTo(X(run.t[i]), y);
        g.lineTo(X(endOf(i)), y);
      }
      g.stroke();
    });
    g.restore();
  }
  canvas.addEventListener("mousemove", (ev) => {
    const rect = canvas.getBoundingClientRect();
    const ns = NS(ev.clientX - rect.left);
    let lo = 0, hi = run.t.length - 1, i = -1;
    while (lo <= hi) { const m = (lo + hi) >> 1; if (run.t[m] <= ns) { i = m; lo = m + 1; } else hi = m - 1; }
    if (i < 0 || ns > endOf(i)) { hideTip(); return; }
    const lines = series.map((s, c) => [bs.names[c], s[i]]).sort((a, b) => b[1] - a[1])
      .map(([n, v]) => n + " " + fmtBytes(v));
    showTip(ev, "at " + fmtNs(run.t[i]) + " \u2013 " + fmtNs(endOf(i)) + " (used " + fmtBytes(run.used[i]) + ")\n" + lines.join("\n"));
  });
  canvas.addEventListener("mouseleave", hideTip);
  return { draw, canvas, run, series, names: bs.names };
}
