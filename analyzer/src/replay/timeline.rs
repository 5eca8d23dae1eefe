//! The time-ordered pass: the memory events of every thread merged by timestamp, with the
//! epoch marks in between, for the pool's used and acquired bytes over time, its peaks, the
//! epochs' figures, and (on a later walk) the bytes live by stack at chosen instants: the used
//! peak, or the maximum of each point of the series for the HTML report's timeline.

use poolsight_schema::fb;
use rustc_hash::FxHashMap;

use super::downsample::Downsampler;
use super::merge::Sink;
use super::profile::{signed, EpochFigures, PoolFigures, Series};
use super::Units;
use crate::read::Trace;

/// State of the time-ordered pass.
pub(super) struct Timeline {
    pub(super) used: i64,
    pub(super) acquired: i64,
    pub(super) peak_used: i64,
    pub(super) peak_used_ticks: u64,
    pub(super) peak_acquired: i64,
    pub(super) peak_acquired_ticks: u64,
    /// Ordinal (in merge order) of the memory event that reached the used peak.
    pub(super) peak_ordinal: Option<u64>,
    pub(super) ordinal: u64,
    pub(super) counts: Counts,
    pub(super) open_epoch: Option<OpenEpoch>,
    pub(super) epochs: Vec<RawEpoch>,
    pub(super) series: Downsampler,
    /// With stop ordinals: (device, ptr) -> (mem_size, stack) of live blocks.
    pub(super) blocks: FxHashMap<(u8, u64), (u64, u32)>,
    /// With stop ordinals: live bytes by stack now.
    pub(super) live: FxHashMap<u32, u64>,
    /// Ordinals to take a snapshot after, ascending, and how many are done.
    pub(super) stops: Vec<u64>,
    pub(super) next_stop: usize,
    /// Stacks kept per snapshot, the largest; the rest go to its `other`.
    pub(super) keep: usize,
    pub(super) snapshots: Vec<Snapshot>,
}

/// Bytes live by stack (or by another grouping of the allocations: see
/// [`crate::replay::LiveOverTime`]) right after one memory event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// (interned stack id, live bytes), largest first, ties by stack id.
    pub stacks: Vec<(u32, u64)>,
    /// Live bytes of the stacks left out.
    pub other: u64,
}

impl Snapshot {
    /// The `keep` largest of `live` (id, bytes), each id once; the rest summed in `other`.
    pub(super) fn largest(live: impl Iterator<Item = (u32, u64)>, keep: usize) -> Snapshot {
        let mut stacks: Vec<(u32, u64)> = live.collect();
        stacks.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let other = stacks
            .iter()
            .skip(keep)
            .fold(0u64, |t, s| t.saturating_add(s.1));
        stacks.truncate(keep);
        Snapshot { stacks, other }
    }
}

/// How many events of each counted memory kind were merged.
#[derive(Default)]
pub(super) struct Counts {
    pub(super) mallocs: u64,
    pub(super) frees: u64,
    pub(super) allocs: u64,
    pub(super) releases: u64,
    pub(super) ooms: u64,
}

impl Counts {
    pub(super) fn add(&mut self, o: &Counts) {
        self.mallocs += o.mallocs;
        self.frees += o.frees;
        self.allocs += o.allocs;
        self.releases += o.releases;
        self.ooms += o.ooms;
    }
}

#[derive(Clone)]
pub(super) struct OpenEpoch {
    pub(super) epoch: u32,
    pub(super) begin_ticks: u64,
    pub(super) gpu_begin: i64,
    pub(super) gpu_max: i64,
    pub(super) held_begin: i64,
    pub(super) held_max: i64,
    pub(super) cpu_begin: u64,
}

pub(super) struct RawEpoch {
    pub(super) open: OpenEpoch,
    pub(super) end_ticks: u64,
    pub(super) gpu_end: i64,
    pub(super) held_end: i64,
    pub(super) cpu_end: u64,
    pub(super) cpu_peak: u64,
    pub(super) complete: bool,
}

impl Timeline {
    pub(super) fn new(t0: u64, points: usize, stops: Vec<u64>, keep: usize) -> Timeline {
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
    pub(super) fn mem(&mut self, ticks: u64, e: &fb::MemEvent, units: &Units, track: bool) {
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
    pub(super) fn stopped(&self) -> bool {
        !self.stops.is_empty() && self.next_stop == self.stops.len()
    }

    pub(super) fn track_malloc(&mut self, e: &fb::MemEvent, size: u64) {
        // A pointer handed out twice without a free between (only in a damaged trace) counts
        // once, as the pool's own accounting would.
        if let Some((old, stack)) = self.blocks.insert((e.device(), e.ptr()), (size, e.stack())) {
            self.unlive(stack, old);
        }
        let live = self.live.entry(e.stack()).or_default();
        *live = live.saturating_add(size);
    }

    pub(super) fn track_free(&mut self, e: &fb::MemEvent) {
        if let Some((size, stack)) = self.blocks.remove(&(e.device(), e.ptr())) {
            self.unlive(stack, size);
        }
    }

    pub(super) fn unlive(&mut self, stack: u32, size: u64) {
        if let Some(live) = self.live.get_mut(&stack) {
            *live = live.saturating_sub(size);
            if *live == 0 {
                self.live.remove(&stack);
            }
        }
    }

    pub(super) fn snapshot(&mut self) {
        let live = self.live.iter().map(|(&s, &b)| (s, b));
        self.snapshots.push(Snapshot::largest(live, self.keep));
    }

    pub(super) fn mark(&mut self, e: &fb::MarkEvent) {
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
    pub(super) fn close_epoch(&mut self, ticks: u64, cpu: Option<(u64, u64)>) {
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

/// The marks of a trace, in time order (marks at one tick in their recorded order).
/// Whether a malloc or device allocation was served: a pointer, or a request of 0 bytes (which
/// CuPy serves with a null pointer, as PyTorch does an empty tensor's storage). A null pointer
/// for bytes is a failure. Its free and release come later either way, so the counts of both
/// sides include it.
#[inline]
pub(super) fn served(e: &fb::MemEvent) -> bool {
    e.ptr() != 0 || e.bytes() == 0
}
