// poolsight's HTML report: draws everything from the JSON island #poolsight-data.
// Strings from the trace only ever enter the document as text (textContent, canvas fillText),
// never as markup.
"use strict";
(function () {
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
  const STACKINGS = ["category", "module", "stack"];
  const OTHER_LABEL = { stack: "other stacks", category: "other categories", module: "other modules" };
  // Tables the category section shows instead of the tables section.
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

  function view() { return data.views[state.view]; }
  // A run's bands split one way ("stack", "category", "module"); by stack when it has no other.
  function bandsBy(run, by) { return run.bands.find((b) => b.by === by) || run.bands[0]; }
  function shownBands(run) { return bandsBy(run, state.stackBy); }
  function groupPath(bs, g) { return bs.paths[g].map((f) => frames[f]); }
  // The color of a band: its position among the run's own bands; a category's own color.
  function bandColor(bs, j) {
    const name = bs.names[bs.top[j]];
    if (bs.by === "category" && CATEGORY_COLORS[name]) return CATEGORY_COLORS[name];
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
      overlay ? runs.map((r, i) => (i ? "new: " : "base: ") + r.name).join("   vs   ") : runs[0].name);
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
      const dpr = window.devicePixelRatio || 1;
      W = canvas.clientWidth; H = canvas.clientHeight;
      canvas.width = Math.round(W * dpr); canvas.height = Math.round(H * dpr);
      const g = canvas.getContext("2d");
      g.setTransform(dpr, 0, 0, dpr, 0, 0);
      g.clearRect(0, 0, W, H);
      g.font = "11px system-ui, sans-serif";
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

  // ---- flamegraphs ----
  function hashHue(name) {
    let h = 0;
    for (let i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) | 0;
    return Math.abs(h);
  }
  function memColor(name) { const h = hashHue(name); return "hsl(" + (100 + h % 60) + ",55%," + (62 + h % 17) + "%)"; }
  function hotColor(name) { const h = hashHue(name); return "hsl(" + (h % 50) + ",85%," + (60 + h % 15) + "%)"; }

  // A tree {name, value, self, children} from parallel arrays (parents first).
  function buildTree(parent, frameIdx, selfOf) {
    const n = parent.length;
    const nodes = new Array(n);
    for (let i = 0; i < n; i++) {
      nodes[i] = { name: i === 0 ? "all" : frames[frameIdx[i]], self: selfOf(i), value: 0, children: [], i };
    }
    for (let i = n - 1; i >= 0; i--) {
      nodes[i].value += nodes[i].self;
      if (i > 0) nodes[parent[i]].value += nodes[i].value;
    }
    for (let i = 1; i < n; i++) if (nodes[i].value > 0) nodes[parent[i]].children.push(nodes[i]);
    return nodes[0];
  }

  // Draws an icicle (root on top) into `box`; click zooms into a frame, the root resets.
  function Flame(box, root, opts) {
    const self = { root, zoom: null };
    function path(node, target, acc) {
      if (node === target) { acc.push(node); return true; }
      for (const c of node.children) if (path(c, target, acc)) { acc.unshift(node); return true; }
      return false;
    }
    function draw() {
      box.textContent = "";
      if (root.value <= 0) {
        box.append(el("div", { class: "empty" }, opts.empty || "Nothing to show."));
        box.style.height = "auto";
        return;
      }
      const W = box.clientWidth || 800;
      const z = self.zoom || root;
      const chain = [];
      path(root, z, chain);
      let re = null;
      if (opts.search && state.search) { try { re = new RegExp(state.search, "i"); } catch (e) { re = null; } }
      let maxDepth = 0, matched = 0, count = 0;
      const frag = document.createDocumentFragment();
      const put = (node, x, w, depth, matchedAbove) => {
        if (w < 0.5 || count > 4000) return;
        count++;
        maxDepth = Math.max(maxDepth, depth);
        const d = el("div", { class: "frame" }, node.name);
        d.style.left = x + "px"; d.style.width = w + "px"; d.style.top = depth * ROW + "px";
        d.style.background = opts.color(node);
        d.dataset.name = node.name;
        d.dataset.value = String(node.value);
        const isMatch = re && node !== root && re.test(node.name);
        if (isMatch) { d.classList.add("match"); if (!matchedAbove) matched += node.value; }
        d.addEventListener("mousemove", (ev) => showTip(ev, opts.tip(node)));
        d.addEventListener("mouseleave", hideTip);
        d.addEventListener("click", () => { self.zoom = node === root ? null : node; draw(); });
        frag.append(d);
        let cx = x;
        for (const c of node.children) {
          const cw = w * c.value / node.value;
          put(c, cx, cw, depth + 1, matchedAbove || isMatch);
          cx += cw;
        }
      };
      // The zoomed frame's ancestors span the width, dimmed; the frame fills it.
      chain.forEach((node, depth) => {
        if (node === z) { put(node, 0, W, depth, false); return; }
        const d = el("div", { class: "frame dim" }, node.name);
        d.style.left = "0px"; d.style.width = W + "px"; d.style.top = depth * ROW + "px";
        d.style.background = opts.color(node);
        d.dataset.name = node.name;
        d.dataset.value = String(node.value);
        d.addEventListener("click", () => { self.zoom = node === root ? null : node; draw(); });
        frag.append(d);
      });
      box.append(frag);
      box.style.height = (maxDepth + 1) * ROW + 4 + "px";
      if (opts.onSearch) opts.onSearch(re ? matched : null, z.value);
    }
    self.draw = draw;
    self.reset = () => { self.zoom = null; draw(); };
    return self;
  }

  let mainFlame = null;
  function renderFlame() {
    const m = state.metric;
    let root, color, tip;
    if (data.diff) {
      const d = data.diff;
      const base = buildTree(d.parent, d.frame, (i) => d.base[m][i]);
      const news = buildTree(d.parent, d.frame, (i) => d.new[m][i]);
      const baseOf = new Map();
      (function walk(n) { baseOf.set(n.i, n.value); n.children.forEach(walk); })(base);
      root = news;
      color = (n) => {
        const b = baseOf.get(n.i) || 0, delta = n.value - b;
        if (delta === 0) return "#e0e0e0";
        const rel = Math.min(1, Math.abs(delta) / Math.max(n.value, b, 1));
        const light = 92 - 42 * rel;
        return delta > 0 ? "hsl(0,80%," + light + "%)" : "hsl(215,80%," + light + "%)";
      };
      tip = (n) => {
        const b = baseOf.get(n.i) || 0;
        return n.name + "\nbase " + fmtMetric(m, b) + "\nnew  " + fmtMetric(m, n.value) + "\nchange " +
          (n.value >= b ? "+" : "-") + fmtMetric(m, Math.abs(n.value - b)) + (b ? " (" + ((n.value - b) / b * 100).toFixed(1) + "%)" : "");
      };
      $("flame-title").textContent = "Differential flamegraph (" + m + "): widths are the new run's, red grew, blue shrank";
    } else {
      const t = view().tree;
      root = buildTree(t.parent, t.frame, (i) => t[m][i]);
      color = (n) => (m === "time" ? hotColor(n.name) : memColor(n.name));
      tip = (n) => n.name + "\n" + fmtMetric(m, n.value) + (m === "time" ? "" : " (" + fmtCount(n.value) + " bytes)") +
        ", " + (n.value / Math.max(1, root.value) * 100).toFixed(2) + "% of all";
      // A trace observed outside any pool (poolsight.torch.track()) has no pool to speak of.
      const what = (data.observed
        ? { used: "bytes allocated", acquired: "bytes allocated (no pool: as used)",
          peak: "bytes live at the peak", time: "self time of scopes" }
        : { used: "bytes taken from the pool", acquired: "bytes the pool took from the device",
          peak: "bytes live at the pool's peak", time: "self time of scopes" })[m];
      $("flame-title").textContent = "Flamegraph: " + what;
    }
    mainFlame = Flame($("flame"), root, {
      color, tip, search: true, empty: "Nothing of this metric in the trace.",
      onSearch: (matched, total) => {
        $("search-result").textContent = matched === null ? "" :
          "matched " + fmtMetric(m, matched) + " (" + (matched / Math.max(1, total) * 100).toFixed(1) + "%)";
      },
    });
    mainFlame.draw();
    for (const b of $("metrics").querySelectorAll("button")) b.classList.toggle("active", b.dataset.metric === m);
  }

  // ---- live at an instant ----
  function selectInstant(runIndex, point) {
    state.selected = { run: runIndex, point };
    drawTimelines();
    const r = data.runs[runIndex];
    const stacks = bandsBy(r, "stack");
    const live = stacks.live[point] || [];
    const root = { name: "all", value: 0, self: 0, children: [] };
    for (let j = 0; j < live.length; j += 2) {
      const s = live[j], bytes = live[j + 1];
      let node = root;
      root.value += bytes;
      for (const f of stacks.paths[s]) {
        const name = frames[f];
        let c = node.children.find((x) => x.name === name);
        if (!c) { c = { name, value: 0, self: 0, children: [] }; node.children.push(c); }
        c.value += bytes;
        node = c;
      }
      node.self += bytes;
    }
    const other = stacks.other[point] || 0;
    if (other > 0) {
      root.value += other;
      root.children.push({ name: "(smaller stacks)", value: other, self: other, children: [] });
    }
    // The table lists the instant's bytes the way the timeline is stacked.
    const bs = shownBands(r), rows = [];
    const groups = bs.live[point] || [];
    for (let j = 0; j < groups.length; j += 2) {
      const g = groups[j];
      rows.push({ name: bs.names[g], path: groupPath(bs, g).join(" \u2192 "), bytes: groups[j + 1] });
    }
    const smaller = bs.other[point] || 0;
    if (smaller > 0) rows.push({ name: "(smaller " + OTHER_LABEL[bs.by].slice(6) + ")", path: "", bytes: smaller });
    const isPeak = r.used[point] === r.peak_used_bytes;
    $("live-title").textContent = "Live at " + fmtNs(r.t[point]) + " \u2013 " + fmtNs(r.t[point] + r.bucket_ns) +
      (isPeak ? " (the peak)" : "") + ": " + fmtBytes(root.value) + (data.runs.length > 1 ? " in " + r.name : "") +
      ", by " + bs.by;
    $("live-section").dataset.liveBytes = String(root.value);
    Flame($("live-flame"), root, {
      color: (n) => memColor(n.name),
      tip: (n) => n.name + "\n" + fmtBytes(n.value) + " live (" + fmtCount(n.value) + " bytes)",
      empty: "Nothing live at this instant.",
    }).draw();
    const columns = [
      { key: "name", label: bs.by, text: true },
      { key: "bytes", label: "live bytes", fmt: fmtBytes },
      { key: "bytes", label: "exact bytes", fmt: fmtCount },
    ];
    if (bs.by !== "category") {
      columns.push({ key: "path", label: bs.by === "stack" ? "full stack, outermost first" : "module, outermost first", text: true, cls: "stack" });
    }
    sortableTable($("live-table"), columns, rows, 1, -1);
  }

  function goToPeak() {
    const runIndex = data.diff ? 1 : view().runs[0];
    const r = data.runs[runIndex];
    let best = -1;
    for (let i = 0; i < r.used.length; i++) if (best < 0 || r.used[i] > r.used[best]) best = i;
    if (best >= 0) selectInstant(runIndex, best);
  }

  // ---- tables ----
  function sortableTable(table, columns, rows, sortCol, sortDir) {
    table.textContent = "";
    const thead = el("thead"), tr = el("tr"), tbody = el("tbody");
    let col = sortCol, dir = sortDir || 0;
    const ths = columns.map((c, k) => {
      const th = el("th", { scope: "col" }, c.label);
      th.addEventListener("click", () => { dir = col === k ? -dir : (c.text ? 1 : -1); col = k; fill(); });
      tr.append(th);
      return th;
    });
    thead.append(tr);
    table.append(thead, tbody);
    function fill() {
      const sorted = rows.slice();
      if (col !== undefined && col !== null && dir) {
        const key = columns[col].key, text = columns[col].text;
        sorted.sort((a, b) => dir * (text ? String(a[key]).localeCompare(String(b[key])) : a[key] - b[key]));
      }
      ths.forEach((th, k) => {
        if (k === col && dir) th.setAttribute("aria-sort", dir > 0 ? "ascending" : "descending");
        else th.removeAttribute("aria-sort");
      });
      tbody.textContent = "";
      const frag = document.createDocumentFragment();
      for (const r of sorted) {
        const row = el("tr");
        for (const c of columns) {
          const v = r[c.key];
          const td = el("td", c.cls ? { class: c.cls } : null, c.fmt ? c.fmt(v) : String(v));
          row.append(td);
        }
        frag.append(row);
      }
      tbody.append(frag);
    }
    fill();
  }

  // Each table says how its cells print (see `Cell` in tables/columns.rs).
  const cellFormats = {
    text: { text: true },
    stack: { text: true, cls: "stack" },
    bytes: { fmt: fmtBytes },
    count: { fmt: fmtCount },
    duration: { fmt: fmtNs },
    plain: { fmt: String },
  };

  function renderTable(holder, t) {
    const h = el("h3", null, t.title);
    if (t.note) h.append(" ", el("small", null, "(" + t.note + ")"));
    const table = el("table", { id: t.id, class: "sortable" });
    holder.append(h, table);
    const columns = t.columns.map((c) => Object.assign({ key: c.key, label: c.label }, cellFormats[c.cell]));
    sortableTable(table, columns, t.rows);
  }

  function renderTables() {
    const holder = $("tables");
    holder.textContent = "";
    const inSection = !$("categories-section").hidden;
    for (const t of view().tables) {
      if (!(inSection && CATEGORY_TABLES.includes(t.id))) renderTable(holder, t);
    }
  }

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
      const dpr = window.devicePixelRatio || 1;
      W = canvas.clientWidth; H = canvas.clientHeight;
      canvas.width = Math.round(W * dpr); canvas.height = Math.round(H * dpr);
      const g = canvas.getContext("2d");
      g.setTransform(dpr, 0, 0, dpr, 0, 0);
      g.clearRect(0, 0, W, H);
      g.font = "11px system-ui, sans-serif";
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
})();
