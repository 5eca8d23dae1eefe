//! Replay: turns a verified trace into a [`Profile`], the one summary every report is computed
//! from. Two passes run at once (`rayon::join`):
//!
//! - **Per stack** (parallel over chunks): each chunk folds its events into a small map from
//!   interned stack id to counters (mallocs, used bytes, device allocs, acquired bytes, scope
//!   calls, scope time, first-seen times). Maps merge by addition and minimum, so the result
//!   does not depend on how rayon splits the work.
//! - **In time order** (one thread): the pool's used and acquired bytes over time need the
//!   memory events of every thread merged by timestamp, with the epoch marks in between. A
//!   k-way merge over the per-thread chunk sequences walks them, taking runs of one thread's
//!   events while no other thread's event is earlier, so a single-threaded trace costs no heap
//!   operation per event.
//!
//! Memory stays bounded by the number of distinct stacks, not events: nothing is copied out of
//! the mapping, and each pass gives a chunk's pages back to the kernel once it is done with
//! them (see [`Trace::release_pages`]), so a trace far larger than RAM replays in a few MB.
//!
//! Bytes: a malloc's `mem_size` is its requested size rounded up to the device's allocation
//! unit, as the pool rounds it. Failed mallocs and device allocations (pointer 0) count
//! nowhere: nothing was used or acquired.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use poolsight_schema::fb;
use rayon::prelude::*;
use rustc_hash::FxHashMap;
use serde::Serialize;

use crate::names::{FrameKind, Phase};
use crate::reader::{ChunkInfo, ChunkKind, Trace, WINDOW};

/// When something was first seen: (index of the trace among those merged, ns since its start).
/// Comparing these orders rows by trace first, then by time, deterministically.
pub type Seen = (u32, u64);
pub const NEVER: Seen = (u32::MAX, u64::MAX);

/// What to compute beyond the always-computed figures.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    /// Bytes live at the moment of the pool's peak, by stack (a second time-ordered pass).
    pub live_at_peak: bool,
    /// Points in the used/acquired-bytes series (for the timeline plot).
    pub series_points: usize,
    /// Bytes of chunks processed so far, for a progress bar; each pass adds each chunk's
    /// length once, so the total is [`progress_total`] of the trace.
    pub progress: Option<Arc<AtomicU64>>,
}

/// What [`ReplayOptions::progress`] counts up to for a trace.
pub fn progress_total(trace: &Trace, opts: &ReplayOptions) -> u64 {
    let bytes: u64 = trace.chunks.iter().map(|c| c.len as u64).sum();
    let mem: u64 = trace
        .chunks
        .iter()
        .filter(|c| c.kind == ChunkKind::Mem)
        .map(|c| c.len as u64)
        .sum();
    bytes + mem * if opts.live_at_peak { 2 } else { 1 }
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            live_at_peak: false,
            series_points: 2000,
            progress: None,
        }
    }
}

/// One frame of a calling context: `file:line:name`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frame {
    pub kind: FrameKind,
    pub phase: Phase,
    pub file: Arc<str>,
    pub line: u32,
    pub name: Arc<str>,
}

impl Frame {
    fn root() -> Frame {
        Frame {
            kind: FrameKind::Unknown,
            phase: Phase::None,
            file: "".into(),
            line: 0,
            name: "_root".into(),
        }
    }

    /// `file:line:name`, the stable key of a frame across traces.
    pub fn key(&self) -> String {
        format!("{}:{}:{}", self.file, self.line, self.name)
    }
}

/// Counters of one calling context (its own events, not its callees').
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Agg {
    /// Successful pool mallocs whose stack is exactly this context.
    pub mallocs: u64,
    /// Their `mem_size` sum.
    pub used_bytes: u64,
    /// Device allocations (pool misses) attributed to this context.
    pub allocs: u64,
    pub acquired_bytes: u64,
    /// Closed scopes whose innermost frame is this node.
    pub calls: u64,
    pub time_ns: u64,
    /// First malloc or alloc here.
    pub first_mem: Seen,
    /// First scope exit here (Chainer appends a call to its history when the call ends).
    pub first_exit: Seen,
    /// Bytes allocated here still live at the pool's peak (with `ReplayOptions::live_at_peak`).
    pub live_at_peak_bytes: u64,
}

impl Default for Agg {
    fn default() -> Self {
        Agg {
            mallocs: 0,
            used_bytes: 0,
            allocs: 0,
            acquired_bytes: 0,
            calls: 0,
            time_ns: 0,
            first_mem: NEVER,
            first_exit: NEVER,
            live_at_peak_bytes: 0,
        }
    }
}

impl Agg {
    fn add(&mut self, o: &Agg) {
        self.mallocs += o.mallocs;
        self.used_bytes = self.used_bytes.saturating_add(o.used_bytes);
        self.allocs += o.allocs;
        self.acquired_bytes = self.acquired_bytes.saturating_add(o.acquired_bytes);
        self.calls += o.calls;
        self.time_ns = self.time_ns.saturating_add(o.time_ns);
        self.first_mem = self.first_mem.min(o.first_mem);
        self.first_exit = self.first_exit.min(o.first_exit);
        self.live_at_peak_bytes = self.live_at_peak_bytes.saturating_add(o.live_at_peak_bytes);
    }
}

/// A node of the calling-context tree.
#[derive(Debug, Clone)]
pub struct Node {
    pub frame: Frame,
    /// Index of the parent (the root is its own parent).
    pub parent: usize,
    /// In first-seen order: by first malloc in the subtree, then first scope exit, then frame.
    pub children: Vec<usize>,
    pub agg: Agg,
    /// `agg` summed over the subtree (first-seen: minimum over it).
    pub total: Agg,
}

/// The calling-context tree: node 0 is `_root`, every recorded stack a path from it.
#[derive(Debug, Clone)]
pub struct CallTree {
    pub nodes: Vec<Node>,
}

impl Default for CallTree {
    fn default() -> Self {
        CallTree {
            nodes: vec![Node {
                frame: Frame::root(),
                parent: 0,
                children: Vec::new(),
                agg: Agg::default(),
                total: Agg::default(),
            }],
        }
    }
}

impl CallTree {
    pub fn root(&self) -> &Node {
        &self.nodes[0]
    }

    fn child(&mut self, parent: usize, frame: &Frame) -> usize {
        if let Some(&c) = self.nodes[parent]
            .children
            .iter()
            .find(|&&c| self.nodes[c].frame == *frame)
        {
            return c;
        }
        let id = self.nodes.len();
        self.nodes.push(Node {
            frame: frame.clone(),
            parent,
            children: Vec::new(),
            agg: Agg::default(),
            total: Agg::default(),
        });
        self.nodes[parent].children.push(id);
        id
    }

    /// Adds every node of `other` (a tree of another trace) into this one, matching by frame.
    pub fn merge(&mut self, other: &CallTree) {
        let mut map = vec![0usize; other.nodes.len()];
        // Parents come before children in `nodes` of a finished tree (DFS order).
        for (i, n) in other.nodes.iter().enumerate() {
            let at = if i == 0 {
                0
            } else {
                self.child(map[n.parent], &n.frame)
            };
            map[i] = at;
            let agg = n.agg;
            self.nodes[at].agg.add(&agg);
        }
        self.finish();
    }

    /// Computes subtree totals, orders children, and renumbers nodes in DFS order.
    fn finish(&mut self) {
        for i in (0..self.nodes.len()).rev() {
            let mut total = self.nodes[i].agg;
            for &c in &self.nodes[i].children {
                total.add(&self.nodes[c].total);
            }
            self.nodes[i].total = total;
        }
        let nodes = &self.nodes;
        let mut order: Vec<Vec<usize>> = nodes.iter().map(|n| n.children.clone()).collect();
        for ch in order.iter_mut() {
            ch.sort_by(|&a, &b| {
                let (a, b) = (&nodes[a], &nodes[b]);
                (a.total.first_mem, a.total.first_exit, &a.frame).cmp(&(
                    b.total.first_mem,
                    b.total.first_exit,
                    &b.frame,
                ))
            });
        }
        // Renumber in DFS preorder so that parents precede children and a walk is a scan.
        let mut new_id = vec![usize::MAX; nodes.len()];
        let mut dfs = Vec::with_capacity(nodes.len());
        let mut stack = vec![0usize];
        while let Some(i) = stack.pop() {
            new_id[i] = dfs.len();
            dfs.push(i);
            stack.extend(order[i].iter().rev());
        }
        let mut out = Vec::with_capacity(dfs.len());
        for &old in &dfs {
            let n = &nodes[old];
            out.push(Node {
                frame: n.frame.clone(),
                parent: new_id[n.parent],
                children: order[old].iter().map(|&c| new_id[c]).collect(),
                agg: n.agg,
                total: n.total,
            });
        }
        self.nodes = out;
    }

    /// Depth-first preorder walk: (node index, depth), the root at depth 0.
    pub fn walk(&self) -> Vec<(usize, usize)> {
        let mut out = Vec::with_capacity(self.nodes.len());
        let mut stack = vec![(0usize, 0usize)];
        while let Some((i, d)) = stack.pop() {
            out.push((i, d));
            for &c in self.nodes[i].children.iter().rev() {
                stack.push((c, d + 1));
            }
        }
        out
    }

    /// Frames from the root's child down to `i`.
    pub fn path(&self, mut i: usize) -> Vec<&Frame> {
        let mut out = Vec::new();
        while i != 0 {
            out.push(&self.nodes[i].frame);
            i = self.nodes[i].parent;
        }
        out.reverse();
        out
    }
}

/// The pool's figures over the whole trace, exact from its events.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PoolFigures {
    pub peak_used_bytes: u64,
    pub peak_used_ns: u64,
    pub peak_acquired_bytes: u64,
    pub peak_acquired_ns: u64,
    pub used_at_end_bytes: i64,
    pub acquired_at_end_bytes: i64,
    pub mallocs: u64,
    pub frees: u64,
    pub device_allocs: u64,
    pub releases: u64,
    pub out_of_memory: u64,
}

/// One epoch as recorded: absolute figures at its boundaries, fastai's deltas are computed by
/// the `epochs` report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EpochFigures {
    pub epoch: u32,
    pub begin_ns: u64,
    pub end_ns: u64,
    /// False when the trace ended before the epoch did (then `end` is the trace's end).
    pub complete: bool,
    pub gpu_begin_bytes: i64,
    pub gpu_end_bytes: i64,
    pub gpu_max_bytes: i64,
    pub cpu_begin_bytes: u64,
    pub cpu_end_bytes: u64,
    pub cpu_peak_bytes: u64,
}

/// Used and acquired bytes over time, at most `series_points` buckets of equal width, each
/// holding the maximum reached in it (so no peak falls between two points).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Series {
    pub bucket_ns: f64,
    /// (ns at bucket start, max used bytes, max acquired bytes)
    pub points: Vec<(u64, i64, i64)>,
}

/// One replayed trace's own figures.
#[derive(Debug, Clone, Serialize)]
pub struct Source {
    pub path: String,
    pub rank: Option<u32>,
    pub events: u64,
    pub duration_ns: u64,
    pub warnings: Vec<String>,
    pub pool: PoolFigures,
    pub epochs: Vec<EpochFigures>,
    pub series: Series,
}

/// Everything the reports need, from one trace or merged from several (ranks of one job).
#[derive(Debug, Clone)]
pub struct Profile {
    pub sources: Vec<Source>,
    pub tree: CallTree,
}

impl Profile {
    /// Merges profiles of several traces (in the given order) into one.
    pub fn merge(parts: Vec<Profile>) -> Profile {
        let mut it = parts.into_iter();
        let Some(mut first) = it.next() else {
            return Profile {
                sources: Vec::new(),
                tree: CallTree::default(),
            };
        };
        for p in it {
            first.tree.merge(&p.tree);
            first.sources.extend(p.sources);
        }
        first
    }

    /// Wall time of the longest of the merged traces.
    pub fn duration_ns(&self) -> u64 {
        self.sources
            .iter()
            .map(|s| s.duration_ns)
            .max()
            .unwrap_or(0)
    }
}

/// Replays one trace. `index` is its position among the traces being merged (0 for one).
pub fn replay(trace: &Trace, index: u32, opts: &ReplayOptions) -> Profile {
    let (stacks, timeline) = rayon::join(
        || per_stack(trace, opts.progress.as_deref()),
        || in_time_order(trace, opts.series_points, None, opts.progress.as_deref()),
    );
    let live = if opts.live_at_peak && timeline.peak_ordinal.is_some() {
        in_time_order(trace, 0, timeline.peak_ordinal, opts.progress.as_deref()).live
    } else {
        HashMap::new()
    };
    let (events, last_ticks) = (stacks.events, stacks.last_ticks);
    let tree = build_tree(trace, index, &stacks.into_map(), &live);
    let end_ticks = trace
        .footer
        .map_or(timeline.last_ticks.max(last_ticks), |f| f.end_ticks);
    let source = Source {
        path: trace.path.display().to_string(),
        rank: trace.header.rank,
        events,
        duration_ns: trace.ns_since_start(end_ticks),
        warnings: trace.warnings.iter().map(|w| w.to_string()).collect(),
        pool: timeline.pool(trace),
        epochs: timeline.epochs(trace, end_ticks),
        series: timeline.series(trace),
    };
    Profile {
        sources: vec![source],
        tree,
    }
}

/// Counters per stack id while replaying; times in ticks.
#[derive(Debug, Clone, Copy)]
struct StackAgg {
    mallocs: u64,
    used: u64,
    allocs: u64,
    acquired: u64,
    calls: u64,
    ticks: u64,
    first_mem: u64,
    first_exit: u64,
}

impl Default for StackAgg {
    fn default() -> Self {
        StackAgg {
            mallocs: 0,
            used: 0,
            allocs: 0,
            acquired: 0,
            calls: 0,
            ticks: 0,
            first_mem: u64::MAX,
            first_exit: u64::MAX,
        }
    }
}

impl StackAgg {
    fn add(&mut self, o: &StackAgg) {
        self.mallocs += o.mallocs;
        self.used = self.used.saturating_add(o.used);
        self.allocs += o.allocs;
        self.acquired = self.acquired.saturating_add(o.acquired);
        self.calls += o.calls;
        self.ticks = self.ticks.saturating_add(o.ticks);
        self.first_mem = self.first_mem.min(o.first_mem);
        self.first_exit = self.first_exit.min(o.first_exit);
    }
}

/// Per-stack counters of part of a trace. Stack ids are dense (interned from 1), so the
/// first ones index a vector; ids past its end (a trace with very many stacks, or a damaged
/// one) go to a map, which keeps memory bounded by the stacks actually seen.
struct PerStack {
    dense: Vec<StackAgg>,
    sparse: FxHashMap<u32, StackAgg>,
    events: u64,
    last_ticks: u64,
}

/// Most stacks held in a [`PerStack`]'s vector (each accumulator of the parallel fold has one).
const DENSE_STACKS: usize = 1 << 16;

impl PerStack {
    fn new(stacks: usize) -> PerStack {
        PerStack {
            dense: vec![StackAgg::default(); (stacks + 1).min(DENSE_STACKS)],
            sparse: FxHashMap::default(),
            events: 0,
            last_ticks: 0,
        }
    }

    #[inline]
    fn slot(&mut self, stack: u32) -> &mut StackAgg {
        match self.dense.get_mut(stack as usize) {
            Some(a) => a,
            None => self.sparse.entry(stack).or_default(),
        }
    }

    fn merge(mut self, other: PerStack) -> PerStack {
        for (a, b) in self.dense.iter_mut().zip(&other.dense) {
            a.add(b);
        }
        for (k, v) in other.sparse {
            self.sparse.entry(k).or_default().add(&v);
        }
        self.events += other.events;
        self.last_ticks = self.last_ticks.max(other.last_ticks);
        self
    }

    /// The stacks that saw anything.
    fn into_map(self) -> FxHashMap<u32, StackAgg> {
        let mut map = self.sparse;
        for (id, a) in self.dense.into_iter().enumerate() {
            if a.mallocs + a.allocs + a.calls > 0 {
                map.insert(id as u32, a);
            }
        }
        map
    }
}

/// Rounding of malloc sizes, per device id (the pool rounds to the device's allocation unit).
struct Units([u64; 256]);

impl Units {
    fn of(trace: &Trace) -> Units {
        let mut u = [DEFAULT_UNIT; 256];
        for d in &trace.defs.devices {
            if let Some(slot) = u.get_mut(d.id as usize) {
                *slot = d.allocation_unit.max(1);
            }
        }
        Units(u)
    }

    #[inline]
    fn mem_size(&self, device: u8, size: u64) -> u64 {
        let unit = self.0[device as usize];
        if unit.is_power_of_two() {
            // Every real unit is a power of two; a mask spares a 64-bit division per event.
            let mask = unit - 1;
            size.saturating_add(mask) & !mask
        } else {
            size.div_ceil(unit).saturating_mul(unit)
        }
    }
}

/// CuPy's allocation unit, for devices a damaged trace never defined.
const DEFAULT_UNIT: u64 = 512;

fn per_stack(trace: &Trace, progress: Option<&AtomicU64>) -> PerStack {
    let units = Units::of(trace);
    let stacks = trace.defs.stacks.len();
    trace
        .windows(trace.chunks.iter())
        .par_iter()
        .fold(
            || PerStack::new(stacks),
            |mut acc, window| {
                for c in window {
                    match c.kind {
                        ChunkKind::Mem => fold_mem(trace, c, &units, &mut acc),
                        ChunkKind::Scope => fold_scopes(trace, c, &mut acc),
                        ChunkKind::Mark => acc.events += trace.mark_events(c).len() as u64,
                        ChunkKind::Defs | ChunkKind::Footer => {}
                    }
                    if let Some(p) = progress {
                        p.fetch_add(c.len as u64, Ordering::Relaxed);
                    }
                }
                trace.release_window(window);
                acc
            },
        )
        .reduce(|| PerStack::new(stacks), PerStack::merge)
}

fn fold_mem(trace: &Trace, c: &ChunkInfo, units: &Units, acc: &mut PerStack) {
    let mut base = c.base_ticks;
    let mut events = 0u64;
    let mut last_ticks = 0;
    for e in trace.mem_events(c) {
        let kind = e.kind();
        if kind == fb::MemKind::Rebase {
            base = e.ptr();
            continue;
        }
        events += 1;
        let ticks = base.wrapping_add(e.ts() as u64);
        last_ticks = ticks;
        match kind {
            fb::MemKind::MallocPost if e.ptr() != 0 => {
                let a = acc.slot(e.stack());
                a.mallocs += 1;
                a.used = a.used.saturating_add(units.mem_size(e.device(), e.bytes()));
                a.first_mem = a.first_mem.min(ticks);
            }
            fb::MemKind::AllocPost if e.ptr() != 0 => {
                let a = acc.slot(e.stack());
                a.allocs += 1;
                a.acquired = a.acquired.saturating_add(e.bytes());
                a.first_mem = a.first_mem.min(ticks);
            }
            _ => {}
        }
    }
    acc.events += events;
    acc.last_ticks = acc.last_ticks.max(last_ticks);
}

fn fold_scopes(trace: &Trace, c: &ChunkInfo, acc: &mut PerStack) {
    let mut last_ticks = 0;
    for (ticks, e) in trace.scope_timeline(c) {
        acc.events += 1;
        last_ticks = ticks;
        let a = acc.slot(e.stack());
        a.calls += 1;
        a.ticks = a.ticks.saturating_add(e.duration());
        a.first_exit = a.first_exit.min(ticks);
    }
    acc.last_ticks = acc.last_ticks.max(last_ticks);
}

fn frame_of(trace: &Trace, frame_id: u32) -> Frame {
    let defs = &trace.defs;
    match defs.frames.get(&frame_id) {
        Some(f) => Frame {
            kind: f.kind.into(),
            phase: f.phase.into(),
            file: defs.string(f.file).into(),
            line: f.line,
            name: defs.string(f.name).into(),
        },
        None => Frame {
            kind: FrameKind::Unknown,
            phase: Phase::None,
            file: "?".into(),
            line: 0,
            name: format!("<undefined frame {frame_id}>").into(),
        },
    }
}

/// A damaged trace could hold a stack that names itself as an ancestor; real stacks are
/// interned parent first, so a parent id is always smaller, and deeper chains than this are
/// cut.
const MAX_STACK_DEPTH: usize = 4096;

fn build_tree(
    trace: &Trace,
    index: u32,
    aggs: &FxHashMap<u32, StackAgg>,
    live: &HashMap<u32, u64>,
) -> CallTree {
    let mut tree = CallTree::default();
    let mut node_of: HashMap<u32, usize> = HashMap::new();
    node_of.insert(0, 0);
    let seen = |ticks: u64| {
        if ticks == u64::MAX {
            NEVER
        } else {
            (index, trace.ns_since_start(ticks))
        }
    };
    // Sorted ids make the tree's construction order, hence its output, deterministic.
    let mut ids: Vec<u32> = aggs.keys().chain(live.keys()).copied().collect();
    ids.sort_unstable();
    ids.dedup();
    for id in ids {
        let node = node_for(trace, &mut tree, &mut node_of, id);
        let a = aggs.get(&id).copied().unwrap_or_default();
        let agg = &mut tree.nodes[node].agg;
        agg.add(&Agg {
            mallocs: a.mallocs,
            used_bytes: a.used,
            allocs: a.allocs,
            acquired_bytes: a.acquired,
            calls: a.calls,
            time_ns: trace.ticks_to_ns(a.ticks),
            first_mem: seen(a.first_mem),
            first_exit: seen(a.first_exit),
            live_at_peak_bytes: live.get(&id).copied().unwrap_or(0),
        });
    }
    tree.finish();
    tree
}

fn node_for(
    trace: &Trace,
    tree: &mut CallTree,
    node_of: &mut HashMap<u32, usize>,
    id: u32,
) -> usize {
    if let Some(&n) = node_of.get(&id) {
        return n;
    }
    // Collect the chain up to a known node, then create downwards.
    let mut chain = Vec::new();
    let mut cur = id;
    let mut top = 0;
    while chain.len() < MAX_STACK_DEPTH {
        if let Some(&n) = node_of.get(&cur) {
            top = n;
            break;
        }
        match trace.defs.stacks.get(&cur) {
            Some(&(parent, frame)) => {
                chain.push((cur, frame_of(trace, frame)));
                if parent >= cur {
                    break;
                }
                cur = parent;
            }
            None => {
                chain.push((
                    cur,
                    Frame {
                        kind: FrameKind::Unknown,
                        phase: Phase::None,
                        file: "?".into(),
                        line: 0,
                        name: format!("<undefined stack {cur}>").into(),
                    },
                ));
                break;
            }
        }
    }
    let mut at = top;
    for (sid, frame) in chain.into_iter().rev() {
        at = tree.child(at, &frame);
        node_of.insert(sid, at);
    }
    at
}

/// Byte counts from the file as signed running totals; a damaged trace's absurd sizes
/// saturate instead of wrapping.
#[inline]
fn signed(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

/// State of the time-ordered pass.
struct Timeline {
    used: i64,
    acquired: i64,
    peak_used: i64,
    peak_used_ticks: u64,
    peak_acquired: i64,
    peak_acquired_ticks: u64,
    /// Ordinal (in merge order) of the memory event that reached the used peak.
    peak_ordinal: Option<u64>,
    ordinal: u64,
    last_ticks: u64,
    mallocs: u64,
    frees: u64,
    allocs: u64,
    releases: u64,
    ooms: u64,
    open_epoch: Option<OpenEpoch>,
    epochs: Vec<RawEpoch>,
    series: Downsampler,
    /// With a stop ordinal: (device, ptr) -> (mem_size, stack) of live blocks.
    blocks: FxHashMap<(u8, u64), (u64, u32)>,
    /// Live bytes by stack at the stop ordinal.
    live: HashMap<u32, u64>,
}

#[derive(Clone)]
struct OpenEpoch {
    epoch: u32,
    begin_ticks: u64,
    gpu_begin: i64,
    gpu_max: i64,
    cpu_begin: u64,
}

struct RawEpoch {
    open: OpenEpoch,
    end_ticks: u64,
    gpu_end: i64,
    cpu_end: u64,
    cpu_peak: u64,
    complete: bool,
}

impl Timeline {
    fn new(t0: u64, points: usize) -> Timeline {
        Timeline {
            used: 0,
            acquired: 0,
            peak_used: 0,
            peak_used_ticks: 0,
            peak_acquired: 0,
            peak_acquired_ticks: 0,
            peak_ordinal: None,
            ordinal: 0,
            last_ticks: 0,
            mallocs: 0,
            frees: 0,
            allocs: 0,
            releases: 0,
            ooms: 0,
            open_epoch: None,
            epochs: Vec::new(),
            series: Downsampler::new(t0, points),
            blocks: FxHashMap::default(),
            live: HashMap::new(),
        }
    }

    #[inline]
    fn mem(&mut self, ticks: u64, e: &fb::MemEvent, units: &Units, track: bool) {
        self.last_ticks = ticks;
        match e.kind() {
            fb::MemKind::MallocPost if e.ptr() != 0 => {
                let size = units.mem_size(e.device(), e.bytes());
                self.mallocs += 1;
                self.used = self.used.saturating_add(signed(size));
                if track {
                    self.blocks.insert((e.device(), e.ptr()), (size, e.stack()));
                }
                if self.used > self.peak_used {
                    self.peak_used = self.used;
                    self.peak_used_ticks = ticks;
                    self.peak_ordinal = Some(self.ordinal);
                }
            }
            fb::MemKind::FreePost => {
                self.frees += 1;
                self.used = self.used.saturating_sub(signed(e.bytes()));
                if track {
                    self.blocks.remove(&(e.device(), e.ptr()));
                }
            }
            fb::MemKind::AllocPost if e.ptr() != 0 => {
                self.allocs += 1;
                self.acquired = self.acquired.saturating_add(signed(e.bytes()));
                if self.acquired > self.peak_acquired {
                    self.peak_acquired = self.acquired;
                    self.peak_acquired_ticks = ticks;
                }
            }
            fb::MemKind::Release => {
                self.releases += 1;
                self.acquired = self.acquired.saturating_sub(signed(e.bytes()));
            }
            fb::MemKind::OutOfMemory => self.ooms += 1,
            _ => {}
        }
        if let Some(ep) = &mut self.open_epoch {
            ep.gpu_max = ep.gpu_max.max(self.used);
        }
        self.series.add(ticks, self.used, self.acquired);
        self.ordinal += 1;
    }

    fn mark(&mut self, e: &fb::MarkEvent) {
        match e.kind() {
            fb::MarkKind::EpochBegin => {
                self.close_epoch(e.ticks(), None);
                self.open_epoch = Some(OpenEpoch {
                    epoch: e.aux(),
                    begin_ticks: e.ticks(),
                    gpu_begin: self.used,
                    gpu_max: self.used,
                    cpu_begin: e.a(),
                });
            }
            fb::MarkKind::EpochEnd => self.close_epoch(e.ticks(), Some((e.a(), e.b()))),
            _ => {}
        }
    }

    /// Closes the open epoch: at its end mark (`cpu` = bytes now, peak), or cut short.
    fn close_epoch(&mut self, ticks: u64, cpu: Option<(u64, u64)>) {
        if let Some(open) = self.open_epoch.take() {
            let (cpu_end, cpu_peak, complete) = match cpu {
                Some((now, peak)) => (now, peak, true),
                None => (open.cpu_begin, open.cpu_begin, false),
            };
            self.epochs.push(RawEpoch {
                end_ticks: ticks,
                gpu_end: self.used,
                cpu_end,
                cpu_peak,
                complete,
                open,
            });
        }
    }

    fn pool(&self, trace: &Trace) -> PoolFigures {
        PoolFigures {
            peak_used_bytes: self.peak_used.max(0) as u64,
            peak_used_ns: trace.ns_since_start(self.peak_used_ticks),
            peak_acquired_bytes: self.peak_acquired.max(0) as u64,
            peak_acquired_ns: trace.ns_since_start(self.peak_acquired_ticks),
            used_at_end_bytes: self.used,
            acquired_at_end_bytes: self.acquired,
            mallocs: self.mallocs,
            frees: self.frees,
            device_allocs: self.allocs,
            releases: self.releases,
            out_of_memory: self.ooms,
        }
    }

    fn epochs(&self, trace: &Trace, end_ticks: u64) -> Vec<EpochFigures> {
        let mut raw: Vec<&RawEpoch> = self.epochs.iter().collect();
        // An epoch the trace ended inside runs to the trace's end.
        let cut = self.open_epoch.as_ref().map(|open| RawEpoch {
            open: open.clone(),
            end_ticks: end_ticks.max(open.begin_ticks),
            gpu_end: self.used,
            cpu_end: open.cpu_begin,
            cpu_peak: open.cpu_begin,
            complete: false,
        });
        raw.extend(cut.as_ref());
        raw.iter()
            .map(|r| EpochFigures {
                epoch: r.open.epoch,
                begin_ns: trace.ns_since_start(r.open.begin_ticks),
                end_ns: trace.ns_since_start(r.end_ticks),
                complete: r.complete,
                gpu_begin_bytes: r.open.gpu_begin,
                gpu_end_bytes: r.gpu_end,
                gpu_max_bytes: r.open.gpu_max,
                cpu_begin_bytes: r.open.cpu_begin,
                cpu_end_bytes: r.cpu_end,
                cpu_peak_bytes: r.cpu_peak,
            })
            .collect()
    }

    fn series(&self, trace: &Trace) -> Series {
        let d = &self.series;
        let t0 = trace.header.ticks0;
        Series {
            bucket_ns: trace.ticks_to_ns(1u64 << d.shift.min(63)) as f64,
            points: d
                .buckets
                .iter()
                .enumerate()
                .filter_map(|(i, b)| {
                    b.map(|(u, a)| {
                        let ticks = t0.saturating_add((i as u64) << d.shift);
                        (trace.ns_since_start(ticks), u, a)
                    })
                })
                .collect(),
        }
    }
}

/// Max used and acquired bytes per time bucket; the bucket width doubles (buckets merge
/// pairwise) whenever time runs past the last one, so the count stays bounded without knowing
/// the trace's length in advance.
struct Downsampler {
    t0: u64,
    shift: u32,
    cap: usize,
    buckets: Vec<Option<(i64, i64)>>,
}

impl Downsampler {
    fn new(t0: u64, cap: usize) -> Downsampler {
        Downsampler {
            t0,
            shift: 10,
            cap,
            buckets: Vec::new(),
        }
    }

    #[inline]
    fn add(&mut self, ticks: u64, used: i64, acquired: i64) {
        if self.cap == 0 {
            return;
        }
        let mut i = (ticks.saturating_sub(self.t0) >> self.shift) as usize;
        while i >= self.cap {
            self.coarsen();
            i >>= 1;
        }
        if i >= self.buckets.len() {
            self.buckets.resize(i + 1, None);
        }
        let b = &mut self.buckets[i];
        *b = Some(match *b {
            Some((u, a)) => (u.max(used), a.max(acquired)),
            None => (used, acquired),
        });
    }

    fn coarsen(&mut self) {
        let merged = self
            .buckets
            .chunks(2)
            .map(|p| {
                p.iter()
                    .flatten()
                    .copied()
                    .reduce(|x, y| (x.0.max(y.0), x.1.max(y.1)))
            })
            .collect();
        self.buckets = merged;
        self.shift += 1;
    }
}

/// One thread's memory chunks, walked in order.
struct Stream<'a> {
    chunks: Vec<&'a ChunkInfo>,
    next_chunk: usize,
    events: &'a [fb::MemEvent],
    at: usize,
    base: u64,
    /// File offset of the chunk being read (`u64::MAX` once done), for page release.
    position: u64,
}

impl<'a> Stream<'a> {
    /// Ticks of the next event (rebases applied), or None at the end.
    #[inline]
    fn peek(&mut self, trace: &'a Trace, progress: Option<&AtomicU64>) -> Option<u64> {
        loop {
            while self.at < self.events.len() {
                let e = &self.events[self.at];
                if e.kind() == fb::MemKind::Rebase {
                    self.base = e.ptr();
                    self.at += 1;
                    continue;
                }
                return Some(self.base.wrapping_add(e.ts() as u64));
            }
            let done = self
                .next_chunk
                .checked_sub(1)
                .and_then(|c| self.chunks.get(c));
            if let (Some(p), Some(c)) = (progress, done) {
                p.fetch_add(c.len as u64, Ordering::Relaxed);
            }
            let Some(&c) = self.chunks.get(self.next_chunk) else {
                self.position = u64::MAX;
                self.events = &[];
                self.next_chunk = self.chunks.len() + 1;
                return None;
            };
            self.next_chunk += 1;
            self.events = trace.mem_events(c);
            self.at = 0;
            self.base = c.base_ticks;
            self.position = c.offset;
        }
    }
}

/// Walks memory events of all threads and the marks in time order. With `stop`, tracks live
/// blocks and stops after the memory event of that ordinal, leaving live bytes by stack.
///
/// The merge picks the thread whose next event is earliest and takes its events while they are
/// no later than any other thread's next event or the next mark. Threads are few, so a scan
/// of the heads beats a heap. Pages are given back behind the slowest thread, a window at a
/// time.
fn in_time_order(
    trace: &Trace,
    points: usize,
    stop: Option<u64>,
    progress: Option<&AtomicU64>,
) -> Timeline {
    let units = Units::of(trace);
    let mut tl = Timeline::new(trace.header.ticks0, points);
    let mut marks: Vec<&fb::MarkEvent> = trace
        .chunks
        .iter()
        .filter(|c| c.kind == ChunkKind::Mark)
        .flat_map(|c| trace.mark_events(c))
        .collect();
    // Stable: marks at one tick keep their recorded order.
    marks.sort_by_key(|m| m.ticks());
    let mut by_thread: Vec<(u32, Vec<&ChunkInfo>)> = Vec::new();
    for c in trace.chunks.iter().filter(|c| c.kind == ChunkKind::Mem) {
        match by_thread.iter_mut().find(|(t, _)| *t == c.thread) {
            Some((_, v)) => v.push(c),
            None => by_thread.push((c.thread, vec![c])),
        }
    }
    by_thread.sort_by_key(|(t, _)| *t);
    let mut streams: Vec<Stream> = by_thread
        .into_iter()
        .map(|(_, chunks)| Stream {
            chunks,
            next_chunk: 0,
            events: &[],
            at: 0,
            base: 0,
            position: 0,
        })
        .collect();
    let mut heads: Vec<Option<u64>> = streams
        .iter_mut()
        .map(|s| s.peek(trace, progress))
        .collect();
    let track = stop.is_some();
    let mut next_mark = 0;
    let mut released = 0u64;
    'outer: loop {
        let mut first: Option<(u64, usize)> = None;
        let mut second = u64::MAX;
        for (i, h) in heads.iter().enumerate() {
            let Some(t) = *h else { continue };
            match first {
                Some((ft, _)) if t >= ft => second = second.min(t),
                Some((ft, _)) => {
                    second = ft;
                    first = Some((t, i));
                }
                None => first = Some((t, i)),
            }
        }
        let Some((t, i)) = first else { break };
        while next_mark < marks.len() && marks[next_mark].ticks() < t {
            tl.mark(marks[next_mark]);
            next_mark += 1;
        }
        let bound = second.min(marks.get(next_mark).map_or(u64::MAX, |m| m.ticks()));
        let s = &mut streams[i];
        let chunk_before = s.next_chunk;
        loop {
            let Some(ticks) = s.peek(trace, progress) else {
                heads[i] = None;
                break;
            };
            if ticks > bound {
                heads[i] = Some(ticks);
                break;
            }
            let e = &s.events[s.at];
            s.at += 1;
            tl.mem(ticks, e, &units, track);
            if stop == Some(tl.ordinal - 1) {
                break 'outer;
            }
        }
        if s.next_chunk != chunk_before {
            let low = streams.iter().map(|s| s.position).min().unwrap_or(u64::MAX);
            if low != u64::MAX && low > released && low - released >= WINDOW {
                trace.release_span(released, low);
                released = low;
            }
        }
    }
    if stop.is_none() {
        for m in &marks[next_mark..] {
            tl.mark(m);
        }
    } else {
        for (size, stack) in tl.blocks.values() {
            let live = tl.live.entry(*stack).or_default();
            *live = live.saturating_add(*size);
        }
    }
    let end = trace.bytes().len() as u64;
    if released < end {
        trace.release_span(released, end);
    }
    tl
}
