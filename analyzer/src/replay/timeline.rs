//! The time-ordered pass: the memory events of every thread merged by timestamp, with the
//! epoch marks in between, for the pool's used and acquired bytes over time, its peaks, the
//! epochs' figures, and (on a later walk) the bytes live by stack at chosen instants: the used
//! peak, or the maximum of each point of the series for the HTML report's timeline.

use std::sync::atomic::AtomicU64;

use poolsight_schema::fb;
use rustc_hash::FxHashMap;

use super::downsample::Downsampler;
use super::fold::{several_devices, Effect, Ledger};
use super::merge::{sorted_marks, walk_decoding, Sink};
use super::profile::{DevicePeak, EpochFigures, PoolFigures, Series};
use super::stacks::PerStack;
use super::Units;
use crate::read::Trace;

/// State of the time-ordered pass.
pub(super) struct Timeline {
    /// Used and acquired bytes now, and the counts.
    pub(super) ledger: Ledger,
    pub(super) ordinal: u64,
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
    /// Ordinal (in merge order) of the memory event that reached the used peak.
    pub(super) fn peak_ordinal(&self) -> Option<u64> {
        let (bytes, _, ordinal) = self.ledger.peak_used;
        (bytes > 0).then_some(ordinal)
    }

    pub(super) fn new(t0: u64, points: usize, stops: Vec<u64>, keep: usize) -> Timeline {
        Timeline {
            ledger: Ledger::new(0),
            ordinal: 0,
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

    /// One memory event; with `track`, the live blocks follow it, and what it did to them is
    /// returned.
    #[inline]
    pub(super) fn mem(
        &mut self,
        ticks: u64,
        e: &fb::MemEvent,
        units: &Units,
        track: bool,
    ) -> Option<Live> {
        let effect = self.ledger.apply(e, units, ticks, self.ordinal);
        let (used, acquired) = (self.ledger.used, self.ledger.acquired);
        let live = if track { self.track(e, effect) } else { None };
        if let Some(ep) = &mut self.open_epoch {
            ep.gpu_max = ep.gpu_max.max(used);
            ep.held_max = ep.held_max.max(acquired);
        }
        self.series.add(ticks, used, acquired, self.ordinal);
        while self.stops.get(self.next_stop) == Some(&self.ordinal) {
            self.snapshot();
            self.next_stop += 1;
        }
        self.ordinal += 1;
        live
    }

    /// True once every stop's snapshot is taken (never without stops).
    pub(super) fn stopped(&self) -> bool {
        !self.stops.is_empty() && self.next_stop == self.stops.len()
    }

    /// The live blocks after an event that did `effect`.
    #[inline]
    fn track(&mut self, e: &fb::MemEvent, effect: Effect) -> Option<Live> {
        let key = (e.device(), e.ptr());
        match effect {
            Effect::Malloc { size } if size > 0 => {
                // A pointer handed out twice without a free between (only in a damaged trace)
                // counts once, as the pool's own accounting would.
                let replaced = self.blocks.insert(key, (size, e.stack()));
                if let Some((old, stack)) = replaced {
                    self.unlive(stack, old);
                }
                let live = self.live.entry(e.stack()).or_default();
                *live = live.saturating_add(size);
                Some(Live::Added {
                    stack: e.stack(),
                    size,
                    replaced,
                })
            }
            Effect::Free { .. } => {
                let (size, stack) = self.blocks.remove(&key)?;
                self.unlive(stack, size);
                Some(Live::Removed { stack, size })
            }
            Effect::Relabel => {
                let (size, stack) = self.blocks.get_mut(&key)?;
                let (size, from, to) = (*size, *stack, e.stack());
                if from == to {
                    return None;
                }
                *stack = to;
                self.unlive(from, size);
                let live = self.live.entry(to).or_default();
                *live = live.saturating_add(size);
                Some(Live::Moved { from, to, size })
            }
            _ => None,
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
                    gpu_begin: self.ledger.used,
                    gpu_max: self.ledger.used,
                    held_begin: self.ledger.acquired,
                    held_max: self.ledger.acquired,
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
                gpu_end: self.ledger.used,
                held_end: self.ledger.acquired,
                cpu_end,
                cpu_peak,
                complete,
                open,
            });
        }
    }

    pub(super) fn pool(&self, trace: &Trace) -> PoolFigures {
        PoolFigures {
            peak_used_bytes: self.ledger.peak_used.0.max(0) as u64,
            peak_used_ns: trace.ns_since_start(self.ledger.peak_used.1),
            peak_acquired_bytes: self.ledger.peak_acquired.0.max(0) as u64,
            peak_acquired_ns: trace.ns_since_start(self.ledger.peak_acquired.1),
            used_at_end_bytes: self.ledger.used,
            acquired_at_end_bytes: self.ledger.acquired,
            mallocs: self.ledger.counts.mallocs,
            frees: self.ledger.counts.frees,
            device_allocs: self.ledger.counts.allocs,
            releases: self.ledger.counts.releases,
            out_of_memory: self.ledger.counts.ooms,
        }
    }

    /// Each device's own peak, for every device that had blocks. A trace that defines one
    /// device (or none) is counted as one: its peak is the pool's.
    pub(super) fn device_peaks(&self, trace: &Trace) -> Vec<DevicePeak> {
        let peak = |id: usize, used: i64, peak: i64, ticks: u64| {
            let def = trace.defs.devices.iter().find(|x| x.id as usize == id);
            DevicePeak {
                device: id as u32,
                name: def.map_or_else(|| format!("device {id}"), |x| x.name.clone()),
                kind: def.map_or("unspecified", |x| x.kind.name()),
                peak_used_bytes: peak.max(0) as u64,
                peak_used_ns: trace.ns_since_start(ticks),
                used_at_end_bytes: used,
            }
        };
        if !several_devices(trace) {
            let c = &self.ledger.counts;
            if c.mallocs + c.frees == 0 {
                return Vec::new();
            }
            let id = trace.defs.devices.first().map_or(0, |d| d.id as usize);
            let (top, ticks, _) = self.ledger.peak_used;
            return vec![peak(id, self.ledger.used, top, ticks)];
        }
        (self.ledger.devices.of.iter().enumerate())
            .filter(|(_, d)| d.seen)
            .map(|(id, d)| peak(id, d.used, d.peak, d.peak_ticks))
            .collect()
    }

    pub(super) fn epochs(&self, trace: &Trace, end_ticks: u64) -> Vec<EpochFigures> {
        let mut raw: Vec<&RawEpoch> = self.epochs.iter().collect();
        // An epoch the trace ended inside runs to the trace's end.
        let cut = self.open_epoch.as_ref().map(|open| RawEpoch {
            open: open.clone(),
            end_ticks: end_ticks.max(open.begin_ticks),
            gpu_end: self.ledger.used,
            held_end: self.ledger.acquired,
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

/// What an event did to the live blocks (see [`Timeline::mem`]).
#[derive(Debug, Clone, Copy)]
pub(super) enum Live {
    /// A block of `size` bytes under `stack`; `replaced`, the (size, stack) of a block the
    /// same address held without a free between (only in a damaged trace).
    Added {
        stack: u32,
        size: u64,
        replaced: Option<(u64, u32)>,
    },
    Removed {
        stack: u32,
        size: u64,
    },
    /// A block of `size` bytes relabelled from stack `from` to `to`.
    Moved {
        from: u32,
        to: u32,
        size: u64,
    },
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

/// Walks memory events of all threads and the marks in time order. With `stops` (ascending
/// ordinals), tracks live blocks, takes a [`Snapshot`] of the live bytes by stack (the `keep`
/// largest stacks) after the memory event of each ordinal, and stops after the last.
pub(super) fn in_time_order(
    trace: &Trace,
    points: usize,
    stops: Vec<u64>,
    keep: usize,
    progress: Option<&AtomicU64>,
) -> Timeline {
    in_time_order_folding(trace, points, stops, keep, false, progress).0
}

/// [`in_time_order`]; in a packed trace with `fold`, the threads that decode the memory chunks
/// ahead (see [`walk_decoding`]) also fold the decoded events by stack, so that the per-stack
/// pass need not decode them again: the returned [`PerStack`] holds packed memory chunks only.
pub(super) fn in_time_order_folding(
    trace: &Trace,
    points: usize,
    stops: Vec<u64>,
    keep: usize,
    fold: bool,
    progress: Option<&AtomicU64>,
) -> (Timeline, PerStack) {
    let units = Units::of(trace);
    let track = !stops.is_empty();
    let mut tl = Timeline::new(trace.header.ticks0, points, stops, keep);
    tl.ledger.devices.on = several_devices(trace);
    let marks = sorted_marks(trace);
    let (fed, acc) = walk_decoding(trace, &marks, &mut (&mut tl, &units, track), fold, progress);
    if !track {
        for m in &marks[fed..] {
            tl.mark(m);
        }
    }
    (tl, acc)
}
