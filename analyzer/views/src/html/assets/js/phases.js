// ---- memory by phase ----
// The phases table's figures (`poolsight categories`' phase split): per phase (a
// record_function range, or forward, backward and optimizer step inferred from the stacks),
// the bytes it allocated still live at the peak, one bar each as wide as its share of the
// peak, split by category in the category colors.
function renderPhases() {
  const section = $("phases-section");
  const v = view();
  const table = data.diff ? null : v.tables.find((t) => t.id === "phases-table");
  section.hidden = !table;
  if (!table) return;
  const runs = v.runs.map((i) => data.runs[i]);
  const peak = runs.reduce((a, r) => (r.peak_used_bytes > a.peak_used_bytes ? r : a), runs[0]);
  const total = table.rows.reduce((a, p) => a + p.at_peak_bytes, 0);
  $("phase-note").textContent = table.rows.some((p) => p.inferred)
    ? "The file records no record_function ranges: its phases are inferred from the stacks " +
      "(the autograd engine's frames for backward, torch/optim for the optimizer's step, a " +
      "module's forward for forward)."
    : "The phases are the file's record_function ranges.";
  const holder = $("phase-peak");
  holder.textContent = "";
  for (const p of table.rows) {
    const row = el("div", { class: "phase-row", "data-phase": p.phase });
    const share = p.at_peak_bytes / Math.max(1, total) * 100;
    row.append(el("span", { class: "phase-name" }, p.phase + " " + fmtBytes(p.at_peak_bytes) + " (" + share.toFixed(1) + "%)"));
    const bar = el("div", { class: "bar" });
    bar.style.width = Math.max(share, 0.5) + "%";
    for (const c of p.categories) {
      const part = el("span", { "data-category": c.category, "data-bytes": String(c.at_peak_bytes) });
      part.style.width = (c.at_peak_bytes / Math.max(1, p.at_peak_bytes) * 100) + "%";
      part.style.background = categoryColor(peak, c.category);
      const text = p.phase + ": " + c.category + " " + fmtBytes(c.at_peak_bytes) + " live at the peak";
      part.addEventListener("mousemove", (ev) => showTip(ev, text));
      part.addEventListener("mouseleave", hideTip);
      bar.append(part);
    }
    row.append(bar);
    holder.append(row);
  }
  // The categories' key, in the colors of the category view.
  const key = el("div", { class: "legend" });
  const seen = new Set();
  for (const c of table.rows.flatMap((p) => p.categories)) {
    if (seen.has(c.category)) continue;
    seen.add(c.category);
    const sw = el("span", { class: "swatch" });
    sw.style.background = categoryColor(peak, c.category);
    const item = el("span");
    item.append(sw, document.createTextNode(c.category));
    key.append(item);
  }
  holder.append(key);
  holder.dataset.totalBytes = String(total);
  const tables = $("phase-tables");
  tables.textContent = "";
  renderTable(tables, table);
}
