//! The per-stack pass: parallel over chunks, each chunk folds its events into counters per
//! interned stack id; the counters merge by addition and minimum, so the result does not
//! depend on how rayon splits the work. The calling-context tree is then built from the
//! stacks that saw anything.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use poolsight_schema::fb;
use rayon::prelude::*;
use rustc_hash::FxHashMap;

use super::fold::Effect;
use super::profile::{Agg, CallTree, Frame, Raised};
use super::Units;
use crate::read::names::{FrameKind, Phase};
use crate::read::{ChunkInfo, ChunkKind, Trace};

/// Per-stack counters of part of a trace. Stack ids are dense (interned from 1), so the
/// first ones index a vector; ids past its end (a trace with very many stacks, or a damaged
/// one) go to a map, which keeps memory bounded by the stacks actually seen.
pub(super) struct PerStack {
    dense: Vec<Agg>,
    sparse: FxHashMap<u32, Agg>,
    pub(super) events: u64,
    pub(super) last_ticks: u64,
}

/// Most stacks held in a [`PerStack`]'s vector (each accumulator of the parallel fold has one).
const DENSE_STACKS: usize = 1 << 16;

impl PerStack {
    pub(super) fn new(stacks: usize) -> PerStack {
        PerStack {
            dense: vec![Agg::default(); (stacks + 1).min(DENSE_STACKS)],
            sparse: FxHashMap::default(),
            events: 0,
            last_ticks: 0,
        }
    }

    #[inline]
    fn slot(&mut self, stack: u32) -> &mut Agg {
        match self.dense.get_mut(stack as usize) {
            Some(a) => a,
            None => self.sparse.entry(stack).or_default(),
        }
    }

    pub(super) fn merge(mut self, other: PerStack) -> PerStack {
        for (a, b) in self.dense.iter_mut().zip(&other.dense) {
            a.add(b);
        }
        let held = self.dense.len();
        for (id, b) in other.dense.iter().enumerate().skip(held) {
            self.sparse.entry(id as u32).or_default().add(b);
        }
        for (k, v) in other.sparse {
            self.sparse.entry(k).or_default().add(&v);
        }
        self.events += other.events;
        self.last_ticks = self.last_ticks.max(other.last_ticks);
        self
    }

    /// The stacks that saw anything.
    pub(super) fn into_map(self) -> FxHashMap<u32, Agg> {
        let mut map = self.sparse;
        for (id, a) in self.dense.into_iter().enumerate() {
            if a.mallocs + a.allocs + a.calls > 0 {
                map.insert(id as u32, a);
            }
        }
        map
    }
}

/// Folds every chunk but, with `skip_packed_mem`, packed memory chunks (the time-ordered
/// pass folds those as it decodes them, so each is decoded once).
pub(super) fn per_stack(
    trace: &Trace,
    skip_packed_mem: bool,
    progress: Option<&AtomicU64>,
) -> PerStack {
    let units = Units::of(trace);
    let stacks = trace.defs.stacks.len();
    trace
        .windows(trace.chunks.iter())
        .par_iter()
        .fold(
            || PerStack::new(stacks),
            |mut acc, window| {
                for c in window {
                    fold_other(trace, c, &mut acc, progress);
                    if c.kind == ChunkKind::Mem && !(skip_packed_mem && c.packed) {
                        fold_mem(&trace.mem_events(c), c.base_ticks, &units, &mut acc);
                    }
                }
                trace.release_window(window);
                acc
            },
        )
        .reduce(|| PerStack::new(stacks), PerStack::merge)
}

/// Everything of a chunk but its memory events (which [`fold_mem`] folds): checks its
/// deferred checksum, folds scopes by stack, counts marks (definitions and footers hold no
/// events), and counts its bytes done.
pub(super) fn fold_other(
    trace: &Trace,
    c: &ChunkInfo,
    acc: &mut PerStack,
    progress: Option<&AtomicU64>,
) {
    trace.check_deferred(c);
    match c.kind {
        ChunkKind::Scope => fold_scopes(trace, c, acc),
        ChunkKind::Mark => {
            // Marks count in the trace's duration too, as `info` counts them: a run that
            // ends with its last epoch mark lasted until it.
            let marks = trace.mark_events(c);
            acc.events += marks.len() as u64;
            let last = marks.iter().map(|m| m.ticks()).max().unwrap_or(0);
            acc.last_ticks = acc.last_ticks.max(last);
        }
        ChunkKind::Mem | ChunkKind::Defs | ChunkKind::Footer => {}
    }
    if let Some(p) = progress {
        p.fetch_add(c.len as u64, Ordering::Relaxed);
    }
}

/// Folds one chunk's memory events, which count from `base_ticks`.
pub(super) fn fold_mem(
    events_in: &[fb::MemEvent],
    base_ticks: u64,
    units: &Units,
    acc: &mut PerStack,
) {
    let mut base = base_ticks;
    let mut events = 0u64;
    let mut last_ticks = 0;
    for e in events_in {
        if e.kind() == fb::MemKind::Rebase {
            base = e.ptr();
            continue;
        }
        events += 1;
        let ticks = base.wrapping_add(e.ts() as u64);
        last_ticks = ticks;
        fold_mem_in_stack(ticks, e, units, acc);
    }
    acc.events += events;
    acc.last_ticks = acc.last_ticks.max(last_ticks);
}

/// Folds one memory event (not a rebase) at `ticks` into its stack's counters ([`fold_mem`]
/// counts it in [`PerStack::events`] and [`PerStack::last_ticks`]). Counted at the post event,
/// which carries the request as the pre event did, plus its answer; every request counts, failed
/// ones included, as Chainer's and CuPy's pre hooks count it. A relabelled block stays counted
/// where it was made: these are cumulative figures.
#[inline]
fn fold_mem_in_stack(ticks: u64, e: &fb::MemEvent, units: &Units, acc: &mut PerStack) {
    let effect = Effect::of(e, units);
    if counted(effect) {
        fold_effect(ticks, effect, acc.slot(e.stack()));
    }
}

/// Whether a stack's counters take anything of an event that did `effect`.
#[inline]
fn counted(effect: Effect) -> bool {
    matches!(
        effect,
        Effect::Malloc { .. }
            | Effect::FailedMalloc { .. }
            | Effect::Acquire { .. }
            | Effect::FailedAcquire { .. }
    )
}

/// Folds one memory event into `a`: what a stack's counters take of it.
#[inline]
pub(super) fn fold_mem_event(ticks: u64, e: &fb::MemEvent, units: &Units, a: &mut Agg) {
    fold_effect(ticks, Effect::of(e, units), a);
}

#[inline]
fn fold_effect(ticks: u64, effect: Effect, a: &mut Agg) {
    let (size, failed) = match effect {
        Effect::Malloc { size } => (size, false),
        Effect::FailedMalloc { size } => (size, true),
        Effect::Acquire { bytes } | Effect::FailedAcquire { bytes } => {
            a.allocs += 1;
            a.acquired_bytes = a.acquired_bytes.saturating_add(bytes);
            if matches!(effect, Effect::FailedAcquire { .. }) {
                a.failed_acquired_bytes = a.failed_acquired_bytes.saturating_add(bytes);
            }
            a.first_mem = a.first_mem.min((0, ticks));
            return;
        }
        _ => return,
    };
    a.mallocs += 1;
    a.used_bytes = a.used_bytes.saturating_add(size);
    if failed {
        a.failed_mallocs += 1;
        a.failed_used_bytes = a.failed_used_bytes.saturating_add(size);
    }
    a.first_mem = a.first_mem.min((0, ticks));
}

fn fold_scopes(trace: &Trace, c: &ChunkInfo, acc: &mut PerStack) {
    let mut last_ticks = 0;
    for (ticks, e) in trace.scope_timeline(c) {
        acc.events += 1;
        last_ticks = ticks;
        let a = acc.slot(e.stack());
        a.calls += 1;
        a.time_ns = a.time_ns.saturating_add(e.duration());
        a.first_exit = a.first_exit.min((0, ticks));
    }
    acc.last_ticks = acc.last_ticks.max(last_ticks);
}

pub(super) fn frame_of(trace: &Trace, frame_id: u32) -> Frame {
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

pub(super) fn build_tree(
    trace: &Trace,
    index: u32,
    aggs: &FxHashMap<u32, Agg>,
    live: &HashMap<u32, u64>,
    raised: &FxHashMap<u32, Raised>,
) -> CallTree {
    let mut tree = CallTree::default();
    let mut node_of: HashMap<u32, usize> = HashMap::new();
    node_of.insert(0, 0);
    // Sorted ids make the tree's construction order, hence its output, deterministic.
    let mut ids: Vec<u32> = aggs
        .keys()
        .chain(live.keys())
        .chain(raised.keys())
        .copied()
        .collect();
    ids.sort_unstable();
    ids.dedup();
    for id in ids {
        let node = node_for(trace, &mut tree, &mut node_of, id);
        let a = aggs.get(&id).copied().unwrap_or_default();
        tree.nodes[node].agg.add(&Agg {
            live_at_peak_bytes: live.get(&id).copied().unwrap_or(0),
            raised: raised.get(&id).copied().unwrap_or_default(),
            ..a.in_ns(trace, index)
        });
    }
    tree.finish();
    tree
}

/// The tree node of an interned stack, created with its ancestors where missing. Interned
/// stacks name a parent with a smaller id (it was interned first), so following parents ends;
/// a damaged trace whose stack names a parent at or above itself is cut there. No depth is too
/// deep: the chain is a list, and every walk over the tree is a loop.
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
    loop {
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

/// The frames of an interned stack, outermost first.
pub(super) fn frames_of_stack(trace: &Trace, id: u32) -> Vec<Frame> {
    let mut tree = CallTree::default();
    let mut node_of = HashMap::from([(0, 0)]);
    let node = node_for(trace, &mut tree, &mut node_of, id);
    tree.path(node).into_iter().cloned().collect()
}
