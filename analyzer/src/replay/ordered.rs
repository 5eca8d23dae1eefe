//! The time-ordered pass: the memory events of every thread merged by timestamp, with the
//! epoch marks in between, for the pool's used and acquired bytes over time, its peaks, the
//! epochs' figures, and (on a later walk) the bytes live by stack at chosen instants: the used
//! peak, or the maximum of each point of the series for the HTML report's timeline.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};

use poolsight_schema::fb;
use rustc_hash::FxHashMap;

use super::profile::{signed, EpochFigures, PoolFigures, Series};
use super::stacks::{fold_mem, PerStack};
use super::Units;
use crate::reader::{ChunkInfo, ChunkKind, Events, Trace, WINDOW};

/// State of the time-ordered pass.
pub(super) struct Timeline {
    used: i64,
    acquired: i64,
    peak_used: i64,
    peak_used_ticks: u64,
    peak_acquired: i64,
    peak_acquired_ticks: u64,
    /// Ordinal (in merge order) of the memory event that reached the used peak.
    pub(super) peak_ordinal: Option<u64>,
    ordinal: u64,
    counts: Counts,
    open_epoch: Option<OpenEpoch>,
    epochs: Vec<RawEpoch>,
    series: Downsampler,
    /// With stop ordinals: (device, ptr) -> (mem_size, stack) of live blocks.
    blocks: FxHashMap<(u8, u64), (u64, u32)>,
    /// With stop ordinals: live bytes by stack now.
    live: FxHashMap<u32, u64>,
    /// Ordinals to take a snapshot after, ascending, and how many are done.
    stops: Vec<u64>,
    next_stop: usize,
    /// Stacks kept per snapshot, the largest; the rest go to its `other`.
    keep: usize,
    pub(super) snapshots: Vec<Snapshot>,
}

/// Bytes live by stack right after one memory event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// (interned stack id, live bytes), largest first, ties by stack id.
    pub stacks: Vec<(u32, u64)>,
    /// Live bytes of the stacks left out.
    pub other: u64,
}

/// How many events of each counted memory kind were merged.
#[derive(Default)]
struct Counts {
    mallocs: u64,
    frees: u64,
    allocs: u64,
    releases: u64,
    ooms: u64,
}

impl Counts {
    fn add(&mut self, o: &Counts) {
        self.mallocs += o.mallocs;
        self.frees += o.frees;
        self.allocs += o.allocs;
        self.releases += o.releases;
        self.ooms += o.ooms;
    }
}

#[derive(Clone)]
struct OpenEpoch {
    epoch: u32,
    begin_ticks: u64,
    gpu_begin: i64,
    gpu_max: i64,
    held_begin: i64,
    held_max: i64,
    cpu_begin: u64,
}

struct RawEpoch {
    open: OpenEpoch,
    end_ticks: u64,
    gpu_end: i64,
    held_end: i64,
    cpu_end: u64,
    cpu_peak: u64,
    complete: bool,
}

impl Timeline {
    fn new(t0: u64, points: usize, stops: Vec<u64>, keep: usize) -> Timeline {
        Timeline {
            used: 0,
            acquired: 0,
            peak_used: 0,
            peak_used_ticks: 0,
            peak_acquired: 0,
            peak_acquired_ticks: 0,
            peak_ordinal: None,
            ordinal: 0,
            counts: Counts::default(),
            open_epoch: None,
            epochs: Vec::new(),
            series: Downsampler::new(t0, points),
            blocks: FxHashMap::default(),
            live: FxHashMap::default(),
            stops,
            next_stop: 0,
            keep,
            snapshots: Vec::new(),
        }
    }

    #[inline]
    fn mem(&mut self, ticks: u64, e: &fb::MemEvent, units: &Units, track: bool) {
        match e.kind() {
            fb::MemKind::MallocPost if served(e) => {
                let size = units.mem_size(e.device(), e.bytes());
                self.counts.mallocs += 1;
                self.used = self.used.saturating_add(signed(size));
                if track && size > 0 {
                    self.track_malloc(e, size);
                }
                if self.used > self.peak_used {
                    self.peak_used = self.used;
                    self.peak_used_ticks = ticks;
                    self.peak_ordinal = Some(self.ordinal);
                }
            }
            fb::MemKind::FreePost => {
                self.counts.frees += 1;
                self.used = self.used.saturating_sub(signed(e.bytes()));
                if track {
                    self.track_free(e);
                }
            }
            fb::MemKind::AllocPost if served(e) => {
                self.counts.allocs += 1;
                self.acquired = self.acquired.saturating_add(signed(e.bytes()));
                if self.acquired > self.peak_acquired {
                    self.peak_acquired = self.acquired;
                    self.peak_acquired_ticks = ticks;
                }
            }
            fb::MemKind::Release => {
                self.counts.releases += 1;
                self.acquired = self.acquired.saturating_sub(signed(e.bytes()));
            }
            fb::MemKind::OutOfMemory => self.counts.ooms += 1,
            _ => {}
        }
        if let Some(ep) = &mut self.open_epoch {
            ep.gpu_max = ep.gpu_max.max(self.used);
            ep.held_max = ep.held_max.max(self.acquired);
        }
        self.series
            .add(ticks, self.used, self.acquired, self.ordinal);
        while self.stops.get(self.next_stop) == Some(&self.ordinal) {
            self.snapshot();
            self.next_stop += 1;
        }
        self.ordinal += 1;
    }

    /// True once every stop's snapshot is taken (never without stops).
    fn stopped(&self) -> bool {
        !self.stops.is_empty() && self.next_stop == self.stops.len()
    }

    fn track_malloc(&mut self, e: &fb::MemEvent, size: u64) {
        // A pointer handed out twice without a free between (only in a damaged trace) counts
        // once, as the pool's own accounting would.
        if let Some((old, stack)) = self.blocks.insert((e.device(), e.ptr()), (size, e.stack())) {
            self.unlive(stack, old);
        }
        let live = self.live.entry(e.stack()).or_default();
        *live = live.saturating_add(size);
    }

    fn track_free(&mut self, e: &fb::MemEvent) {
        if let Some((size, stack)) = self.blocks.remove(&(e.device(), e.ptr())) {
            self.unlive(stack, size);
        }
    }

    fn unlive(&mut self, stack: u32, size: u64) {
        if let Some(live) = self.live.get_mut(&stack) {
            *live = live.saturating_sub(size);
            if *live == 0 {
                self.live.remove(&stack);
            }
        }
    }

    fn snapshot(&mut self) {
        let mut stacks: Vec<(u32, u64)> = self.live.iter().map(|(&s, &b)| (s, b)).collect();
        stacks.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let other = stacks
            .iter()
            .skip(self.keep)
            .fold(0u64, |t, s| t.saturating_add(s.1));
        stacks.truncate(self.keep);
        self.snapshots.push(Snapshot { stacks, other });
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
                    held_begin: self.acquired,
                    held_max: self.acquired,
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
                held_end: self.acquired,
                cpu_end,
                cpu_peak,
                complete,
                open,
            });
        }
    }

    pub(super) fn pool(&self, trace: &Trace) -> PoolFigures {
        PoolFigures {
            peak_used_bytes: self.peak_used.max(0) as u64,
            peak_used_ns: trace.ns_since_start(self.peak_used_ticks),
            peak_acquired_bytes: self.peak_acquired.max(0) as u64,
            peak_acquired_ns: trace.ns_since_start(self.peak_acquired_ticks),
            used_at_end_bytes: self.used,
            acquired_at_end_bytes: self.acquired,
            mallocs: self.counts.mallocs,
            frees: self.counts.frees,
            device_allocs: self.counts.allocs,
            releases: self.counts.releases,
            out_of_memory: self.counts.ooms,
        }
    }

    pub(super) fn epochs(&self, trace: &Trace, end_ticks: u64) -> Vec<EpochFigures> {
        let mut raw: Vec<&RawEpoch> = self.epochs.iter().collect();
        // An epoch the trace ended inside runs to the trace's end.
        let cut = self.open_epoch.as_ref().map(|open| RawEpoch {
            open: open.clone(),
            end_ticks: end_ticks.max(open.begin_ticks),
            gpu_end: self.used,
            held_end: self.acquired,
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
                held_begin_bytes: r.open.held_begin,
                held_end_bytes: r.held_end,
                held_max_bytes: r.open.held_max,
                cpu_begin_bytes: r.open.cpu_begin,
                cpu_end_bytes: r.cpu_end,
                cpu_peak_bytes: r.cpu_peak,
            })
            .collect()
    }

    pub(super) fn series(&self, trace: &Trace) -> Series {
        let d = &self.series;
        let t0 = trace.header.ticks0;
        let filled = || {
            d.buckets
                .iter()
                .enumerate()
                .filter_map(|(i, b)| Some((i, (*b)?)))
        };
        Series {
            bucket_ns: trace.ticks_to_ns(1u64 << d.shift.min(63)) as f64,
            points: filled()
                .map(|(i, b)| {
                    let ticks = t0.saturating_add((i as u64) << d.shift);
                    (trace.ns_since_start(ticks), b.used, b.acquired)
                })
                .collect(),
            used_max_ordinals: filled().map(|(_, b)| b.used_ordinal).collect(),
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
    buckets: Vec<Option<Bucket>>,
}

#[derive(Clone, Copy)]
struct Bucket {
    used: i64,
    acquired: i64,
    /// The first memory event (merge ordinal) that reached `used`.
    used_ordinal: u64,
}

impl Bucket {
    fn max(self, o: Bucket) -> Bucket {
        let first = if o.used > self.used { o } else { self };
        Bucket {
            acquired: self.acquired.max(o.acquired),
            ..first
        }
    }
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
    fn add(&mut self, ticks: u64, used: i64, acquired: i64, ordinal: u64) {
        if self.cap == 0 {
            return;
        }
        let mut i = (ticks.saturating_sub(self.t0) >> self.shift) as usize;
        while i >= self.cap {
            self.coarsen();
            i >>= 1;
        }
        self.put(
            i,
            Bucket {
                used,
                acquired,
                used_ordinal: ordinal,
            },
        );
    }

    /// Folds `now` into bucket `i` (below the cap), as [`Bucket::max`] folds.
    #[inline]
    fn put(&mut self, i: usize, now: Bucket) {
        if i >= self.buckets.len() {
            self.buckets.resize(i + 1, None);
        }
        let b = &mut self.buckets[i];
        *b = Some(match *b {
            Some(b) => b.max(now),
            None => now,
        });
    }

    fn coarsen(&mut self) {
        let merged = self
            .buckets
            .chunks(2)
            .map(|p| p.iter().flatten().copied().reduce(Bucket::max))
            .collect();
        self.buckets = merged;
        self.shift += 1;
    }
}

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

impl Sink for (&mut Timeline, &Units, bool) {
    #[inline]
    fn mem(&mut self, ticks: u64, e: &fb::MemEvent) -> bool {
        self.0.mem(ticks, e, self.1, self.2);
        !self.0.stopped()
    }

    fn mark(&mut self, m: &fb::MarkEvent) {
        self.0.mark(m)
    }
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

/// The marks of a trace, in time order (marks at one tick in their recorded order).
/// Whether a malloc or device allocation was served: a pointer, or a request of 0 bytes (which
/// CuPy serves with a null pointer, as PyTorch does an empty tensor's storage). A null pointer
/// for bytes is a failure. Its free and release come later either way, so the counts of both
/// sides include it.
#[inline]
fn served(e: &fb::MemEvent) -> bool {
    e.ptr() != 0 || e.bytes() == 0
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

/// Walks memory events of all threads and the marks in time order. With `stops` (ascending
/// ordinals), tracks live blocks, takes a [`Snapshot`] of the live bytes by stack (the `keep`
/// largest stacks) after the memory event of each ordinal, and stops after the last.
///
/// The merge picks the thread whose next event is earliest and takes its events while they are
/// no later than any other thread's next event or the next mark. Threads are few, so a scan
/// of the heads beats a heap. Pages are given back behind the slowest thread, a window at a
/// time.
pub(super) fn in_time_order(
    trace: &Trace,
    points: usize,
    stops: Vec<u64>,
    keep: usize,
    progress: Option<&AtomicU64>,
) -> Timeline {
    in_time_order_folding(trace, points, stops, keep, false, progress).0
}

/// Chunks decoded ahead of the merge, per thread: enough to keep the merge busy, few enough
/// that memory stays a few MB.
const DECODED_AHEAD: usize = 4;

/// [`in_time_order`]; in a packed trace each thread's memory chunks are decoded ahead on a
/// thread of their own (the merge itself stays on one thread), and with `fold` those threads
/// also fold the decoded events by stack, so that the per-stack pass need not decode them
/// again: the returned [`PerStack`] holds packed memory chunks only.
pub(super) fn in_time_order_folding(
    trace: &Trace,
    points: usize,
    stops: Vec<u64>,
    keep: usize,
    fold: bool,
    progress: Option<&AtomicU64>,
) -> (Timeline, PerStack) {
    let by_thread = mem_chunks_by_thread(trace);
    let units = Units::of(trace);
    let stacks = trace.defs.stacks.len();
    if !by_thread.iter().flat_map(|(_, cs)| cs).any(|c| c.packed) {
        let tl = merge(trace, points, stops, keep, progress, &by_thread, Vec::new());
        return (tl, PerStack::new(0));
    }
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
        let tl = merge(trace, points, stops, keep, progress, &by_thread, feeds);
        let acc = producers.into_iter().filter_map(|p| p.join().ok()).fold(
            PerStack::new(if fold { stacks } else { 0 }),
            PerStack::merge,
        );
        (tl, acc)
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

/// The merge of [`in_time_order`]; `feeds`, when not empty, deliver each thread's decoded
/// chunks in order (one per thread of `by_thread`).
fn merge<'a>(
    trace: &'a Trace,
    points: usize,
    stops: Vec<u64>,
    keep: usize,
    progress: Option<&AtomicU64>,
    by_thread: &'a [(u32, Vec<&'a ChunkInfo>)],
    feeds: Vec<Receiver<Events<'a, fb::MemEvent>>>,
) -> Timeline {
    let units = Units::of(trace);
    let track = !stops.is_empty();
    let mut tl = Timeline::new(trace.header.ticks0, points, stops, keep);
    let marks = sorted_marks(trace);
    let mut feeds = feeds.into_iter();
    let mut streams: Vec<Stream> = by_thread
        .iter()
        .map(|(_, chunks)| {
            let from = Cursor {
                chunk: 0,
                at: 0,
                base: chunks.first().map_or(0, |c| c.base_ticks),
            };
            Stream::new(chunks, from, (chunks.len(), 0), feeds.next())
        })
        .collect();
    let fed = merge_streams(
        trace,
        &mut streams,
        &marks,
        &mut (&mut tl, &units, track),
        progress,
        true,
    );
    if !track {
        for m in &marks[fed..] {
            tl.mark(m);
        }
    }
    tl
}

/// The time-ordered figures of one window of time, relative to the window's start: what
/// [`Timeline::from_windows`] combines, in order, into the figures of the whole merge. The
/// pool's bytes are counted from 0 at the window's start; the series' buckets and the marks
/// keep those relative values, made absolute once the bytes before the window are known.
pub(super) struct WindowFold {
    /// Ticks of this window's events are at most `hi` (and at least the instant it starts
    /// at: each stream starts at its first event from then on).
    hi: u64,
    t0: u64,
    /// The series' bucket width (a shift of ticks), the same in every window; `None`: no series.
    shift: Option<u32>,
    /// Set when the window cannot stand for its part of the merge (see [`WindowFold::mem`]).
    pub(super) bad: bool,
    used: i64,
    acquired: i64,
    /// Lowest used and acquired bytes (the highest are the peaks').
    min_used: i64,
    min_acquired: i64,
    /// Highest used bytes, first reached: (bytes, ticks, ordinal in this window); bytes
    /// `i64::MIN` before any event.
    peak_used: (i64, u64, u64),
    peak_acquired: (i64, u64),
    ordinal: u64,
    counts: Counts,
    /// Highest used and acquired bytes since the last mark (or the window's start).
    seg_used: i64,
    seg_acquired: i64,
    marks: Vec<WindowMark>,
    /// (bucket index, bucket) in merge order, one entry per run of equal indices, the open
    /// one (`open`) not yet among them.
    buckets: Vec<(u64, Bucket)>,
    /// The bucket the latest events fell in: its index and its figures so far (bytes
    /// `i64::MIN` until an event sets them); index `u64::MAX` before the first event.
    open: (u64, Bucket),
    /// Ticks from which events fall past the open bucket (`u64::MAX` without a series): one
    /// compare per event instead of a shift and a look into `buckets`.
    edge: u64,
}

/// A mark as a window met it: the bytes then, and the highest bytes since the previous mark.
struct WindowMark {
    mark: fb::MarkEvent,
    used: i64,
    acquired: i64,
    seg_used: i64,
    seg_acquired: i64,
}

/// Ticks shifted right, 0 once the shift passes the width.
#[inline]
fn shr(ticks: u64, shift: u32) -> u64 {
    ticks.checked_shr(shift).unwrap_or(0)
}

/// The series' bucket width for a merge whose latest memory event is at `last` ticks: the
/// width [`Downsampler`] ends with after seeing it (it starts at 2^10 ticks and doubles while
/// the index passes `points`). `None` without points.
pub(super) fn series_shift(t0: u64, last: u64, points: usize) -> Option<u32> {
    if points == 0 {
        return None;
    }
    let mut shift = 10;
    let mut i = shr(last.saturating_sub(t0), shift);
    while i >= points as u64 {
        shift += 1;
        i >>= 1;
    }
    Some(shift)
}

impl WindowFold {
    /// A window whose events are at most `hi`.
    pub(super) fn new(hi: u64, t0: u64, shift: Option<u32>) -> Self {
        WindowFold {
            hi,
            t0,
            shift,
            bad: false,
            used: 0,
            acquired: 0,
            min_used: 0,
            min_acquired: 0,
            peak_used: (i64::MIN, 0, 0),
            peak_acquired: (i64::MIN, 0),
            ordinal: 0,
            counts: Counts::default(),
            seg_used: i64::MIN,
            seg_acquired: i64::MIN,
            marks: Vec::new(),
            buckets: Vec::new(),
            open: (
                u64::MAX,
                Bucket {
                    used: i64::MIN,
                    acquired: i64::MIN,
                    used_ordinal: 0,
                },
            ),
            edge: if shift.is_some() { 0 } else { u64::MAX },
        }
    }

    /// Checks a stream the window merged: the window goes `bad` where its part might differ
    /// from the one merge's: an event after the window's end, or a stream going back in time
    /// (only in a damaged trace, or after a clock jumped back). Its first event is no earlier
    /// than the window's start: the cut placed it there.
    pub(super) fn check(&mut self, s: &Stream) {
        self.bad |= s.went_back || s.last > self.hi;
    }

    /// One memory event, as [`Timeline::mem`] takes it. Bytes that leave the range the one
    /// merge counts in without saturating make the window `bad`.
    #[inline]
    pub(super) fn mem(&mut self, ticks: u64, e: &fb::MemEvent, units: &Units) {
        if ticks >= self.edge {
            self.open_bucket(ticks);
        }
        match e.kind() {
            fb::MemKind::MallocPost if served(e) => {
                let size = units.mem_size(e.device(), e.bytes());
                self.counts.mallocs += 1;
                let (u, over) = self.used.overflowing_add(signed(size));
                self.bad |= over;
                self.used = u;
                self.seg_used = self.seg_used.max(u);
                if u > self.peak_used.0 {
                    self.peak_used = (u, ticks, self.ordinal);
                }
            }
            fb::MemKind::FreePost => {
                self.counts.frees += 1;
                let (u, over) = self.used.overflowing_sub(signed(e.bytes()));
                self.bad |= over;
                self.used = u;
                self.min_used = self.min_used.min(u);
            }
            fb::MemKind::AllocPost if served(e) => {
                self.counts.allocs += 1;
                let (a, over) = self.acquired.overflowing_add(signed(e.bytes()));
                self.bad |= over;
                self.acquired = a;
                self.seg_acquired = self.seg_acquired.max(a);
                if a > self.peak_acquired.0 {
                    self.peak_acquired = (a, ticks);
                }
            }
            fb::MemKind::Release => {
                self.counts.releases += 1;
                let (a, over) = self.acquired.overflowing_sub(signed(e.bytes()));
                self.bad |= over;
                self.acquired = a;
                self.min_acquired = self.min_acquired.min(a);
            }
            fb::MemKind::OutOfMemory => self.counts.ooms += 1,
            _ => {}
        }
        // The open bucket keeps the highest used bytes first reached in it (as `Bucket::max`
        // folds them) and the highest acquired bytes.
        let b = &mut self.open.1;
        if self.used > b.used {
            b.used = self.used;
            b.used_ordinal = self.ordinal;
        }
        b.acquired = b.acquired.max(self.acquired);
        self.ordinal += 1;
    }

    /// Closes the open bucket and opens the one `ticks` falls in (once per bucket, or never
    /// without a series).
    #[cold]
    fn open_bucket(&mut self, ticks: u64) {
        let Some(shift) = self.shift else { return };
        if self.open.0 != u64::MAX {
            self.buckets.push(self.open);
        }
        let i = shr(ticks.saturating_sub(self.t0), shift);
        self.open = (
            i,
            Bucket {
                used: i64::MIN,
                acquired: i64::MIN,
                used_ordinal: self.ordinal,
            },
        );
        // The bucket's last tick plus one, or the end of time.
        self.edge = i
            .checked_add(1)
            .and_then(|n| n.checked_shl(shift).filter(|&w| w >> shift == n))
            .and_then(|w| self.t0.checked_add(w))
            .unwrap_or(u64::MAX);
    }

    /// The series' buckets of this window, in merge order, the open one last.
    fn all_buckets(&self) -> impl Iterator<Item = &(u64, Bucket)> {
        let open = (self.open.0 != u64::MAX).then_some(&self.open);
        self.buckets.iter().chain(open)
    }

    pub(super) fn mark(&mut self, m: &fb::MarkEvent) {
        self.marks.push(WindowMark {
            mark: *m,
            used: self.used,
            acquired: self.acquired,
            seg_used: self.seg_used,
            seg_acquired: self.seg_acquired,
        });
        self.seg_used = i64::MIN;
        self.seg_acquired = i64::MIN;
    }
}

/// `base + rel` where every value `base + min..=base + max` fits an i64.
fn shifted(base: i64, rel: i64, min: i64, max: i64) -> Option<i64> {
    let lo = base as i128 + min as i128;
    let hi = base as i128 + max as i128;
    (lo >= i64::MIN as i128 && hi <= i64::MAX as i128).then(|| base + rel)
}

impl Timeline {
    /// The figures of one merge from those of its windows, in time order (see [`WindowFold`]);
    /// `None` if a window went bad or the bytes would have saturated, where only the one merge
    /// gives the figures. `shift` is the series' bucket width every window used.
    pub(super) fn from_windows(
        t0: u64,
        points: usize,
        shift: Option<u32>,
        windows: impl IntoIterator<Item = WindowFold>,
    ) -> Option<Timeline> {
        let mut tl = Timeline::new(t0, points, Vec::new(), 0);
        if let Some(shift) = shift {
            tl.series.shift = shift;
        }
        for w in windows {
            if w.bad {
                return None;
            }
            let (base_used, base_acquired) = (tl.used, tl.acquired);
            // The window's bytes ranged from its lowest to its peak (0 where nothing rose).
            let (max_used, max_acquired) = (w.peak_used.0.max(0), w.peak_acquired.0.max(0));
            let used = |rel: i64| shifted(base_used, rel, w.min_used, max_used);
            let acquired = |rel: i64| shifted(base_acquired, rel, w.min_acquired, max_acquired);
            // The highest bytes of a stretch between marks raise the open epoch's maxima.
            let stretch = |tl: &mut Timeline, seg_used: i64, seg_acquired: i64| -> Option<()> {
                if let Some(ep) = &mut tl.open_epoch {
                    if seg_used != i64::MIN {
                        ep.gpu_max = ep.gpu_max.max(used(seg_used)?);
                    }
                    if seg_acquired != i64::MIN {
                        ep.held_max = ep.held_max.max(acquired(seg_acquired)?);
                    }
                }
                Some(())
            };
            for m in &w.marks {
                stretch(&mut tl, m.seg_used, m.seg_acquired)?;
                tl.used = used(m.used)?;
                tl.acquired = acquired(m.acquired)?;
                tl.mark(&m.mark);
            }
            stretch(&mut tl, w.seg_used, w.seg_acquired)?;
            // A window without a malloc (or a device alloc) has no peak of its own: the
            // placeholder is not a byte count.
            let (p, ticks, ordinal) = w.peak_used;
            if p != i64::MIN {
                let p = used(p)?;
                if p > tl.peak_used {
                    tl.peak_used = p;
                    tl.peak_used_ticks = ticks;
                    tl.peak_ordinal = Some(tl.ordinal + ordinal);
                }
            }
            let (p, ticks) = w.peak_acquired;
            if p != i64::MIN {
                let p = acquired(p)?;
                if p > tl.peak_acquired {
                    tl.peak_acquired = p;
                    tl.peak_acquired_ticks = ticks;
                }
            }
            if shift.is_some() {
                let d = &mut tl.series;
                for (i, b) in w.all_buckets() {
                    let i = usize::try_from(*i).ok().filter(|&i| i < d.cap)?;
                    let now = Bucket {
                        used: used(b.used)?,
                        acquired: acquired(b.acquired)?,
                        used_ordinal: tl.ordinal + b.used_ordinal,
                    };
                    d.put(i, now);
                }
            }
            tl.used = used(w.used)?;
            tl.acquired = acquired(w.acquired)?;
            tl.ordinal += w.ordinal;
            tl.counts.add(&w.counts);
        }
        Some(tl)
    }
}
