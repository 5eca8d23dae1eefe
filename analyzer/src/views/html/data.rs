//! What the HTML report shows, computed from replayed profiles: a pure function of them (and of
//! the live-bytes snapshots [`crate::replay::live_over_time`] takes), with no rendering. The
//! page's script draws everything from this data, serialized as JSON.
//!
//! Sizes stay bounded whatever the trace's length: a timeline has at most the series' points
//! (each its time bucket's exact maximum), each with the largest stacks live at that instant;
//! trees have one entry per calling context.

use std::collections::HashMap;

use serde::Serialize;

use crate::replay::{CallTree, Frame, LiveOverTime, Profile, Source};
use crate::tables::{HtmlTable, Report, ReportOptions};
use crate::views::flamegraph::{frame_display, Metric};

/// Stacks drawn as their own band in a timeline; the others are summed in one "other" band.
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
    /// Stacks the points name, as frame indices, outermost first.
    pub stacks: Vec<Vec<u32>>,
    /// The stacks of the timeline's own bands (indices into `stacks`), largest first.
    pub top: Vec<u32>,
    /// Per point, at its used maximum: `[stack, bytes, stack, bytes, ...]`, largest first.
    pub live: Vec<Vec<u64>>,
    /// Per point, live bytes of the stacks `live` leaves out.
    pub live_other: Vec<u64>,
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
    /// Every table of the list of tables, as each shows itself ([`crate::tables::Table::html`]).
    pub tables: Vec<HtmlTable>,
}

/// The two runs' trees merged by frame path: each node's own amounts on either side.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DiffTree {
    pub parent: Vec<u32>,
    pub frame: Vec<u32>,
    pub base: TreeData,
    pub new: TreeData,
}

#[derive(Default)]
struct Frames {
    labels: Vec<String>,
    index: HashMap<String, u32>,
}

impl Frames {
    fn of(&mut self, frame: &Frame) -> u32 {
        let label = frame_display(frame);
        if let Some(&i) = self.index.get(&label) {
            return i;
        }
        let i = self.labels.len() as u32;
        self.labels.push(label.clone());
        self.index.insert(label, i);
        i
    }
}

/// A named trace: its heading, its replayed profile (with `live_at_peak`) and its live bytes
/// over time (from [`crate::replay::live_over_time`] on the same trace).
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
    let diff = diff_tree(&mut frames, &base.profile.tree, &new.profile.tree);
    ReportData {
        title: title.to_string(),
        frames: frames.labels,
        runs,
        views,
        diff: Some(diff),
    }
}

fn run(frames: &mut Frames, part: &Part) -> RunData {
    let source: &Source = &part.profile.sources[0];
    let series = &source.series;
    let live = part.live;
    let mut stack_index: HashMap<u32, u32> = HashMap::new();
    let mut stacks: Vec<Vec<u32>> = Vec::new();
    let mut largest: Vec<u64> = Vec::new();
    let mut points = Vec::with_capacity(live.points.len());
    for snap in &live.points {
        let mut flat = Vec::with_capacity(snap.stacks.len() * 2);
        for &(id, bytes) in &snap.stacks {
            let i = *stack_index.entry(id).or_insert_with(|| {
                let path = live.stacks.get(&id).map_or(&[][..], Vec::as_slice);
                stacks.push(path.iter().map(|f| frames.of(f)).collect());
                largest.push(0);
                stacks.len() as u32 - 1
            });
            largest[i as usize] = largest[i as usize].max(bytes);
            flat.extend([u64::from(i), bytes]);
        }
        points.push(flat);
    }
    let mut top: Vec<u32> = (0..stacks.len() as u32).collect();
    top.sort_by(|&a, &b| {
        largest[b as usize]
            .cmp(&largest[a as usize])
            .then(a.cmp(&b))
    });
    top.truncate(TOP_STACKS);
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
        stacks,
        top,
        live: points,
        live_other: live.points.iter().map(|s| s.other).collect(),
    }
}

fn view(frames: &mut Frames, name: &str, runs: Vec<usize>, p: &Profile) -> ViewData {
    ViewData {
        name: name.to_string(),
        runs,
        tree: tree(frames, &p.tree),
        tables: Report::compute(p, &ReportOptions::default())
            .tables()
            .iter()
            .flat_map(|t| t.html())
            .collect(),
    }
}

fn tree(frames: &mut Frames, t: &CallTree) -> TreeData {
    let mut d = TreeData::default();
    for (i, n) in t.nodes.iter().enumerate() {
        d.parent.push(n.parent as u32);
        d.frame.push(if i == 0 {
            u32::MAX
        } else {
            frames.of(&n.frame)
        });
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
