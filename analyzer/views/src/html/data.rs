//! What the HTML report shows, computed from replayed profiles: a pure function of them (and of
//! the live-bytes snapshots [`poolsight_analyzer::replay::live_over_time`] takes), with no rendering. The
//! page's script draws everything from this data, serialized as JSON.
//!
//! Sizes stay bounded whatever the trace's length: a timeline has at most the series' points
//! (each its time bucket's exact maximum), each with the largest stacks, categories and modules
//! live at that instant; trees have one entry per calling context.

use std::collections::HashMap;

use serde::Serialize;

use super::bound::{self, Elided};
use super::names;
use crate::flamegraph::{frame_display, Metric};
use poolsight_analyzer::replay::{CallTree, Frame, LiveOverTime, Profile, Snapshot, Source};
use poolsight_analyzer::tables::categories::{phase_of, NO_PHASE, UNLABELLED};
use poolsight_analyzer::tables::{HtmlTable, Report, ReportOptions};

/// Groups (stacks, categories, modules) drawn as their own band in a timeline; the others are
/// summed in one "other" band.
pub const TOP_STACKS: usize = 10;

/// The whole report: frame names are interned once ([`ReportData::frames`]) and referred to by
/// index everywhere else.
#[derive(Debug, Clone, Serialize)]
pub struct ReportData {
    pub title: String,
    /// Frame labels, `name (file:line)`.
    pub frames: Vec<String>,
    /// One per trace, in report order (for a diff: base, then new).
    pub runs: Vec<RunData>,
    /// What the rank selector offers: with several traces the merged view first, then one per
    /// trace; for a diff, the base and the new run.
    pub views: Vec<ViewData>,
    pub diff: Option<DiffTree>,
    /// Every trace observes an allocator from outside (no pool of poolsight's): the page then
    /// speaks of allocated bytes, not of a pool.
    pub observed: bool,
    /// Why the run ran out of memory, as `poolsight oom` prints it, when a trace holds an
    /// out-of-memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oom: Option<String>,
}

/// One trace's timeline.
#[derive(Debug, Clone, Serialize)]
pub struct RunData {
    pub name: String,
    pub duration_ns: u64,
    pub peak_used_bytes: u64,
    pub peak_used_ns: u64,
    pub peak_acquired_bytes: u64,
    /// (epoch, begin ns, end ns)
    pub epochs: Vec<(u32, u64, u64)>,
    /// Width of a point's time bucket, ns.
    pub bucket_ns: f64,
    /// Per point: its bucket's start (ns), maximum used bytes, maximum acquired bytes.
    pub t: Vec<u64>,
    pub used: Vec<i64>,
    pub acquired: Vec<i64>,
    /// The ways the timeline's used bytes can be stacked: by stack, then by category and by
    /// module where the trace has them (see [`poolsight_analyzer::replay::live_over_time`]).
    pub bands: Vec<Bands>,
}

/// The used bytes of each point split one way (by stack, category or module): each point's
/// groups and its `other` add up to its used maximum exactly.
#[derive(Debug, Clone, Serialize)]
pub struct Bands {
    /// `stack`, `category`, `phase` or `module`.
    pub by: &'static str,
    /// Each group's name in legends, tooltips and the live table; no two alike
    /// ([`super::names`]).
    pub names: Vec<String>,
    /// Each group's frames, as frame indices, outermost first: a stack's frames, a module's
    /// link frames; none for a category.
    pub paths: Vec<Vec<u32>>,
    /// The groups drawn as their own band (indices into `names`), largest first.
    pub top: Vec<u32>,
    /// Per point, at its used maximum: `[group, bytes, group, bytes, ...]`, largest first.
    pub live: Vec<Vec<u64>>,
    /// Per point, live bytes of the groups `live` leaves out.
    pub other: Vec<u64>,
}

/// A calling-context tree in parallel arrays, parents before children; amounts are each node's
/// own (a flamegraph adds children into parents), by [`Metric`].
#[derive(Debug, Clone, Default, Serialize)]
pub struct TreeData {
    pub parent: Vec<u32>,
    pub frame: Vec<u32>,
    pub used: Vec<u64>,
    pub acquired: Vec<u64>,
    pub peak: Vec<u64>,
    pub time: Vec<u64>,
}

/// The views the rank selector switches between: flamegraphs and the report tables.
#[derive(Debug, Clone, Serialize)]
pub struct ViewData {
    pub name: String,
    /// Indices into [`ReportData::runs`] whose timelines this view shows.
    pub runs: Vec<usize>,
    pub tree: TreeData,
    /// Every table of the list of tables, as each shows itself ([`poolsight_analyzer::tables::Table::html`]).
    pub tables: Vec<HtmlTable>,
    /// What the page left out of the tree and the tables ([`super::bound`]).
    #[serde(skip_serializing_if = "Elided::is_empty")]
    pub elided: Elided,
}

/// The two runs' trees merged by frame path: each node's own amounts on either side.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DiffTree {
    pub parent: Vec<u32>,
    pub frame: Vec<u32>,
    pub base: TreeData,
    pub new: TreeData,
    /// Calling contexts folded into their callers to bound the page ([`super::bound`]).
    pub folded: usize,
}

#[derive(Default)]
struct Frames {
    labels: Vec<String>,
    index: HashMap<String, u32>,
}

impl Frames {
    fn path(&mut self, path: &[Frame]) -> Vec<u32> {
        path.iter().map(|f| self.of(f)).collect()
    }

    fn of(&mut self, frame: &Frame) -> u32 {
        self.intern(&frame_display(frame))
    }

    fn intern(&mut self, label: &str) -> u32 {
        if let Some(&i) = self.index.get(label) {
            return i;
        }
        let i = self.labels.len() as u32;
        self.labels.push(label.to_string());
        self.index.insert(label.to_string(), i);
        i
    }
}

/// A named trace: its heading, its replayed profile (with `live_at_peak`) and its live bytes
/// over time (from [`poolsight_analyzer::replay::live_over_time`] on the same trace).
pub struct Part<'a> {
    pub name: String,
    pub profile: &'a Profile,
    pub live: &'a LiveOverTime,
}

/// The report of the traces of one job (ranks, in report order). `merged` is their merged
/// profile, shown as its own view when there are several.
pub fn report(title: &str, parts: &[Part], merged: &Profile) -> ReportData {
    let mut frames = Frames::default();
    let runs: Vec<RunData> = parts.iter().map(|p| run(&mut frames, p)).collect();
    let mut views = Vec::new();
    if parts.len() > 1 {
        views.push(view(
            &mut frames,
            "all ranks (merged)",
            (0..parts.len()).collect(),
            merged,
        ));
    }
    for (i, p) in parts.iter().enumerate() {
        views.push(view(&mut frames, &p.name, vec![i], p.profile));
    }
    ReportData {
        title: title.to_string(),
        frames: frames.labels,
        runs,
        views,
        diff: None,
        observed: merged.memory().observed,
        oom: None,
    }
}

/// The report comparing two runs: both timelines, each side's view, and the differential tree.
pub fn diff(title: &str, base: &Part, new: &Part) -> ReportData {
    let mut frames = Frames::default();
    let runs = vec![run(&mut frames, base), run(&mut frames, new)];
    let views = vec![
        view(&mut frames, &base.name, vec![0], base.profile),
        view(&mut frames, &new.name, vec![1], new.profile),
    ];
    // Merged and bounded with frames of its own, so that the page names only the frames kept.
    let mut own = Frames::default();
    let merged = diff_tree(&mut own, &base.profile.tree, &new.profile.tree);
    let (mut diff, _) = bound::diff_tree(merged, bound::MAX_TREE_NODES);
    for f in diff.frame.iter_mut().skip(1) {
        *f = frames.intern(&own.labels[*f as usize]);
    }
    ReportData {
        title: title.to_string(),
        frames: frames.labels,
        runs,
        views,
        diff: Some(diff),
        observed: base.profile.memory().observed && new.profile.memory().observed,
        oom: None,
    }
}

fn run(frames: &mut Frames, part: &Part) -> RunData {
    let source: &Source = &part.profile.sources[0];
    let series = &source.series;
    let live = part.live;
    let mut bands = Vec::new();
    let (mut stacks, ids) = grouped("stack", &live.points);
    let paths: Vec<&[Frame]> = ids
        .iter()
        .map(|id| live.stacks.get(id).map_or(&[][..], Vec::as_slice))
        .collect();
    stacks.names = names::distinct(&paths, "(no stack)");
    stacks.paths = paths.iter().map(|p| frames.path(p)).collect();
    bands.push(stacks);
    if !live.by_category.is_empty() {
        let (mut categories, ids) = grouped("category", &live.by_category);
        categories.names = ids
            .iter()
            .map(|&c| {
                let name = live.categories.get(c as usize).cloned().flatten();
                name.unwrap_or_else(|| UNLABELLED.to_string())
            })
            .collect();
        categories.paths = vec![Vec::new(); ids.len()];
        bands.push(categories);
    }
    if let Some(phases) = phase_bands(live) {
        bands.push(phases);
    }
    if !live.by_module.is_empty() {
        let (mut modules, ids) = grouped("module", &live.by_module);
        let paths: Vec<&[Frame]> = ids
            .iter()
            .map(|&m| live.modules.get(m as usize).map_or(&[][..], Vec::as_slice))
            .collect();
        modules.names = names::distinct(&paths, "(outside every module)");
        modules.paths = paths.iter().map(|p| frames.path(p)).collect();
        bands.push(modules);
    }
    RunData {
        name: part.name.clone(),
        duration_ns: source.duration_ns,
        peak_used_bytes: source.pool.peak_used_bytes,
        peak_used_ns: source.pool.peak_used_ns,
        peak_acquired_bytes: source.pool.peak_acquired_bytes,
        epochs: source
            .epochs
            .iter()
            .map(|e| (e.epoch, e.begin_ns, e.end_ns))
            .collect(),
        bucket_ns: series.bucket_ns,
        t: series.points.iter().map(|p| p.0).collect(),
        used: series.points.iter().map(|p| p.1).collect(),
        acquired: series.points.iter().map(|p| p.2).collect(),
        bands,
    }
}

/// The used bytes of each point by phase ([`poolsight_analyzer::tables::categories::phase_of`]), from the
/// stacks each point keeps: the bytes of the stacks it leaves out are its `other` (their phase
/// is not known). None when no stack has a phase.
fn phase_bands(live: &LiveOverTime) -> Option<Bands> {
    let mut names: Vec<String> = Vec::new();
    let mut of_stack: HashMap<u32, u32> = HashMap::new();
    let mut any = false;
    for p in &live.points {
        for &(id, _) in &p.stacks {
            of_stack.entry(id).or_insert_with(|| {
                let path = live.stacks.get(&id).map_or(&[][..], Vec::as_slice);
                let (name, has) = match phase_of(path.iter()) {
                    Some((name, _)) => (name, true),
                    None => (NO_PHASE, false),
                };
                any |= has;
                match names.iter().position(|n| n == name) {
                    Some(i) => i as u32,
                    None => {
                        names.push(name.to_string());
                        names.len() as u32 - 1
                    }
                }
            });
        }
    }
    if !any {
        return None;
    }
    let points: Vec<Snapshot> = live
        .points
        .iter()
        .map(|p| {
            let mut by: Vec<(u32, u64)> = Vec::new();
            for &(id, bytes) in &p.stacks {
                let g = of_stack[&id];
                match by.iter_mut().find(|(k, _)| *k == g) {
                    Some(e) => e.1 = e.1.saturating_add(bytes),
                    None => by.push((g, bytes)),
                }
            }
            by.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            Snapshot {
                stacks: by,
                other: p.other,
            }
        })
        .collect();
    let (mut bands, ids) = grouped("phase", &points);
    bands.names = ids.iter().map(|&g| names[g as usize].clone()).collect();
    bands.paths = vec![Vec::new(); ids.len()];
    Some(bands)
}

/// The bands of per-point snapshots grouped one way, without names or paths, and the
/// snapshots' id of each group (groups numbered in order of first appearance).
fn grouped(by: &'static str, points: &[Snapshot]) -> (Bands, Vec<u32>) {
    let mut index: HashMap<u32, u32> = HashMap::new();
    let mut ids: Vec<u32> = Vec::new();
    let mut largest: Vec<u64> = Vec::new();
    let mut live = Vec::with_capacity(points.len());
    for snap in points {
        let mut flat = Vec::with_capacity(snap.stacks.len() * 2);
        for &(id, bytes) in &snap.stacks {
            let i = *index.entry(id).or_insert_with(|| {
                ids.push(id);
                largest.push(0);
                ids.len() as u32 - 1
            });
            largest[i as usize] = largest[i as usize].max(bytes);
            flat.extend([u64::from(i), bytes]);
        }
        live.push(flat);
    }
    let mut top: Vec<u32> = (0..ids.len() as u32).collect();
    top.sort_by(|&a, &b| {
        largest[b as usize]
            .cmp(&largest[a as usize])
            .then(a.cmp(&b))
    });
    top.truncate(TOP_STACKS);
    let bands = Bands {
        by,
        names: Vec::new(),
        paths: Vec::new(),
        top,
        live,
        other: points.iter().map(|s| s.other).collect(),
    };
    (bands, ids)
}

fn view(frames: &mut Frames, name: &str, runs: Vec<usize>, p: &Profile) -> ViewData {
    let mut elided = Elided::default();
    // Bounded before its frames are named, so that the page names only the frames it shows.
    let (mut tree, folded) = bound::tree(tree(&p.tree), bound::MAX_TREE_NODES);
    for f in tree.frame.iter_mut().skip(1) {
        *f = frames.of(&p.tree.nodes[*f as usize].frame);
    }
    elided.tree_nodes = folded;
    let tables = Report::compute(p, &ReportOptions::default())
        .tables()
        .iter()
        .flat_map(|t| t.html())
        .map(|t| {
            let (t, left) = bound::table(t, bound::MAX_TABLE_ROWS);
            if left > 0 {
                elided.table_rows.push((t.id, left));
            }
            t
        })
        .collect();
    ViewData {
        name: name.to_string(),
        runs,
        tree,
        tables,
        elided,
    }
}

/// The tree's nodes, each `frame` its node's index in `t` (the root's `u32::MAX`).
fn tree(t: &CallTree) -> TreeData {
    let mut d = TreeData::default();
    for (i, n) in t.nodes.iter().enumerate() {
        d.parent.push(n.parent as u32);
        d.frame.push(if i == 0 { u32::MAX } else { i as u32 });
        push_amounts(&mut d, t, i);
    }
    d
}

fn push_amounts(d: &mut TreeData, t: &CallTree, i: usize) {
    d.used.push(Metric::Used.self_value(t, i));
    d.acquired.push(Metric::Acquired.self_value(t, i));
    d.peak.push(Metric::Peak.self_value(t, i));
    d.time.push(Metric::Time.self_value(t, i));
}

fn push_zero(d: &mut TreeData) {
    d.used.push(0);
    d.acquired.push(0);
    d.peak.push(0);
    d.time.push(0);
}

/// Both trees on one: nodes matched by their frames' labels from the root.
fn diff_tree(frames: &mut Frames, base: &CallTree, new: &CallTree) -> DiffTree {
    let mut d = DiffTree {
        parent: vec![0],
        frame: vec![u32::MAX],
        ..DiffTree::default()
    };
    push_zero(&mut d.base);
    push_zero(&mut d.new);
    let mut child: HashMap<(u32, u32), u32> = HashMap::new();
    for (side, t) in [(0, base), (1, new)] {
        // Trees are in DFS preorder: a node's parent is mapped before it.
        let mut at = vec![0u32; t.nodes.len()];
        for (i, n) in t.nodes.iter().enumerate() {
            let node = if i == 0 {
                0
            } else {
                let f = frames.of(&n.frame);
                let parent = at[n.parent];
                *child.entry((parent, f)).or_insert_with(|| {
                    d.parent.push(parent);
                    d.frame.push(f);
                    push_zero(&mut d.base);
                    push_zero(&mut d.new);
                    d.parent.len() as u32 - 1
                })
            };
            at[i] = node;
            let mut own = TreeData::default();
            push_amounts(&mut own, t, i);
            let into = if side == 0 { &mut d.base } else { &mut d.new };
            let k = node as usize;
            into.used[k] += own.used[0];
            into.acquired[k] += own.acquired[0];
            into.peak[k] += own.peak[0];
            into.time[k] += own.time[0];
        }
    }
    d
}
