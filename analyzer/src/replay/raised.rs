//! Calls that raised: a scope closed by an exception is recorded as a `ScopeAbort` mark (its
//! stack, its open and close ticks, on the thread that opened it) instead of a scope event, so
//! it is never counted as a call. What it allocated meanwhile carries its frame in the stacks,
//! as the call's frames were on the call stack; this pass measures it, per raising scope, so
//! that the functions table can leave it out of that function's row (Chainer's hook never sees
//! such a call return) while the enclosing calls keep it (their begin/end deltas include it).
//!
//! Raising calls are rare: the pass reads the marks, and then only the memory chunks of the
//! threads and stretches of time where a call raised.

use rustc_hash::FxHashMap;

use super::profile::{Agg, Raised};
use super::stacks::fold_mem_event;
use super::Units;
use crate::read::names::FrameKind;
use crate::read::{ChunkInfo, ChunkKind, Trace};
use poolsight_schema::fb;

/// One raising call: the thread that ran it, its scope's stack, and when it opened and closed.
#[derive(Debug, Clone, Copy)]
struct Abort {
    thread: u32,
    stack: u32,
    open: u64,
    close: u64,
}

/// What the raising calls of each scope stack allocated while they ran (see the module doc),
/// keyed by that stack; empty when no call raised.
pub(super) fn raised(trace: &Trace) -> FxHashMap<u32, Raised> {
    let mut aborts: Vec<Abort> = trace
        .chunks
        .iter()
        .filter(|c| c.kind == ChunkKind::Mark)
        .flat_map(|c| {
            trace
                .mark_events(c)
                .iter()
                .filter(|m| m.kind() == fb::MarkKind::ScopeAbort && m.aux() != 0)
                .map(|m| Abort {
                    thread: c.thread,
                    stack: m.aux(),
                    open: m.a(),
                    close: m.ticks(),
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let mut out: FxHashMap<u32, Raised> = FxHashMap::default();
    if aborts.is_empty() {
        return out;
    }
    aborts.sort_by_key(|a| (a.thread, a.open));
    let units = Units::of(trace);
    let mut under = Under::default();
    for a in &aborts {
        let mut total = Agg::default();
        let mut own = Agg::default();
        for c in chunks_during(trace, a) {
            for (ticks, e) in trace.mem_timeline(c) {
                if ticks < a.open || ticks > a.close {
                    continue;
                }
                match under.of(trace, e.stack(), a.stack) {
                    Place::Outside => {}
                    Place::Inside => fold_mem_event(ticks, &e, &units, &mut total),
                    Place::Own => {
                        fold_mem_event(ticks, &e, &units, &mut total);
                        fold_mem_event(ticks, &e, &units, &mut own);
                    }
                }
            }
        }
        let r = out.entry(a.stack).or_default();
        r.calls += 1;
        r.used_bytes = r.used_bytes.saturating_add(total.used_bytes);
        r.acquired_bytes = r.acquired_bytes.saturating_add(total.acquired_bytes);
        r.failed_used_bytes = r.failed_used_bytes.saturating_add(total.failed_used_bytes);
        r.failed_acquired_bytes = r
            .failed_acquired_bytes
            .saturating_add(total.failed_acquired_bytes);
        r.self_used_bytes = r.self_used_bytes.saturating_add(own.used_bytes);
        r.self_acquired_bytes = r.self_acquired_bytes.saturating_add(own.acquired_bytes);
    }
    out
}

/// The memory chunks of `a`'s thread that may hold events between its open and close: a
/// thread's chunks are in time order, each starting at its base ticks.
fn chunks_during<'t>(trace: &'t Trace, a: &Abort) -> Vec<&'t ChunkInfo> {
    let mine: Vec<&ChunkInfo> = trace
        .chunks
        .iter()
        .filter(|c| c.kind == ChunkKind::Mem && c.thread == a.thread)
        .collect();
    mine.iter()
        .enumerate()
        .filter(|&(i, c)| {
            let next = mine.get(i + 1).map_or(u64::MAX, |n| n.base_ticks);
            c.base_ticks <= a.close && next >= a.open
        })
        .map(|(_, c)| *c)
        .collect()
}

/// Where an allocation's stack lies relative to a raising scope's stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// Not inside the scope.
    Outside,
    /// Inside, under a function called by it.
    Inside,
    /// Inside, with no function between the scope and the allocation: its exclusive bytes.
    Own,
}

/// Answers [`Place`] per (allocation stack, scope stack), remembered.
#[derive(Default)]
struct Under {
    known: FxHashMap<(u32, u32), Place>,
}

/// Longer chains are only in a damaged trace (real stacks are interned parent first).
const MAX_DEPTH: usize = 4096;

impl Under {
    fn of(&mut self, trace: &Trace, stack: u32, scope: u32) -> Place {
        if let Some(&p) = self.known.get(&(stack, scope)) {
            return p;
        }
        let mut place = Place::Outside;
        let mut function_between = false;
        let mut cur = stack;
        for _ in 0..MAX_DEPTH {
            if cur == scope {
                place = if function_between {
                    Place::Inside
                } else {
                    Place::Own
                };
                break;
            }
            let Some(&(parent, frame)) = trace.defs.stacks.get(&cur) else {
                break;
            };
            let kind = trace
                .defs
                .frames
                .get(&frame)
                .map(|f| FrameKind::from(f.kind));
            function_between |= kind == Some(FrameKind::Function);
            // Parents are interned first: a parent id at or above the child's is damage.
            if parent >= cur || parent < scope {
                break;
            }
            cur = parent;
        }
        self.known.insert((stack, scope), place);
        place
    }
}
