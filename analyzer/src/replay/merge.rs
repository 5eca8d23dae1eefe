//! The merge of the threads' memory events by timestamp, with the marks in between: each
//! thread's chunks walked as a stream from a cursor, the earliest stream's events taken while
//! no other is earlier, pages given back behind the slowest stream.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};

use poolsight_schema::fb;

use super::stacks::{fold_mem, PerStack};
use super::Units;
use crate::read::{ChunkInfo, ChunkKind, Events, Trace, WINDOW};

/// Where a thread's walk stands: the chunk (an index into the thread's chunks), the event in
/// it, and the base ticks in effect there (rebases before `at` applied).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Cursor {
    pub(super) chunk: usize,
    pub(super) at: usize,
    pub(super) base: u64,
}

/// One thread's memory chunks, walked in order from a [`Cursor`] to an end (chunk, event).
pub(super) struct Stream<'a> {
    chunks: &'a [&'a ChunkInfo],
    /// Index of the chunk whose events are in `events`.
    cur: usize,
    events: Events<'a, fb::MemEvent>,
    at: usize,
    base: u64,
    /// Where the walk stops: (chunk, event); `(chunks.len(), 0)` walks to the end.
    end: (usize, usize),
    /// The chunk `cur` is still to be read (the walk has not started).
    unread: bool,
    /// Ticks of the last event taken, and whether an event was taken earlier than the one
    /// before it (only in a damaged trace or after a clock jumped back).
    pub(super) last: u64,
    pub(super) went_back: bool,
    /// File offset of the chunk being read (`u64::MAX` once done), for page release.
    position: u64,
    /// For a packed trace: this thread's chunks, decoded in order by a thread of their own.
    feed: Option<Receiver<Events<'a, fb::MemEvent>>>,
}

impl<'a> Stream<'a> {
    /// A walk from `from` to `end` (see [`Stream::end`]); with `feed`, chunks come from it in
    /// order instead of being read here.
    pub(super) fn new(
        chunks: &'a [&'a ChunkInfo],
        from: Cursor,
        end: (usize, usize),
        feed: Option<Receiver<Events<'a, fb::MemEvent>>>,
    ) -> Stream<'a> {
        Stream {
            chunks,
            cur: from.chunk,
            events: Events::default(),
            at: from.at,
            base: from.base,
            end,
            unread: (from.chunk, from.at) < end && from.chunk < chunks.len(),
            last: 0,
            went_back: false,
            position: chunks.get(from.chunk).map_or(u64::MAX, |c| c.offset),
            feed,
        }
    }

    /// Reads chunk `cur` and tells the sink (whole: the walk starts at its first event).
    fn load<S: Sink>(&mut self, trace: &'a Trace, sink: &mut S) {
        let c = self.chunks[self.cur];
        self.events = match &self.feed {
            Some(rx) => rx.recv().unwrap_or_default(),
            None => trace.mem_events(c),
        };
        self.position = c.offset;
        sink.load(c, &self.events, self.at == 0);
    }

    /// Ticks of the next event (rebases applied), or None at the end.
    #[inline]
    pub(super) fn peek<S: Sink>(
        &mut self,
        trace: &'a Trace,
        sink: &mut S,
        progress: Option<&AtomicU64>,
    ) -> Option<u64> {
        if self.unread {
            self.unread = false;
            self.load(trace, sink);
        }
        loop {
            let limit = self.limit();
            while self.at < limit {
                let e = &self.events[self.at];
                if e.kind() == fb::MemKind::Rebase {
                    self.base = e.ptr();
                    self.at += 1;
                    continue;
                }
                return Some(self.base.wrapping_add(e.ts() as u64));
            }
            if self.cur >= self.end.0 || self.cur >= self.chunks.len() {
                return self.finish();
            }
            // The chunk is done: its last event was taken here.
            if let Some(p) = progress {
                p.fetch_add(self.chunks[self.cur].len as u64, Ordering::Relaxed);
            }
            self.cur += 1;
            let Some(&c) = self.chunks.get(self.cur) else {
                return self.finish();
            };
            if self.end == (self.cur, 0) {
                return self.finish();
            }
            self.at = 0;
            self.base = c.base_ticks;
            self.load(trace, sink);
        }
    }

    /// How many of the chunk in hand's events the walk takes at most.
    fn limit(&self) -> usize {
        if self.cur == self.end.0 {
            self.end.1.min(self.events.len())
        } else {
            self.events.len()
        }
    }

    fn finish(&mut self) -> Option<u64> {
        self.position = u64::MAX;
        self.events = Events::default();
        None
    }

    /// Feeds `sink` this stream's events while their ticks are at most `bound`, as far as the
    /// chunk in hand goes (the stream was peeked, so one is).
    #[inline]
    fn run<S: Sink>(&mut self, bound: u64, sink: &mut S) -> Run {
        let events = &self.events[..self.limit()];
        let (mut at, mut base, mut last) = (self.at, self.base, self.last);
        let mut went_back = false;
        let mut out = Run::Exhausted;
        while at < events.len() {
            let e = &events[at];
            if e.kind() == fb::MemKind::Rebase {
                base = e.ptr();
                at += 1;
                continue;
            }
            let ticks = base.wrapping_add(e.ts() as u64);
            if ticks > bound {
                out = Run::Past(ticks);
                break;
            }
            went_back |= ticks < last;
            last = ticks;
            at += 1;
            if !sink.mem(ticks, e) {
                out = Run::Stopped;
                break;
            }
        }
        self.at = at;
        self.base = base;
        self.last = last;
        self.went_back |= went_back;
        out
    }
}

/// How [`Stream::run`] ended.
enum Run {
    /// At an event later than the bound: its ticks.
    Past(u64),
    /// At the end of the chunk in hand.
    Exhausted,
    /// The sink asked to stop.
    Stopped,
}

/// What a merge feeds the memory events (in merge order) and the marks to.
pub(super) trait Sink {
    /// One memory event; false stops the merge.
    fn mem(&mut self, ticks: u64, e: &fb::MemEvent) -> bool;
    fn mark(&mut self, m: &fb::MarkEvent);
    /// A chunk was read (`whole`: the walk takes it from its first event).
    fn load(&mut self, _c: &ChunkInfo, _events: &[fb::MemEvent], _whole: bool) {}
}

/// The merge: picks the stream whose next event is earliest (the first of equals) and takes
/// its events while they are no later than any other stream's next event or the next mark;
/// a mark goes before the first event later than it. Threads are few, so a scan of the heads
/// beats a heap. Returns how many of `marks` were fed (the rest are later than every event,
/// or the sink stopped). With `release`, pages are given back behind the slowest stream, a
/// window at a time.
pub(super) fn merge_streams<'a, S: Sink>(
    trace: &'a Trace,
    streams: &mut [Stream<'a>],
    marks: &[fb::MarkEvent],
    sink: &mut S,
    progress: Option<&AtomicU64>,
    release: bool,
) -> usize {
    let mut heads: Vec<Option<u64>> = streams
        .iter_mut()
        .map(|s| s.peek(trace, sink, progress))
        .collect();
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
            sink.mark(&marks[next_mark]);
            next_mark += 1;
        }
        let bound = second.min(marks.get(next_mark).map_or(u64::MAX, |m| m.ticks()));
        let s = &mut streams[i];
        let chunk_before = s.cur;
        loop {
            match s.run(bound, sink) {
                Run::Past(ticks) => {
                    heads[i] = Some(ticks);
                    break;
                }
                Run::Stopped => break 'outer,
                Run::Exhausted => match s.peek(trace, sink, progress) {
                    Some(ticks) if ticks <= bound => {}
                    head => {
                        heads[i] = head;
                        break;
                    }
                },
            }
        }
        if release && s.cur != chunk_before {
            let low = streams.iter().map(|s| s.position).min().unwrap_or(u64::MAX);
            if low != u64::MAX && low > released && low - released >= WINDOW {
                trace.release_span(released, low);
                released = low;
            }
        }
    }
    if release {
        let end = trace.bytes().len() as u64;
        if released < end {
            trace.release_span(released, end);
        }
    }
    next_mark
}

pub(super) fn sorted_marks(trace: &Trace) -> Vec<fb::MarkEvent> {
    let mut marks: Vec<fb::MarkEvent> = trace
        .chunks
        .iter()
        .filter(|c| c.kind == ChunkKind::Mark)
        .flat_map(|c| trace.mark_events(c))
        .collect();
    marks.sort_by_key(|m| m.ticks());
    marks
}

/// Chunks decoded ahead of the merge, per thread: enough to keep the merge busy, few enough
/// that memory stays a few MB.
const DECODED_AHEAD: usize = 4;

/// Feeds `sink` every memory event of `trace` in merge order, with `marks` (the trace's,
/// sorted) in between; returns how many marks were fed (see [`merge_streams`]). In a packed
/// trace each thread's memory chunks are decoded ahead on a thread of their own (the merge
/// itself stays on one thread), and with `fold` those threads also fold the decoded events by
/// stack into the returned [`PerStack`].
pub(super) fn walk_decoding<S: Sink>(
    trace: &Trace,
    marks: &[fb::MarkEvent],
    sink: &mut S,
    fold: bool,
    progress: Option<&AtomicU64>,
) -> (usize, PerStack) {
    let by_thread = mem_chunks_by_thread(trace);
    if !by_thread.iter().flat_map(|(_, cs)| cs).any(|c| c.packed) {
        let mut streams = streams_from_start(&by_thread, Vec::new());
        let fed = merge_streams(trace, &mut streams, marks, sink, progress, true);
        return (fed, PerStack::new(0));
    }
    let units = Units::of(trace);
    let stacks = trace.defs.stacks.len();
    std::thread::scope(|s| {
        let mut feeds = Vec::new();
        let mut producers = Vec::new();
        for (_, chunks) in &by_thread {
            let (tx, rx) = sync_channel(DECODED_AHEAD);
            feeds.push(rx);
            let units = &units;
            producers.push(s.spawn(move || {
                let mut acc = PerStack::new(if fold { stacks } else { 0 });
                for c in chunks {
                    let events = trace.mem_events(c);
                    if fold {
                        fold_mem(&events, c.base_ticks, units, &mut acc);
                    }
                    // The merge hangs up when it stops early: nothing more is needed.
                    if tx.send(events).is_err() {
                        break;
                    }
                }
                acc
            }));
        }
        let mut streams = streams_from_start(&by_thread, feeds);
        let fed = merge_streams(trace, &mut streams, marks, sink, progress, true);
        // The streams hold the receivers: dropping them lets producers blocked on a full
        // channel see the hang-up.
        drop(streams);
        let acc = producers.into_iter().filter_map(|p| p.join().ok()).fold(
            PerStack::new(if fold { stacks } else { 0 }),
            PerStack::merge,
        );
        (fed, acc)
    })
}

pub(super) fn mem_chunks_by_thread(trace: &Trace) -> Vec<(u32, Vec<&ChunkInfo>)> {
    let mut by_thread: Vec<(u32, Vec<&ChunkInfo>)> = Vec::new();
    for c in trace.chunks.iter().filter(|c| c.kind == ChunkKind::Mem) {
        match by_thread.iter_mut().find(|(t, _)| *t == c.thread) {
            Some((_, v)) => v.push(c),
            None => by_thread.push((c.thread, vec![c])),
        }
    }
    by_thread.sort_by_key(|(t, _)| *t);
    by_thread
}

/// Feeds `sink` every memory event of `trace` in the merge order of the replay's time-ordered
/// pass (the same events, marks and ties, so merge ordinals match the replay's), and the marks
/// earlier than the last of them.
pub(super) fn walk<S: Sink>(trace: &Trace, sink: &mut S, progress: Option<&AtomicU64>) {
    walk_decoding(trace, &sorted_marks(trace), sink, false, progress);
}

/// A stream per thread of `by_thread`, each from its first event to its end; `feeds`, when not
/// empty, deliver each thread's decoded chunks in order.
fn streams_from_start<'a>(
    by_thread: &'a [(u32, Vec<&'a ChunkInfo>)],
    feeds: Vec<Receiver<Events<'a, fb::MemEvent>>>,
) -> Vec<Stream<'a>> {
    let mut feeds = feeds.into_iter();
    by_thread
        .iter()
        .map(|(_, chunks)| {
            let from = Cursor {
                chunk: 0,
                at: 0,
                base: chunks.first().map_or(0, |c| c.base_ticks),
            };
            Stream::new(chunks, from, (chunks.len(), 0), feeds.next())
        })
        .collect()
}
