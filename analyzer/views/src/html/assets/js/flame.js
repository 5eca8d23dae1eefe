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
  // A large tree keeps the frames a screen can show; the rest is counted in their callers.
  const folded = data.diff ? (data.diff.folded || 0) : ((view().elided || {}).tree_nodes || 0);
  $("flame-note").hidden = !folded;
  $("flame-note").textContent = folded ? fmtCount(folded) + " calling contexts too narrow to draw are " +
    "counted in their callers; `poolsight " + (data.diff ? "diff --flamegraph" : "flamegraph") +
    "` draws them all." : "";
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
