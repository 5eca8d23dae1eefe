//! `categories`: bytes by memory category and by module, the breakdown PyTorch's `MemTracker`
//! gives (torch/distributed/_tools/mem_tracker.py), from a trace whose allocations carry labels
//! (`poolsight.torch.track`).
//!
//! - **Categories**: each allocation's category is the innermost `Label` frame of its stack
//!   (`parameter`, `buffer`, `gradient`, `activation`, `temporary`, `optimizer_state`, ...;
//!   none: `(unlabelled)`). Per category: its live bytes at the trace's peak of live bytes (the
//!   column adds up to the headline's peak), its own highest and at the end. `MemTracker`
//!   prints such a breakdown at its current and peak snapshots (`display_snapshot`).
//! - **Modules**: each chain of link scopes (`Sequential/Linear`) with its completed calls and,
//!   for the call whose peak was highest, the live bytes as it began, as it ended and at its
//!   peak: `MemTracker`'s Pre-Forward, Post-Forward and Peak-Forward totals
//!   (`display_modulewise_snapshots`), exact from the events rather than snapshots in hooks.
//!   Where it differs: modules are named by class path, not by attribute path
//!   (`Sequential/Linear`, not `0`), so sibling modules of one class share a row; one row per
//!   module, its highest call, where `MemTracker` lists every call; no Pre/Post-Backward
//!   snapshots (the trace has no backward module scopes), but `Backward`: the bytes allocated by
//!   backward operators under the module (backward-phase function frames below its link frame,
//!   cumulative, as `functions` counts); and `LiveAtPeak`: its bytes (its submodules' included)
//!   still live at the trace's peak.
//!
//! `report` shows this table only for traces whose allocations carry labels (a replay computes
//! it for them; `poolsight categories` for any trace). Several traces (ranks) merge: `AtPeak`
//! and `LiveAtPeak` are the rank whose peak is the headline's (so they still add up to it), the
//! other figures the largest of any rank, calls and backward bytes summed.

use std::collections::HashMap;

use serde::Serialize;

use super::columns::html_rows;
use super::{
    Cell, Columns, DiffKey, Figures, HtmlColumn, HtmlTable, Quantity, ReportOptions, Table,
};
use crate::read::names::{FrameKind, Phase};
use crate::replay::{signed, CallBytes, CallTree, Frame, Profile};
use crate::tables::csv::to_csv;
use crate::tables::render::humanized;
use poolsight_frames::short_file;

/// What the categories of allocations without a label are called.
pub const UNLABELLED: &str = "(unlabelled)";

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Categories {
    /// The peak of live bytes the `at_peak_bytes` add up to.
    pub peak_used_bytes: u64,
    /// The categories were inferred from stacks, phases and lifetimes (a file that records
    /// none: docs/pytorch-files.md), not recorded.
    pub inferred: bool,
    pub categories: Vec<CategoryRow>,
    pub modules: Vec<ModuleRow>,
    /// Bytes live at the peak by phase, each split by category ([`phases`]); none when the
    /// trace has no phases.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub phases: Vec<PhaseRow>,
    /// Whether any trace's replay computed them (`report` leaves the table out otherwise).
    #[serde(skip)]
    pub computed: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CategoryRow {
    /// The label, or `(unlabelled)`.
    pub category: String,
    pub at_peak_bytes: u64,
    pub max_bytes: u64,
    /// When the category reached `max_bytes`, ns since its trace's start.
    pub max_ns: u64,
    pub at_end_bytes: u64,
    /// What some of its bytes were inferred from other than stacks: `gradient sizes` (blocks
    /// live from the start, each matched by a gradient of its size: docs/pytorch-files.md).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub inferred_from: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ModuleRow {
    /// Its link names from the outermost, joined by `/`.
    pub module: String,
    /// How many modules enclose it (0 for an outermost one).
    pub depth: u32,
    /// Where its innermost link frame was opened (a file in an installed package from the
    /// package on).
    pub file: String,
    pub line: u32,
    pub calls: u64,
    /// Live bytes as its highest call began, as it ended, and at that call's peak; `null`
    /// for a module never called (seen only in allocations' stacks).
    pub before_bytes: Option<i64>,
    pub after_bytes: Option<i64>,
    pub peak_bytes: Option<i64>,
    pub peak_call_begin_ns: Option<u64>,
    pub peak_call_end_ns: Option<u64>,
    /// Bytes allocated by backward operators under it, cumulative.
    pub backward_bytes: u64,
    /// Its bytes (its submodules' included) live at the trace's peak.
    pub live_at_peak_bytes: u64,
}

/// A phase of the run: a `record_function` range of an imported file, or a forward, backward
/// or optimizer step inferred from the stacks of one without (docs/pytorch-files.md).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PhaseRow {
    /// The range's name, `forward`, `backward`, `optimizer step`, or `(no phase)` for what was
    /// allocated outside every phase.
    pub phase: String,
    /// The phase was inferred from stacks, not recorded.
    pub inferred: bool,
    /// Bytes it allocated still live at the peak.
    pub at_peak_bytes: u64,
    /// Those bytes by category, largest first.
    pub categories: Vec<PhaseCategory>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PhaseCategory {
    pub category: String,
    pub at_peak_bytes: u64,
}

/// What allocations outside every phase are called.
pub const NO_PHASE: &str = "(no phase)";

/// The phase of an allocation's stack (outermost first): its innermost phase frame (a
/// function frame whose file is [`poolsight_schema::RANGE_FILE`] or, inferred,
/// [`poolsight_schema::INFERRED_LABEL`]), with whether it was inferred.
pub fn phase_of<'f>(path: impl DoubleEndedIterator<Item = &'f Frame>) -> Option<(&'f str, bool)> {
    path.rev().find_map(|f| {
        if f.kind != FrameKind::Function {
            return None;
        }
        match &*f.file {
            poolsight_schema::RANGE_FILE => Some((&*f.name, false)),
            poolsight_schema::INFERRED_LABEL => Some((&*f.name, true)),
            _ => None,
        }
    })
}

/// Bytes live at the peak by phase and category, from the tree's bytes live at the peak (a
/// replay that walked to it; several traces: each at its own peak, summed). Inferred phases in
/// a step's order, recorded ones in the tree's, `(no phase)` last; empty when no stack has a
/// phase or the tree has no bytes live at the peak.
pub fn phases(tree: &CallTree) -> Vec<PhaseRow> {
    let n = tree.nodes.len();
    // Per node: its phase (index into `rows`, 0 = none) and its category, inherited.
    let mut phase = vec![0usize; n];
    let mut category: Vec<Option<&str>> = vec![None; n];
    let mut rows: Vec<PhaseRow> = vec![PhaseRow {
        phase: NO_PHASE.into(),
        ..PhaseRow::default()
    }];
    let mut any = false;
    for i in 1..n {
        let node = &tree.nodes[i];
        let parent = if node.parent < i { node.parent } else { 0 };
        let f = &node.frame;
        phase[i] = match phase_of(std::iter::once(f)) {
            Some((name, inferred)) => {
                any = true;
                match rows
                    .iter()
                    .position(|r| r.phase == name && r.inferred == inferred)
                {
                    Some(k) => k,
                    None => {
                        rows.push(PhaseRow {
                            phase: name.into(),
                            inferred,
                            ..PhaseRow::default()
                        });
                        rows.len() - 1
                    }
                }
            }
            None => phase[parent],
        };
        category[i] = if f.kind == FrameKind::Label {
            Some(&*f.name)
        } else {
            category[parent]
        };
        let bytes = node.agg.live_at_peak_bytes;
        if bytes == 0 {
            continue;
        }
        let row = &mut rows[phase[i]];
        row.at_peak_bytes = row.at_peak_bytes.saturating_add(bytes);
        let name = category[i].unwrap_or(UNLABELLED);
        match row.categories.iter_mut().find(|c| c.category == name) {
            Some(c) => c.at_peak_bytes = c.at_peak_bytes.saturating_add(bytes),
            None => row.categories.push(PhaseCategory {
                category: name.into(),
                at_peak_bytes: bytes,
            }),
        }
    }
    // No phase, or no bytes live at the peak in the tree (a replay that did not walk to it).
    if !any || rows.iter().all(|r| r.at_peak_bytes == 0) {
        return Vec::new();
    }
    for r in &mut rows {
        r.categories.sort_by(|a, b| {
            b.at_peak_bytes
                .cmp(&a.at_peak_bytes)
                .then(a.category.cmp(&b.category))
        });
    }
    // Inferred phases in the order a step runs them, recorded ones as the tree met them;
    // `(no phase)` last, and only when it holds bytes.
    rows.rotate_left(1);
    let step_order = |r: &PhaseRow| match (r.inferred, r.phase.as_str()) {
        (true, "forward") => 0,
        (true, "backward") => 1,
        (true, _) => 2,
        _ => 3,
    };
    let no_phase = rows.pop();
    rows.sort_by_key(step_order);
    rows.extend(no_phase);
    rows.retain(|r| r.phase != NO_PHASE || r.at_peak_bytes > 0);
    rows
}

impl Categories {
    /// Whether there is nothing to show: no trace's replay computed categories.
    pub fn is_empty(&self) -> bool {
        !self.computed
    }

    /// Whether any allocation carried a label.
    pub fn labelled(&self) -> bool {
        self.categories.iter().any(|c| c.category != UNLABELLED)
    }
}

pub fn categories(p: &Profile) -> Categories {
    let computed: Vec<(usize, &crate::replay::CategoryFigures)> = p
        .sources
        .iter()
        .enumerate()
        .filter_map(|(i, s)| s.categories.as_ref().map(|c| (i, c)))
        .collect();
    if computed.is_empty() {
        return Categories::default();
    }
    // The rank whose peak is the headline's: its figures at the peak add up to it.
    let peak_source = computed
        .iter()
        .map(|&(i, _)| i)
        .max_by_key(|&i| (p.sources[i].pool.peak_used_bytes, std::cmp::Reverse(i)))
        .unwrap_or(0);
    let peak_used_bytes = p.sources[peak_source].pool.peak_used_bytes;

    let mut cats: Vec<CategoryRow> = Vec::new();
    for &(i, figures) in &computed {
        for c in &figures.categories {
            let name = c.name.as_deref().unwrap_or(UNLABELLED);
            let at = match cats.iter().position(|r| r.category == name) {
                Some(at) => at,
                None => {
                    cats.push(CategoryRow {
                        category: name.to_string(),
                        ..CategoryRow::default()
                    });
                    cats.len() - 1
                }
            };
            let r = &mut cats[at];
            if i == peak_source {
                r.at_peak_bytes = c.at_peak_bytes;
            }
            if c.max_bytes > r.max_bytes {
                (r.max_bytes, r.max_ns) = (c.max_bytes, c.max_ns);
            }
            r.at_end_bytes = r.at_end_bytes.max(c.at_end_bytes);
            for from in &c.inferred_from {
                if !r.inferred_from.contains(from) {
                    r.inferred_from.push(from.clone());
                }
            }
        }
    }
    // Unlabelled last, whatever rank first had it.
    cats.sort_by_key(|c| c.category == UNLABELLED);

    let backward = backward_bytes(&p.tree);
    let mut modules: Vec<(Vec<Frame>, ModuleRow)> = Vec::new();
    let mut index: HashMap<Vec<Frame>, usize> = HashMap::new();
    for &(i, figures) in &computed {
        for m in &figures.modules {
            let at = *index.entry(m.path.clone()).or_insert_with(|| {
                modules.push((m.path.clone(), module_row(&m.path)));
                modules.len() - 1
            });
            let r = &mut modules[at].1;
            r.calls += m.calls;
            if i == peak_source {
                r.live_at_peak_bytes = m.live_at_peak_bytes;
            }
            if let Some(c) = m.peak_call {
                if r.peak_bytes.is_none_or(|p| c.peak_bytes > p) {
                    set_peak_call(r, &c);
                }
            }
        }
    }
    for (path, r) in &mut modules {
        r.backward_bytes = backward.get(path).copied().unwrap_or(0);
    }
    Categories {
        peak_used_bytes,
        inferred: computed.iter().any(|(_, f)| f.inferred),
        categories: cats,
        modules: in_tree_order(modules),
        phases: phases(&p.tree),
        computed: true,
    }
}

fn module_row(path: &[Frame]) -> ModuleRow {
    let last = path.last();
    ModuleRow {
        module: path
            .iter()
            .map(|f| f.name.as_ref())
            .collect::<Vec<_>>()
            .join("/"),
        depth: path.len().saturating_sub(1) as u32,
        file: last.map_or("", |f| short_file(&f.file)).to_string(),
        line: last.map_or(0, |f| f.line),
        ..ModuleRow::default()
    }
}

fn set_peak_call(r: &mut ModuleRow, c: &CallBytes) {
    r.before_bytes = Some(c.before_bytes);
    r.after_bytes = Some(c.after_bytes);
    r.peak_bytes = Some(c.peak_bytes);
    r.peak_call_begin_ns = Some(c.begin_ns);
    r.peak_call_end_ns = Some(c.end_ns);
}

/// Bytes allocated by backward operators under each module: a request whose stack has a
/// backward-phase function frame counts for every link frame above that frame's innermost
/// one (its module and their callers).
fn backward_bytes(tree: &CallTree) -> HashMap<Vec<Frame>, u64> {
    let mut out: HashMap<Vec<Frame>, u64> = HashMap::new();
    for (i, n) in tree.nodes.iter().enumerate().skip(1) {
        let bytes = n.agg.used_bytes.saturating_sub(n.agg.failed_used_bytes);
        if bytes == 0 {
            continue;
        }
        let path = tree.path(i);
        let Some(backward) = path
            .iter()
            .rposition(|f| f.kind == FrameKind::Function && f.phase == Phase::Backward)
        else {
            continue;
        };
        let mut links: Vec<Frame> = Vec::new();
        for f in &path[..backward] {
            if f.kind == FrameKind::Link {
                links.push((*f).clone());
                let e = out.entry(links.clone()).or_default();
                *e = e.saturating_add(bytes);
            }
        }
    }
    out
}

/// Modules in first-seen order, rearranged so that each is followed by the modules it calls
/// (a module is seen no later than those it calls).
fn in_tree_order(modules: Vec<(Vec<Frame>, ModuleRow)>) -> Vec<ModuleRow> {
    let index: HashMap<&[Frame], usize> = modules
        .iter()
        .enumerate()
        .map(|(i, (p, _))| (p.as_slice(), i))
        .collect();
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); modules.len()];
    let mut roots = Vec::new();
    for (i, (path, _)) in modules.iter().enumerate() {
        match path
            .len()
            .checked_sub(1)
            .and_then(|n| index.get(&path[..n]))
        {
            Some(&parent) if parent != i => children[parent].push(i),
            _ => roots.push(i),
        }
    }
    let mut order = Vec::with_capacity(modules.len());
    let mut stack: Vec<usize> = roots.into_iter().rev().collect();
    while let Some(i) = stack.pop() {
        order.push(i);
        stack.extend(children[i].iter().rev());
    }
    let mut rows: Vec<Option<ModuleRow>> = modules.into_iter().map(|(_, r)| Some(r)).collect();
    order.into_iter().filter_map(|i| rows[i].take()).collect()
}

fn bytes_cell(b: Option<i64>) -> String {
    match b {
        Some(b) if b < 0 => format!("-{}", humanized(b.unsigned_abs())),
        Some(b) => humanized(b as u64),
        None => "-".into(),
    }
}

/// Columns two spaces apart, the first left-aligned (names, indented), the others right.
fn table(rows: &[Vec<String>]) -> String {
    super::render::aligned(rows, true)
}

pub fn render_table(t: &Categories) -> String {
    if t.is_empty() {
        return String::new();
    }
    let mut out = String::new();
    if t.labelled() {
        let mut rows = vec![vec![
            "Category".to_string(),
            "AtPeak".into(),
            "OwnMax".into(),
            "AtEnd".into(),
        ]];
        for c in &t.categories {
            rows.push(vec![
                c.category.clone(),
                humanized(c.at_peak_bytes),
                humanized(c.max_bytes),
                humanized(c.at_end_bytes),
            ]);
        }
        let sum = |f: fn(&CategoryRow) -> u64| {
            t.categories
                .iter()
                .fold(0u64, |s, c| s.saturating_add(f(c)))
        };
        rows.push(vec![
            "all".into(),
            humanized(sum(|c| c.at_peak_bytes)),
            "-".into(),
            humanized(sum(|c| c.at_end_bytes)),
        ]);
        out.push_str(&table(&rows));
        if t.inferred {
            out.push_str(
                "(inferred from stacks, phases and lifetimes: the file records no categories)\n",
            );
        }
        for c in t.categories.iter().filter(|c| !c.inferred_from.is_empty()) {
            out.push_str(&format!(
                "({}: includes blocks live from the start, inferred from {})\n",
                c.category,
                c.inferred_from.join(", ")
            ));
        }
    } else {
        out.push_str(
            "no memory categories in this trace (poolsight.torch.track() labels each allocation)\n",
        );
    }
    out.push('\n');
    if !t.phases.is_empty() {
        out.push_str(&render_phases(&t.phases));
        out.push('\n');
    }
    if t.modules.is_empty() {
        out.push_str("no module (link) scopes in this trace\n");
        return out;
    }
    let mut rows = vec![[
        "Module",
        "Calls",
        "PreForward",
        "PostForward",
        "PeakForward",
        "Backward",
        "LiveAtPeak",
    ]
    .map(String::from)
    .to_vec()];
    for m in &t.modules {
        let name = m.module.rsplit('/').next().unwrap_or(&m.module);
        rows.push(vec![
            format!("{}{name}", "  ".repeat(m.depth as usize)),
            m.calls.to_string(),
            bytes_cell(m.before_bytes),
            bytes_cell(m.after_bytes),
            bytes_cell(m.peak_bytes),
            humanized(m.backward_bytes),
            humanized(m.live_at_peak_bytes),
        ]);
    }
    out.push_str(&table(&rows));
    out
}

/// Phases as rows and their categories as columns (those live at the peak in any phase, in
/// order of their bytes), `-` where a phase holds none of one.
fn render_phases(phases: &[PhaseRow]) -> String {
    let mut columns: Vec<(&str, u64)> = Vec::new();
    for c in phases.iter().flat_map(|p| &p.categories) {
        match columns.iter_mut().find(|(n, _)| *n == c.category) {
            Some(col) => col.1 = col.1.saturating_add(c.at_peak_bytes),
            None => columns.push((&c.category, c.at_peak_bytes)),
        }
    }
    columns.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let mut head = vec!["Phase".to_string(), "AtPeak".into()];
    head.extend(columns.iter().map(|(n, _)| n.to_string()));
    let mut rows = vec![head];
    for p in phases {
        let mut row = vec![p.phase.clone(), humanized(p.at_peak_bytes)];
        row.extend(columns.iter().map(|(n, _)| {
            p.categories
                .iter()
                .find(|c| c.category == *n)
                .map_or("-".into(), |c| humanized(c.at_peak_bytes))
        }));
        rows.push(row);
    }
    let mut out = table(&rows);
    if phases.iter().any(|p| p.inferred) {
        out.push_str("(phases inferred from stacks: the file records no record_function ranges)\n");
    }
    out
}

/// A CSV row: categories and modules in one table, told apart by `kind`.
#[derive(Default, Serialize)]
struct CsvRow<'a> {
    kind: &'a str,
    name: &'a str,
    at_peak_bytes: Option<u64>,
    max_bytes: Option<u64>,
    max_ns: Option<u64>,
    at_end_bytes: Option<u64>,
    calls: Option<u64>,
    before_bytes: Option<i64>,
    after_bytes: Option<i64>,
    peak_bytes: Option<i64>,
    backward_bytes: Option<u64>,
    live_at_peak_bytes: Option<u64>,
}

fn csv_rows(t: &Categories) -> Vec<CsvRow<'_>> {
    let cats = t.categories.iter().map(|c| CsvRow {
        kind: "category",
        name: &c.category,
        at_peak_bytes: Some(c.at_peak_bytes),
        max_bytes: Some(c.max_bytes),
        max_ns: Some(c.max_ns),
        at_end_bytes: Some(c.at_end_bytes),
        ..CsvRow::default()
    });
    let modules = t.modules.iter().map(|m| CsvRow {
        kind: "module",
        name: &m.module,
        calls: Some(m.calls),
        before_bytes: m.before_bytes,
        after_bytes: m.after_bytes,
        peak_bytes: m.peak_bytes,
        backward_bytes: Some(m.backward_bytes),
        live_at_peak_bytes: Some(m.live_at_peak_bytes),
        ..CsvRow::default()
    });
    let phases = t.phases.iter().map(|p| CsvRow {
        kind: "phase",
        name: &p.phase,
        at_peak_bytes: Some(p.at_peak_bytes),
        ..CsvRow::default()
    });
    cats.chain(modules).chain(phases).collect()
}

pub fn render_csv(t: &Categories) -> String {
    to_csv(&csv_rows(t))
}

impl Table for Categories {
    const NAME: &'static str = "categories";
    const FIGURES: &'static [DiffKey] = &[
        DiffKey::scoped("category", "peak", Quantity::Bytes),
        DiffKey::scoped("category", "max", Quantity::Bytes),
        DiffKey::scoped("module", "peak", Quantity::Bytes),
    ];

    fn compute(p: &Profile, _: &ReportOptions) -> Categories {
        categories(p)
    }

    fn render_table(&self, _: &ReportOptions) -> String {
        render_table(self)
    }

    fn render_csv(&self) -> String {
        render_csv(self)
    }

    fn figures(&self, out: &mut Figures) {
        for c in &self.categories {
            out.scoped::<Self>("category", &c.category, "peak", signed(c.at_peak_bytes));
            out.scoped::<Self>("category", &c.category, "max", signed(c.max_bytes));
        }
        for m in &self.modules {
            if let Some(peak) = m.peak_bytes {
                out.scoped::<Self>("module", &m.module, "peak", peak);
            }
        }
    }

    /// Categories and modules, `kind` `category` or `module`, as the CSV.
    fn columns(&self) -> Option<Columns> {
        if self.is_empty() {
            return None;
        }
        let rows = csv_rows(self);
        let u = |v: Option<u64>| v.map(crate::tables::columns::i64_of);
        Columns::default()
            .numbered("row", rows.len())
            .strs("kind", &rows, |r| r.kind)
            .strs("name", &rows, |r| r.name)
            .opt_ints("at_peak_bytes", &rows, |r| u(r.at_peak_bytes))
            .opt_ints("max_bytes", &rows, |r| u(r.max_bytes))
            .opt_ints("max_ns", &rows, |r| u(r.max_ns))
            .opt_ints("at_end_bytes", &rows, |r| u(r.at_end_bytes))
            .opt_ints("calls", &rows, |r| u(r.calls))
            .opt_ints("before_bytes", &rows, |r| r.before_bytes)
            .opt_ints("after_bytes", &rows, |r| r.after_bytes)
            .opt_ints("peak_bytes", &rows, |r| r.peak_bytes)
            .opt_ints("backward_bytes", &rows, |r| u(r.backward_bytes))
            .opt_ints("live_at_peak_bytes", &rows, |r| u(r.live_at_peak_bytes))
            .into()
    }

    fn html(&self) -> Vec<HtmlTable> {
        if self.is_empty() {
            return Vec::new();
        }
        let mut tables = Vec::new();
        if self.labelled() {
            tables.push(HtmlTable {
                id: "categories-table",
                title: "categories",
                note: "PyTorch MemTracker's categories; at the peak, each one's own maximum, at the end",
                columns: vec![
                    HtmlColumn::new("category", "Category", Cell::Text),
                    HtmlColumn::new("at_peak_bytes", "AtPeak", Cell::Bytes),
                    HtmlColumn::new("max_bytes", "OwnMax", Cell::Bytes),
                    HtmlColumn::new("max_ns", "OwnMaxAt", Cell::Duration),
                    HtmlColumn::new("at_end_bytes", "AtEnd", Cell::Bytes),
                ],
                rows: html_rows(&self.categories),
            });
        }
        if !self.phases.is_empty() {
            // Each row also holds its categories, for the page's phase view.
            let rows = self
                .phases
                .iter()
                .map(|p| {
                    let mut v = serde_json::to_value(p).unwrap_or(serde_json::Value::Null);
                    v["split"] = p
                        .categories
                        .iter()
                        .map(|c| format!("{} {}", c.category, humanized(c.at_peak_bytes)))
                        .collect::<Vec<_>>()
                        .join(", ")
                        .into();
                    v
                })
                .collect();
            tables.push(HtmlTable {
                id: "phases-table",
                title: "phases",
                note: "bytes each phase allocated still live at the peak, by category",
                columns: vec![
                    HtmlColumn::new("phase", "Phase", Cell::Text),
                    HtmlColumn::new("at_peak_bytes", "AtPeak", Cell::Bytes),
                    HtmlColumn::new("split", "By category", Cell::Text),
                ],
                rows,
            });
        }
        if !self.modules.is_empty() {
            // Modules keep their tree's shape in the name column, as `lines` does.
            let rows = self
                .modules
                .iter()
                .map(|m| {
                    let mut v = serde_json::to_value(m).unwrap_or(serde_json::Value::Null);
                    let name = m.module.rsplit('/').next().unwrap_or(&m.module);
                    v["name"] = format!("{}{name}", "\u{a0}\u{a0}".repeat(m.depth as usize)).into();
                    v
                })
                .collect();
            tables.push(HtmlTable {
                id: "modules-table",
                title: "modules",
                note: "MemTracker's Pre/Post/Peak-Forward of each module's highest call; bytes its backward allocated; live at the peak",
                columns: vec![
                    HtmlColumn::new("name", "Module", Cell::Stack),
                    HtmlColumn::new("calls", "Calls", Cell::Count),
                    HtmlColumn::new("before_bytes", "PreForward", Cell::Bytes),
                    HtmlColumn::new("after_bytes", "PostForward", Cell::Bytes),
                    HtmlColumn::new("peak_bytes", "PeakForward", Cell::Bytes),
                    HtmlColumn::new("backward_bytes", "Backward", Cell::Bytes),
                    HtmlColumn::new("live_at_peak_bytes", "LiveAtPeak", Cell::Bytes),
                ],
                rows,
            });
        }
        tables
    }
}
