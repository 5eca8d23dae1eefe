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
    pub(super) last_ticks: u64,
    mallocs: u64,
    frees: u64,
    allocs: u64,
    releases: u64,
    ooms: u64,
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
            live: FxHashMap::default(),
            stops,
            next_stop: 0,
            keep,
            snapshots: Vec::new(),
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
                    self.track_malloc(e, size);
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
                    self.track_free(e);
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
            mallocs: self.mallocs,
            frees: self.frees,
            device_allocs: self.allocs,
            releases: self.releases,
            out_of_memory: self.ooms,
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
        if i >= self.buckets.len() {
            self.buckets.resize(i + 1, None);
        }
        let now = Bucket {
            used,
            acquired,
            used_ordinal: ordinal,
        };
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

/// One thread's memory chunks, walked in order.
struct Stream<'a> {
    chunks: Vec<&'a ChunkInfo>,
    next_chunk: usize,
    events: Events<'a, fb::MemEvent>,
    at: usize,
    base: u64,
    /// File offset of the chunk being read (`u64::MAX` once done), for page release.
    position: u64,
    /// For a packed trace: this thread's chunks, decoded in order by a thread of their own.
    feed: Option<Receiver<Events<'a, fb::MemEvent>>>,
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
                self.events = Events::default();
                self.next_chunk = self.chunks.len() + 1;
                return None;
            };
            self.next_chunk += 1;
            self.events = match &self.feed {
                Some(rx) => rx.recv().unwrap_or_default(),
                None => trace.mem_events(c),
            };
            self.at = 0;
            self.base = c.base_ticks;
            self.position = c.offset;
        }
    }
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
        let tl = merge(trace, points, stops, keep, progress, by_thread, Vec::new());
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
        let tl = merge(
            trace,
            points,
            stops,
            keep,
            progress,
            by_thread.clone(),
            feeds,
        );
        let acc = producers.into_iter().filter_map(|p| p.join().ok()).fold(
            PerStack::new(if fold { stacks } else { 0 }),
            PerStack::merge,
        );
        (tl, acc)
    })
}

fn mem_chunks_by_thread(trace: &Trace) -> Vec<(u32, Vec<&ChunkInfo>)> {
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
    by_thread: Vec<(u32, Vec<&'a ChunkInfo>)>,
    feeds: Vec<Receiver<Events<'a, fb::MemEvent>>>,
) -> Timeline {
    let units = Units::of(trace);
    let track = !stops.is_empty();
    let mut tl = Timeline::new(trace.header.ticks0, points, stops, keep);
    let mut marks: Vec<fb::MarkEvent> = trace
        .chunks
        .iter()
        .filter(|c| c.kind == ChunkKind::Mark)
        .flat_map(|c| trace.mark_events(c))
        .collect();
    // Stable: marks at one tick keep their recorded order.
    marks.sort_by_key(|m| m.ticks());
    let mut feeds = feeds.into_iter();
    let mut streams: Vec<Stream> = by_thread
        .into_iter()
        .map(|(_, chunks)| Stream {
            feed: feeds.next(),
            chunks,
            next_chunk: 0,
            events: Events::default(),
            at: 0,
            base: 0,
            position: 0,
        })
        .collect();
    let mut heads: Vec<Option<u64>> = streams
        .iter_mut()
        .map(|s| s.peek(trace, progress))
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
            tl.mark(&marks[next_mark]);
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
            if tl.stopped() {
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
    if !track {
        for m in &marks[next_mark..] {
            tl.mark(m);
        }
    }
    let end = trace.bytes().len() as u64;
    if released < end {
        trace.release_span(released, end);
    }
    tl
}
