//! The one replay pass, parallel over windows of time. The time-ordered figures need every
//! thread's memory events merged by timestamp; here the merge is cut at instants `T` into
//! windows that are merged at once, each from where every thread's first event at or after
//! its `T` lies, and combined in order ([`Timeline::from_windows`]). Each window also folds the
//! events it merges by stack, and the scope and mark chunks it owns, so every chunk is read
//! once, by one core, while its pages are hot.
//!
//! Why the windows' merges add up to the one merge: with each thread's events in time order,
//! the one merge takes every event before `T` before any event at or after it, and from there
//! it picks as a merge started afresh would, provided no two threads' first events at or after
//! `T` tie (a cut where they do moves past the tie). Each window checks the premise as it
//! goes: every event inside its time, no thread going back in time. A trace where that fails
//! (a damaged one, a clock that jumped back), or whose byte counts would saturate, is replayed
//! by the one merge instead ([`super::replay`] falls back), so the figures never depend on
//! how the work was split.

use std::sync::atomic::AtomicU64;

use poolsight_schema::fb;
use rayon::prelude::*;

use super::fold::several_devices;
use super::merge::{mem_chunks_by_thread, merge_streams, sorted_marks, Cursor, Sink, Stream};
use super::stacks::{fold_mem, fold_other, PerStack};
use super::timeline::Timeline;
use super::window_fold::{series_shift, WindowFold};
use super::Units;
use crate::read::{ChunkInfo, ChunkKind, Trace};

/// Memory events per window, about: many windows per core on a large trace, few enough that
/// a window's fixed costs (finding its cut, combining its figures) are small.
pub(super) const WINDOW_EVENTS: u64 = 1 << 18;

/// Tries at moving a cut past ties before it is dropped.
const TIE_TRIES: usize = 8;

/// Chunks past the first candidate a cut looks through for its event (more are only in a
/// damaged trace).
const SEEK_CHUNKS: usize = 4;

/// Where a window starts: the instant, each thread's first event at or after it, and the
/// first index into the trace's chunks whose scope and mark chunks the window owns.
struct Cut {
    ticks: u64,
    at: Vec<Cursor>,
    owner: usize,
}

/// The time-ordered figures and the per-stack counters of the whole trace, or `None` where
/// the windows could not stand for the one merge (see the module's text).
pub(super) fn replay(
    trace: &Trace,
    points: usize,
    progress: Option<&AtomicU64>,
    window_events: u64,
) -> Option<(Timeline, PerStack)> {
    let by_thread = mem_chunks_by_thread(trace);
    let threads: Vec<&[&ChunkInfo]> = by_thread.iter().map(|(_, c)| c.as_slice()).collect();
    let units = Units::of(trace);
    let marks = sorted_marks(trace);
    let t0 = trace.header.ticks0;
    let last = threads.iter().filter_map(|c| last_ticks(trace, c)).max();
    let shift = series_shift(t0, last.unwrap_or(t0), points);
    let cuts = cuts(trace, &threads, window_events);
    let stacks = trace.defs.stacks.len();
    let n = cuts.len() + 1;
    let (mut folds, per_stack) = (0..n)
        .into_par_iter()
        .fold(
            || (Vec::new(), PerStack::new(stacks)),
            |(mut folds, mut acc), k| {
                let w = Window {
                    trace,
                    threads: &threads,
                    start: k.checked_sub(1).map(|i| &cuts[i]),
                    end: cuts.get(k),
                };
                let fold = w.run(&marks, &units, t0, shift, &mut acc, progress);
                folds.push((k, fold));
                (folds, acc)
            },
        )
        .reduce(
            || (Vec::new(), PerStack::new(stacks)),
            |(mut a, sa), (b, sb)| {
                a.extend(b);
                (a, sa.merge(sb))
            },
        );
    folds.sort_unstable_by_key(|(k, _)| *k);
    let timeline = Timeline::from_windows(t0, points, shift, folds.into_iter().map(|(_, f)| f))?;
    Some((timeline, per_stack))
}

/// The ticks of a thread's last memory event.
fn last_ticks(trace: &Trace, chunks: &[&ChunkInfo]) -> Option<u64> {
    chunks
        .iter()
        .rev()
        .find_map(|c| trace.mem_timeline(c).last().map(|(ticks, _)| ticks))
}

/// The cuts between windows, in time order: at the start of a memory chunk every
/// `window_events` memory events (chunks in the order they were reserved, which follows time),
/// each moved past ties; cuts that could not be placed are dropped.
fn cuts(trace: &Trace, threads: &[&[&ChunkInfo]], window_events: u64) -> Vec<Cut> {
    let mut candidates = Vec::new();
    let mut since = 0u64;
    for (i, c) in trace.chunks.iter().enumerate() {
        if c.kind != ChunkKind::Mem {
            continue;
        }
        if since >= window_events {
            candidates.push((i, c.base_ticks));
            since = 0;
        }
        since += c.events as u64;
    }
    let placed: Vec<Option<Cut>> = candidates
        .par_iter()
        .map(|&(owner, ticks)| place(trace, threads, ticks, owner))
        .collect();
    let mut cuts: Vec<Cut> = Vec::with_capacity(placed.len());
    for cut in placed.into_iter().flatten() {
        let after = cuts.last().map_or(0, |c| c.ticks);
        if cut.ticks > after {
            cuts.push(cut);
        }
    }
    cuts
}

/// A cut at `ticks` or, where threads' first events after it tie, a little later.
fn place(trace: &Trace, threads: &[&[&ChunkInfo]], ticks: u64, owner: usize) -> Option<Cut> {
    let mut touched = (u64::MAX, 0u64);
    let cut = place_at(trace, threads, ticks, owner, &mut touched);
    // Cuts are placed before any window runs: what a read mapped (a fault can map a whole
    // huge page of the file) goes back now, or every cut would keep its share. Once per cut:
    // each release costs the other cores a TLB flush.
    if touched.0 < touched.1 {
        let huge = 2 << 20;
        trace.release_span(touched.0 / huge * huge, touched.1.div_ceil(huge) * huge);
    }
    cut
}

/// [`place`], widening `touched` to the bytes of every chunk it read.
fn place_at(
    trace: &Trace,
    threads: &[&[&ChunkInfo]],
    ticks: u64,
    owner: usize,
    touched: &mut (u64, u64),
) -> Option<Cut> {
    let mut ticks = ticks;
    for _ in 0..TIE_TRIES {
        let mut at = Vec::with_capacity(threads.len());
        let mut heads = Vec::with_capacity(threads.len());
        for chunks in threads {
            let (cursor, head) = seek(trace, chunks, ticks, touched)?;
            at.push(cursor);
            heads.push(head);
        }
        let Some(first) = heads.iter().flatten().min().copied() else {
            return Some(Cut { ticks, at, owner });
        };
        if heads.iter().filter(|h| **h == Some(first)).count() == 1 {
            return Some(Cut { ticks, at, owner });
        }
        ticks = first.checked_add(1)?;
    }
    None
}

/// A thread's first memory event at or after `ticks`: where it is and its ticks (none: the
/// end). Chunks start at the ticks of their first event, so it lies in the last chunk that
/// starts earlier or in the next one with events. `touched` widens to the chunks read.
fn seek(
    trace: &Trace,
    chunks: &[&ChunkInfo],
    ticks: u64,
    touched: &mut (u64, u64),
) -> Option<(Cursor, Option<u64>)> {
    let from = chunks
        .partition_point(|c| c.base_ticks < ticks)
        .saturating_sub(1);
    for (i, c) in chunks.iter().enumerate().skip(from).take(SEEK_CHUNKS + 1) {
        let mut base = c.base_ticks;
        let mut found = None;
        for (at, e) in trace.mem_events(c).iter().enumerate() {
            if e.kind() == fb::MemKind::Rebase {
                base = e.ptr();
                continue;
            }
            let t = base.wrapping_add(e.ts() as u64);
            if t >= ticks {
                found = Some((Cursor { chunk: i, at, base }, Some(t)));
                break;
            }
        }
        touched.0 = touched.0.min(c.offset);
        touched.1 = touched.1.max(c.offset + c.len as u64);
        if found.is_some() {
            return found;
        }
    }
    let end = Cursor {
        chunk: chunks.len(),
        at: 0,
        base: 0,
    };
    (from + SEEK_CHUNKS + 1 >= chunks.len()).then_some((end, None))
}

/// One window: from its start cut (none: the trace's start) to its end cut (none: the end).
struct Window<'a, 't> {
    trace: &'t Trace,
    threads: &'a [&'t [&'t ChunkInfo]],
    start: Option<&'a Cut>,
    end: Option<&'a Cut>,
}

impl<'t> Window<'_, 't> {
    fn run(
        &self,
        marks: &[fb::MarkEvent],
        units: &Units,
        t0: u64,
        shift: Option<u32>,
        acc: &mut PerStack,
        progress: Option<&AtomicU64>,
    ) -> WindowFold {
        let trace = self.trace;
        let lo = self.start.map_or(0, |c| c.ticks);
        let hi = self.end.map_or(u64::MAX, |c| c.ticks - 1);
        let mut ranges = Vec::with_capacity(self.threads.len());
        let mut streams: Vec<Stream<'t>> = self
            .threads
            .iter()
            .enumerate()
            .map(|(t, &chunks)| {
                let from = self.start.map_or(
                    Cursor {
                        chunk: 0,
                        at: 0,
                        base: chunks.first().map_or(0, |c| c.base_ticks),
                    },
                    |c| c.at[t],
                );
                let end = self
                    .end
                    .map_or((chunks.len(), 0), |c| (c.at[t].chunk, c.at[t].at));
                ranges.push((from.chunk, end.0));
                Stream::new(chunks, from, end, None)
            })
            .collect();
        let first = marks.partition_point(|m| m.ticks() < lo);
        let past = marks.partition_point(|m| m.ticks() <= hi);
        let mine = &marks[first..past.max(first)];
        let mut fold = WindowFold::new(hi, t0, shift);
        fold.ledger.devices.on = several_devices(trace);
        let mut sink = WindowSink {
            trace,
            fold: &mut fold,
            stacks: acc,
            units,
        };
        let fed = merge_streams(trace, &mut streams, mine, &mut sink, progress, false);
        for m in &mine[fed..] {
            sink.fold.mark(m);
        }
        for s in &streams {
            fold.check(s);
        }
        let owned =
            self.start.map_or(0, |c| c.owner)..self.end.map_or(trace.chunks.len(), |c| c.owner);
        let mut done: Vec<&ChunkInfo> = Vec::new();
        for c in trace.chunks[owned]
            .iter()
            .filter(|c| c.kind != ChunkKind::Mem)
        {
            fold_other(trace, c, acc, progress);
            done.push(c);
        }
        // The memory chunks whose last event was merged here.
        for (chunks, (from, to)) in self.threads.iter().zip(ranges) {
            done.extend(chunks.get(from..to).unwrap_or_default());
        }
        trace.release_chunks(done.into_iter());
        fold
    }
}

struct WindowSink<'a> {
    trace: &'a Trace,
    fold: &'a mut WindowFold,
    stacks: &'a mut PerStack,
    units: &'a Units,
}

impl Sink for WindowSink<'_> {
    #[inline]
    fn mem(&mut self, ticks: u64, e: &fb::MemEvent) -> bool {
        self.fold.mem(ticks, e, self.units);
        true
    }

    /// A chunk is checked (a deferred checksum) and folded by stack whole, as it is read, by
    /// the window holding its first event: one read of its bytes from memory, and the merge
    /// then finds them in the cache.
    fn load(&mut self, c: &ChunkInfo, events: &[fb::MemEvent], whole: bool) {
        if whole {
            self.trace.check_deferred(c);
            fold_mem(events, c.base_ticks, self.units, self.stacks);
        }
    }

    fn mark(&mut self, m: &fb::MarkEvent) {
        self.fold.mark(m)
    }
}
