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
  // A long table keeps its largest rows; the CLI prints them all.
  const left = ((view().elided || {}).table_rows || []).find((e) => e[0] === t.id);
  if (left) {
    h.append(" ", el("small", { class: "elided" }, fmtCount(left[1]) + " smaller rows not shown: `poolsight " +
      t.title + "` prints every row"));
  }
  const table = el("table", { id: t.id, class: "sortable" });
  holder.append(h, table);
  const columns = t.columns.map((c) => Object.assign({ key: c.key, label: c.label }, cellFormats[c.cell]));
  sortableTable(table, columns, t.rows);
}

function renderTables() {
  const holder = $("tables");
  holder.textContent = "";
  const inSection = (id) => (id === "phases-table" ? !$("phases-section").hidden
    : !$("categories-section").hidden && CATEGORY_TABLES.includes(id));
  for (const t of view().tables) {
    if (!inSection(t.id)) renderTable(holder, t);
  }
}
