// ---- timeline ----
// Per point, the bytes of each top group then "other" (used minus the top groups), so the
// stack's top is the point's used maximum exactly.
function bandsOf(run, bs) {
  const k = bs.top.length;
  const pos = new Map(bs.top.map((s, i) => [s, i]));
  return run.used.map((used, i) => {
    const b = new Float64Array(k + 1);
    const live = bs.live[i] || [];
    let sum = 0;
    for (let j = 0; j < live.length; j += 2) {
      const at = pos.get(live[j]);
      if (at !== undefined) { b[at] = live[j + 1]; sum += live[j + 1]; }
    }
    b[k] = Math.max(0, used - sum);
    return b;
  });
}

function fullRange() {
  let end = 0;
  for (const r of data.runs) end = Math.max(end, r.duration_ns, (r.t[r.t.length - 1] || 0) + r.bucket_ns);
  return [0, Math.max(end, 1)];
}

function niceStep(span, n) {
  const raw = span / n, p = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const m of [1, 2, 5, 10]) if (m * p >= raw) return m * p;
  return 10 * p;
}

// A tick step for bytes: 1, 2 or 5 times a power of ten of a 1024-step unit.
function byteStep(span, n) {
  let unit = 1;
  while (span / n >= unit * 1024) unit *= 1024;
  return niceStep(span / unit, n) * unit;
}

function Timeline(container, runIdx, overlay) {
  const runs = runIdx.map((i) => data.runs[i]);
  const title = el("div", { class: "run-title" },
    // A diff's runs are named with their side ("base: …", "new: …").
    overlay ? runs.map((r) => r.name).join("   vs   ") : runs[0].name);
  const canvas = el("canvas", { class: "timeline" });
  container.append(title, canvas);
  const sets = runs.map(shownBands);
  const bands = runs.map((r, i) => bandsOf(r, sets[i]));
  const M = { l: 72, r: 12, t: 14, b: 24 };
  let ymax = 1;
  runs.forEach((r) => { ymax = Math.max(ymax, r.peak_used_bytes, r.peak_acquired_bytes); });
  ymax *= 1.08;
  // The drawn stack's tallest point: the report's own check that no peak was lost.
  let drawnPeak = 0;
  bands.forEach((bs) => bs.forEach((b) => { drawnPeak = Math.max(drawnPeak, b.reduce((a, v) => a + v, 0)); }));
  canvas.dataset.peakBytes = String(drawnPeak);
  canvas.dataset.infoPeakBytes = String(runs[0].peak_used_bytes);
  const self = { canvas, runs, runIdx, overlay };
  let W = 0, H = 0;

  const X = (ns) => M.l + (ns - state.range[0]) / (state.range[1] - state.range[0]) * (W - M.l - M.r);
  const NS = (x) => state.range[0] + (x - M.l) / (W - M.l - M.r) * (state.range[1] - state.range[0]);
  const Y = (b) => H - M.b - b / ymax * (H - M.t - M.b);
  const endOf = (r, i) => (i + 1 < r.t.length ? r.t[i + 1] : r.t[i] + r.bucket_ns);
  function pointAt(r, ns) {
    let lo = 0, hi = r.t.length - 1, ans = -1;
    while (lo <= hi) { const m = (lo + hi) >> 1; if (r.t[m] <= ns) { ans = m; lo = m + 1; } else hi = m - 1; }
    return ans;
  }
  self.pointAt = pointAt;

  function draw() {
    const c = freshCanvas(canvas), g = c.g;
    W = c.W; H = c.H;
    // Epochs.
    const r0 = runs[runs.length - 1];
    r0.epochs.forEach(([n, b, e], k) => {
      const x0 = Math.max(M.l, X(b)), x1 = Math.min(W - M.r, X(e));
      if (x1 <= x0) return;
      g.fillStyle = k % 2 ? "#eef3f8" : "#e3ebf3";
      g.fillRect(x0, M.t, x1 - x0, H - M.t - M.b);
      g.fillStyle = "#6b7b8c";
      g.fillText("epoch " + n, x0 + 3, M.t + 10);
    });
    // Axes.
    g.strokeStyle = "#ddd"; g.fillStyle = "#555"; g.lineWidth = 1;
    const ys = byteStep(ymax, 4);
    g.textAlign = "right";
    for (let v = 0; v <= ymax; v += ys) {
      const y = Math.round(Y(v)) + 0.5;
      g.beginPath(); g.moveTo(M.l, y); g.lineTo(W - M.r, y); g.stroke();
      g.fillText(fmtBytes(v), M.l - 4, y + 4);
    }
    g.textAlign = "center";
    const xs = niceStep(state.range[1] - state.range[0], Math.max(2, Math.floor(W / 110)));
    for (let v = Math.ceil(state.range[0] / xs) * xs; v <= state.range[1]; v += xs) {
      g.fillText(fmtNs(v), X(v), H - 6);
    }
    g.save();
    g.beginPath(); g.rect(M.l, 0, W - M.l - M.r, H - M.b); g.clip();
    if (!overlay) {
      const r = runs[0], bs = bands[0], k = sets[0].top.length;
      for (let i = 0; i < r.t.length; i++) {
        const xa = X(r.t[i]), xb = X(endOf(r, i));
        if (xb < M.l || xa > W - M.r) continue;
        const w = Math.max(xb - xa, 0.75);
        let cum = 0;
        for (let j = 0; j <= k; j++) {
          const v = bs[i][j];
          if (v <= 0) continue;
          g.fillStyle = j < k ? bandColor(sets[0], j) : OTHER_COLOR;
          g.fillRect(xa, Y(cum + v), w, Y(cum) - Y(cum + v));
          cum += v;
        }
      }
    }
    runs.forEach((r, ri) => {
      const lines = overlay ? [["used", [], RUN_COLORS[ri]], ["acquired", [4, 3], RUN_COLORS[ri]]]
        : [["acquired", [], "#263238"]];
      for (const [key, dash, color] of lines) {
        g.setLineDash(dash); g.strokeStyle = color; g.lineWidth = 1.5;
        g.beginPath();
        for (let i = 0; i < r.t.length; i++) {
          const y = Y(Math.max(0, r[key][i]));
          if (i === 0) g.moveTo(X(r.t[i]), y); else g.lineTo(X(r.t[i]), y);
          g.lineTo(X(endOf(r, i)), y);
        }
        g.stroke();
      }
      g.setLineDash([]);
      // The peak.
      const px = X(r.peak_used_ns), py = Y(r.peak_used_bytes);
      g.strokeStyle = "#c62828"; g.setLineDash([3, 3]);
      g.beginPath(); g.moveTo(px, M.t); g.lineTo(px, H - M.b); g.stroke(); g.setLineDash([]);
      g.fillStyle = "#c62828";
      g.beginPath(); g.moveTo(px, py - 2); g.lineTo(px - 5, py - 10); g.lineTo(px + 5, py - 10); g.fill();
      g.textAlign = px > W - 160 ? "right" : "left";
      g.fillText("peak " + fmtBytes(r.peak_used_bytes), px + (px > W - 160 ? -7 : 7), Math.max(M.t + 22, py - 4));
    });
    if (state.selected && runIdx.includes(state.selected.run)) {
      const r = data.runs[state.selected.run];
      const sx = X(r.t[state.selected.point]);
      g.strokeStyle = "#1565c0"; g.lineWidth = 2;
      g.beginPath(); g.moveTo(sx, M.t); g.lineTo(sx, H - M.b); g.stroke();
    }
    g.restore();
  }
  self.draw = draw;

  // What is under (x, y): the point and, in the stacked view, the band.
  function hit(x, y) {
    const ns = NS(x);
    const ri = overlay ? runs.length - 1 : 0;
    const r = runs[ri], i = pointAt(r, ns);
    if (i < 0 || ns > endOf(r, i)) return null;
    let band = -1;
    if (!overlay) {
      let cum = 0;
      const b = bands[0][i];
      for (let j = 0; j < b.length; j++) {
        if (b[j] > 0 && y <= Y(cum) && y >= Y(cum + b[j])) { band = j; break; }
        cum += b[j];
      }
    }
    return { run: runIdx[ri], r, i, band };
  }

  function tipText(h) {
    const r = h.r, i = h.i;
    let head = "";
    if (h.band >= 0) {
      const bs = sets[0], k = bs.top.length;
      const bytes = bands[0][i][h.band];
      if (h.band < k) {
        const g = bs.top[h.band], path = groupPath(bs, g);
        head = bs.names[g] + "\n" + fmtBytes(bytes) + " live (" + fmtCount(bytes) + " bytes)\n" +
          (path.length ? bs.by + ": " + path.join(" \u2192 ") + "\n" : "") + "\n";
      } else {
        head = OTHER_LABEL[bs.by] + "\n" + fmtBytes(bytes) + " live\n\n";
      }
    }
    const lines = overlay ? runs.map((q, k) => {
      const j = pointAt(q, r.t[i]);
      return (k ? "new" : "base") + ": used " + fmtBytes(j < 0 ? 0 : q.used[j]) + ", acquired " + fmtBytes(j < 0 ? 0 : q.acquired[j]);
    }).join("\n") : "used " + fmtBytes(r.used[i]) + " (max of the bucket), acquired " + fmtBytes(r.acquired[i]);
    return head + "at " + fmtNs(r.t[i]) + " \u2013 " + fmtNs(endOf(r, i)) + "\n" + lines;
  }

  let drag = null;
  canvas.addEventListener("mousemove", (ev) => {
    const rect = canvas.getBoundingClientRect();
    const x = ev.clientX - rect.left, y = ev.clientY - rect.top;
    if (drag) {
      const dx = x - drag.x;
      if (Math.abs(dx) > 2) drag.moved = true;
      const span = drag.range[1] - drag.range[0];
      const shift = -dx / (W - M.l - M.r) * span;
      const full = fullRange();
      let a = drag.range[0] + shift;
      a = Math.max(full[0], Math.min(a, full[1] - span));
      state.range = [a, a + span];
      drawTimelines();
      return;
    }
    const h = hit(x, y);
    if (h) showTip(ev, tipText(h)); else hideTip();
  });
  canvas.addEventListener("mouseleave", hideTip);
  canvas.addEventListener("mousedown", (ev) => {
    const rect = canvas.getBoundingClientRect();
    drag = { x: ev.clientX - rect.left, range: state.range.slice(), moved: false };
  });
  window.addEventListener("mouseup", (ev) => {
    if (!drag) return;
    const d = drag; drag = null;
    if (d.moved || ev.target !== canvas) return;
    const rect = canvas.getBoundingClientRect();
    const h = hit(ev.clientX - rect.left, ev.clientY - rect.top);
    if (h) selectInstant(h.run, h.i);
  });
  canvas.addEventListener("wheel", (ev) => {
    ev.preventDefault();
    const rect = canvas.getBoundingClientRect();
    const at = NS(ev.clientX - rect.left);
    const f = ev.deltaY > 0 ? 1.25 : 0.8;
    const full = fullRange();
    let a = at - (at - state.range[0]) * f, b = at + (state.range[1] - at) * f;
    const minSpan = Math.max(1, Math.min(...runs.map((r) => r.bucket_ns)) * 4);
    if (b - a < minSpan) return;
    a = Math.max(full[0], a); b = Math.min(full[1], b);
    state.range = [a, b];
    drawTimelines();
  }, { passive: false });

  // For tests and scripts: where point i's band j is drawn, in client coordinates.
  self.bandCenter = (i, j) => {
    const r = runs[0], rect = canvas.getBoundingClientRect();
    const b = bands[0][i];
    let cum = 0;
    for (let q = 0; q < j; q++) cum += b[q];
    const x = (Math.max(X(r.t[i]), M.l) + Math.min(X(endOf(r, i)), W - M.r)) / 2;
    return { x: rect.left + x, y: rect.top + (Y(cum) + Y(cum + b[j])) / 2 };
  };
  self.bands = bands;
  return self;
}

function drawTimelines() {
  state.timelines.forEach((t) => t.draw());
  state.charts.forEach((c) => c.draw());
}

// The stacking control: the ways the view's runs can be stacked, when there is a choice.
function renderStackBy() {
  const box = $("stack-by");
  box.textContent = "";
  const have = data.diff ? [] : STACKINGS.filter((by) => view().runs.some((i) => data.runs[i].bands.some((b) => b.by === by)));
  box.hidden = have.length < 2;
  if (!have.includes(state.stackBy)) state.stackBy = have.includes("category") ? "category" : "stack";
  box.append("Stack by ");
  for (const by of have) {
    const b = el("button", { "data-by": by }, by);
    b.classList.toggle("active", by === state.stackBy);
    b.addEventListener("click", () => setStackBy(by));
    box.append(b);
  }
}

function setStackBy(by) {
  state.stackBy = by;
  renderStackBy();
  renderTimelines();
  if (state.selected) selectInstant(state.selected.run, state.selected.point);
}

function renderTimelines() {
  const box = $("timelines");
  box.textContent = "";
  state.timelines = [];
  if (data.diff) {
    state.timelines.push(Timeline(box, [0, 1], true));
  } else {
    for (const i of view().runs) state.timelines.push(Timeline(box, [i], false));
  }
  renderLegend();
  drawTimelines();
}

function renderLegend() {
  const lg = $("legend");
  lg.textContent = "";
  const item = (color, text, dashed) => {
    const s = el("span");
    const sw = el("span", { class: "swatch" });
    sw.style.background = color;
    if (dashed) { sw.style.background = "none"; sw.style.borderTop = "2px dashed " + color; sw.style.height = "0"; }
    s.append(sw, document.createTextNode(text));
    lg.append(s);
  };
  if (data.diff) {
    item(RUN_COLORS[0], "base used"); item(RUN_COLORS[0], "base acquired", true);
    item(RUN_COLORS[1], "new used"); item(RUN_COLORS[1], "new acquired", true);
    return;
  }
  const bs = shownBands(data.runs[view().runs[0]]);
  lg.dataset.by = bs.by;
  bs.top.forEach((g, j) => item(bandColor(bs, j), bs.names[g]));
  if (bs.names.length > bs.top.length || bs.other.some((b) => b > 0)) item(OTHER_COLOR, OTHER_LABEL[bs.by]);
  item("#263238", "acquired (held from the device)");
}
