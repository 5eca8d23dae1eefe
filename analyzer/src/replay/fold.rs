//! The one reading of a memory event's kind: what each kind does to the accounting
//! ([`Effect::of`]), and the pool's running figures it moves ([`Ledger`]). Every pass that
//! counts memory takes its kinds from here — the time-ordered pass and its windows
//! (`timeline.rs`, `window_fold.rs`) through the ledger, the per-stack counters (`stacks.rs`),
//! the live-block walks (`categories.rs`, `live.rs`, through the timeline's tracking), `oom.rs`,
//! `requests.rs` and the Parquet rows (`analyzer/export/src/dataset/events.rs`,
//! [`row_bytes`]) — so a kind that changes the figures is taught to this file.

use poolsight_schema::fb;

use super::profile::signed;
use super::Units;

/// What one memory event does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Effect {
    /// A request was served: a block of `size` bytes (the request rounded up to the device's
    /// allocation unit) at the event's address, under its stack. A 0-byte request served with
    /// a null pointer (as CuPy and PyTorch serve them) is one, of size 0.
    Malloc { size: u64 },
    /// A request of `size` bytes (rounded) failed: a null pointer. Counted where requests are
    /// counted (the seed tables), never live.
    FailedMalloc { size: u64 },
    /// The block at the event's address went back: `bytes` as it was accounted.
    Free { bytes: u64 },
    /// The allocator took `bytes` from the device (a pool miss), at the event's address.
    Acquire { bytes: u64 },
    /// The device refused `bytes` (a null pointer).
    FailedAcquire { bytes: u64 },
    /// The allocator gave `bytes` back to the device.
    Release { bytes: u64 },
    /// A request of `bytes` failed for lack of memory.
    OutOfMemory { bytes: u64 },
    /// The free of the block at the event's address was requested; it completes at its
    /// [`Effect::Free`] (format 1.5).
    FreeRequested,
    /// The block at the event's address now belongs to the event's stack, its live bytes
    /// unchanged (format 1.6): views of what is live at an instant move it there; cumulative
    /// figures keep it where it was made, counted once.
    Relabel,
    /// No change: a pre hook (its post event carries the same request and the answer), a
    /// limit, a kind this reader does not know.
    Nothing,
}

impl Effect {
    #[inline(always)]
    pub(crate) fn of(e: &fb::MemEvent, units: &Units) -> Effect {
        match e.kind() {
            fb::MemKind::MallocPost => {
                let size = units.mem_size(e.device(), e.bytes());
                if served(e) {
                    Effect::Malloc { size }
                } else {
                    Effect::FailedMalloc { size }
                }
            }
            fb::MemKind::FreePost => Effect::Free { bytes: e.bytes() },
            fb::MemKind::AllocPost if served(e) => Effect::Acquire { bytes: e.bytes() },
            fb::MemKind::AllocPost => Effect::FailedAcquire { bytes: e.bytes() },
            fb::MemKind::Release => Effect::Release { bytes: e.bytes() },
            fb::MemKind::OutOfMemory => Effect::OutOfMemory { bytes: e.bytes() },
            fb::MemKind::FreeRequested => Effect::FreeRequested,
            fb::MemKind::Relabel => Effect::Relabel,
            _ => Effect::Nothing,
        }
    }
}

/// Whether a malloc or device allocation was served: a pointer, or a request of 0 bytes (which
/// CuPy serves with a null pointer, as PyTorch does an empty tensor's storage). A null pointer
/// for bytes is a failure. Its free and release come later either way, so the counts of both
/// sides include it.
#[inline(always)]
fn served(e: &fb::MemEvent) -> bool {
    e.ptr() != 0 || e.bytes() == 0
}

/// The bytes a row of the event shows (the Parquet `mem_size` column): a request's rounded
/// size, pre hook or post; the accounted size of a device allocation, a free and a relabelled
/// block; none for the other kinds, whose `bytes` mean something else.
pub fn row_bytes(e: &fb::MemEvent, units: &Units) -> Option<u64> {
    match e.kind() {
        fb::MemKind::MallocPre | fb::MemKind::MallocPost => {
            Some(units.mem_size(e.device(), e.bytes()))
        }
        fb::MemKind::AllocPre
        | fb::MemKind::AllocPost
        | fb::MemKind::FreePre
        | fb::MemKind::FreePost
        | fb::MemKind::Relabel => Some(e.bytes()),
        _ => None,
    }
}

/// How many events of each counted memory kind were folded.
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

/// The pool's running figures in time order: live (used) bytes, bytes held from the device
/// (acquired), their extremes, and the counts. Sums saturate; [`Ledger::saturated`] says when
/// one did (only a damaged trace gets there), which a window of the parallel replay cannot
/// stand for. The extremes are kept in the arm of the kind that moves them (only a rise reaches
/// a maximum, only a fall a minimum), so each event is read once.
pub(super) struct Ledger {
    pub(super) used: i64,
    pub(super) acquired: i64,
    pub(super) counts: Counts,
    pub(super) saturated: bool,
    /// Highest used bytes, first reached: (bytes, ticks, ordinal of the event); bytes start at
    /// the floor given to [`Ledger::new`].
    pub(super) peak_used: (i64, u64, u64),
    /// Highest acquired bytes, first reached: (bytes, ticks).
    pub(super) peak_acquired: (i64, u64),
    /// Highest used and acquired bytes since [`Ledger::new_stretch`] (`i64::MIN`: none).
    pub(super) seg_used: i64,
    pub(super) seg_acquired: i64,
    /// Lowest used and acquired bytes.
    pub(super) min_used: i64,
    pub(super) min_acquired: i64,
    /// Live bytes per device, where a trace defines several.
    pub(super) devices: Devices,
}

impl Ledger {
    /// Counting from 0; peaks start at `floor` (0: a peak is a rise above the start; `i64::MIN`:
    /// the highest reached, even below the start, as a window of the parallel replay needs).
    pub(super) fn new(floor: i64) -> Ledger {
        Ledger {
            used: 0,
            acquired: 0,
            counts: Counts::default(),
            saturated: false,
            peak_used: (floor, 0, 0),
            peak_acquired: (floor, 0),
            seg_used: i64::MIN,
            seg_acquired: i64::MIN,
            min_used: 0,
            min_acquired: 0,
            devices: Devices::default(),
        }
    }

    /// A new stretch of the highest bytes begins (at a mark).
    pub(super) fn new_stretch(&mut self) {
        self.seg_used = i64::MIN;
        self.seg_acquired = i64::MIN;
    }

    /// Folds one memory event (not a rebase), the `ordinal`-th in merge order, at `ticks`;
    /// returns what it did, for the passes that also track blocks.
    #[inline(always)]
    pub(super) fn apply(
        &mut self,
        e: &fb::MemEvent,
        units: &Units,
        ticks: u64,
        ordinal: u64,
    ) -> Effect {
        let effect = Effect::of(e, units);
        match effect {
            Effect::Malloc { size } => {
                self.counts.mallocs += 1;
                let u = self.add(self.used, signed(size));
                self.used = u;
                self.seg_used = self.seg_used.max(u);
                if u > self.peak_used.0 {
                    self.peak_used = (u, ticks, ordinal);
                }
                self.devices.apply(e.device(), signed(size), ticks);
            }
            Effect::Free { bytes } => {
                self.counts.frees += 1;
                let u = self.sub(self.used, signed(bytes));
                self.used = u;
                self.min_used = self.min_used.min(u);
                self.devices
                    .apply(e.device(), signed(bytes).saturating_neg(), ticks);
            }
            Effect::Acquire { bytes } => {
                self.counts.allocs += 1;
                let a = self.add(self.acquired, signed(bytes));
                self.acquired = a;
                self.seg_acquired = self.seg_acquired.max(a);
                if a > self.peak_acquired.0 {
                    self.peak_acquired = (a, ticks);
                }
            }
            Effect::Release { bytes } => {
                self.counts.releases += 1;
                let a = self.sub(self.acquired, signed(bytes));
                self.acquired = a;
                self.min_acquired = self.min_acquired.min(a);
            }
            Effect::OutOfMemory { .. } => self.counts.ooms += 1,
            Effect::FailedMalloc { .. }
            | Effect::FailedAcquire { .. }
            | Effect::FreeRequested
            | Effect::Relabel
            | Effect::Nothing => {}
        }
        effect
    }

    #[inline(always)]
    fn add(&mut self, a: i64, b: i64) -> i64 {
        let (v, over) = a.overflowing_add(b);
        if over {
            self.saturated = true;
            return a.saturating_add(b);
        }
        v
    }

    #[inline(always)]
    fn sub(&mut self, a: i64, b: i64) -> i64 {
        let (v, over) = a.overflowing_sub(b);
        if over {
            self.saturated = true;
            return a.saturating_sub(b);
        }
        v
    }
}

/// Live bytes per device and each device's highest (exact, in time order): the peak of one
/// device where a trace holds several. Counted from 0 at the start of what is folded (a window
/// of the parallel replay counts from its own start; [`Devices::after`] combines them).
#[derive(Debug, Clone, Default)]
pub(super) struct Devices {
    /// Whether to count at all: only for a trace that defines several devices (see
    /// [`several_devices`]); with one, its figures are the pool's, and the replay's hot loop
    /// pays nothing.
    pub(super) on: bool,
    /// By device id.
    pub(super) of: Vec<DeviceBytes>,
}

/// Whether a trace defines more than one device, so that each one's own figures differ from
/// the pool's.
pub(super) fn several_devices(trace: &crate::read::Trace) -> bool {
    let mut ids = trace.defs.devices.iter().map(|d| d.id);
    let first = ids.next();
    ids.any(|id| Some(id) != first)
}

#[derive(Debug, Clone, Copy, Default)]
pub(super) struct DeviceBytes {
    /// The device had a block allocated or freed.
    pub(super) seen: bool,
    pub(super) used: i64,
    /// The highest `used`, and when it was first reached (0 bytes: never above the start).
    pub(super) peak: i64,
    pub(super) peak_ticks: u64,
}

impl Devices {
    /// `delta` live bytes on `device` at `ticks`.
    #[inline(always)]
    pub(super) fn apply(&mut self, device: u8, delta: i64, ticks: u64) {
        if self.on {
            self.count(device, delta, ticks);
        }
    }

    #[inline]
    fn count(&mut self, device: u8, delta: i64, ticks: u64) {
        let i = device as usize;
        if i >= self.of.len() {
            self.of.resize(i + 1, DeviceBytes::default());
        }
        let d = &mut self.of[i];
        d.seen = true;
        d.used = d.used.saturating_add(delta);
        if d.used > d.peak {
            d.peak = d.used;
            d.peak_ticks = ticks;
        }
    }

    /// These figures followed by those of `next`, which counted from 0 where these end.
    pub(super) fn after(&mut self, next: &Devices) {
        if self.of.len() < next.of.len() {
            self.of.resize(next.of.len(), DeviceBytes::default());
        }
        for (d, n) in self.of.iter_mut().zip(&next.of) {
            if !n.seen {
                continue;
            }
            d.seen = true;
            let peak = d.used.saturating_add(n.peak);
            if peak > d.peak {
                d.peak = peak;
                d.peak_ticks = n.peak_ticks;
            }
            d.used = d.used.saturating_add(n.used);
        }
    }
}
