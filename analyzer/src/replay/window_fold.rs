//! One window's part of the time-ordered pass (see `windows.rs`), and the combination of the
//! windows' parts, in time order, into the figures of the one merge.

use poolsight_schema::fb;

use super::downsample::Bucket;
use super::fold::Ledger;
use super::merge::Stream;
use super::timeline::Timeline;
use super::Units;

/// The time-ordered figures of one window of time, relative to the window's start: what
/// [`Timeline::from_windows`] combines, in order, into the figures of the whole merge. The
/// pool's bytes are counted from 0 at the window's start; the series' buckets and the marks
/// keep those relative values, made absolute once the bytes before the window are known.
pub(super) struct WindowFold {
    /// Ticks of this window's events are at most `hi` (and at least the instant it starts
    /// at: each stream starts at its first event from then on).
    pub(super) hi: u64,
    pub(super) t0: u64,
    /// The series' bucket width (a shift of ticks), the same in every window; `None`: no series.
    pub(super) shift: Option<u32>,
    /// Set when the window cannot stand for its part of the merge (see [`WindowFold::check`]
    /// and [`WindowFold::bad`]).
    bad: bool,
    /// Used and acquired bytes since the window's start, and the counts.
    pub(super) ledger: Ledger,
    pub(super) ordinal: u64,
    pub(super) marks: Vec<WindowMark>,
    /// (bucket index, bucket) in merge order, one entry per run of equal indices, the open
    /// one (`open`) not yet among them.
    pub(super) buckets: Vec<(u64, Bucket)>,
    /// The bucket the latest events fell in: its index and its figures so far (bytes
    /// `i64::MIN` until an event sets them); index `u64::MAX` before the first event.
    pub(super) open: (u64, Bucket),
    /// Ticks from which events fall past the open bucket (`u64::MAX` without a series): one
    /// compare per event instead of a shift and a look into `buckets`.
    pub(super) edge: u64,
}

/// A mark as a window met it: the bytes then, and the highest bytes since the previous mark.
pub(super) struct WindowMark {
    pub(super) mark: fb::MarkEvent,
    pub(super) used: i64,
    pub(super) acquired: i64,
    pub(super) seg_used: i64,
    pub(super) seg_acquired: i64,
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
            ledger: Ledger::new(i64::MIN),
            ordinal: 0,
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

    /// Whether the window cannot stand for its part of the merge: a stream it checked, or
    /// bytes that left the range the one merge counts in without saturating.
    pub(super) fn bad(&self) -> bool {
        self.bad || self.ledger.saturated
    }

    /// One memory event, as [`Timeline::mem`] takes it.
    #[inline]
    pub(super) fn mem(&mut self, ticks: u64, e: &fb::MemEvent, units: &Units) {
        if ticks >= self.edge {
            self.open_bucket(ticks);
        }
        self.ledger.apply(e, units, ticks, self.ordinal);
        let (u, a) = (self.ledger.used, self.ledger.acquired);
        // The open bucket keeps the highest used bytes first reached in it (as `Bucket::max`
        // folds them) and the highest acquired bytes.
        let b = &mut self.open.1;
        if u > b.used {
            b.used = u;
            b.used_ordinal = self.ordinal;
        }
        b.acquired = b.acquired.max(a);
        self.ordinal += 1;
    }

    /// Closes the open bucket and opens the one `ticks` falls in (once per bucket, or never
    /// without a series).
    #[cold]
    pub(super) fn open_bucket(&mut self, ticks: u64) {
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
    pub(super) fn all_buckets(&self) -> impl Iterator<Item = &(u64, Bucket)> {
        let open = (self.open.0 != u64::MAX).then_some(&self.open);
        self.buckets.iter().chain(open)
    }

    pub(super) fn mark(&mut self, m: &fb::MarkEvent) {
        self.marks.push(WindowMark {
            mark: *m,
            used: self.ledger.used,
            acquired: self.ledger.acquired,
            seg_used: self.ledger.seg_used,
            seg_acquired: self.ledger.seg_acquired,
        });
        self.ledger.new_stretch();
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
            if w.bad() {
                return None;
            }
            let (base_used, base_acquired) = (tl.ledger.used, tl.ledger.acquired);
            // The window's bytes ranged from its lowest to its peak (0 where nothing rose).
            let (max_used, max_acquired) =
                (w.ledger.peak_used.0.max(0), w.ledger.peak_acquired.0.max(0));
            let used = |rel: i64| shifted(base_used, rel, w.ledger.min_used, max_used);
            let acquired =
                |rel: i64| shifted(base_acquired, rel, w.ledger.min_acquired, max_acquired);
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
                tl.ledger.used = used(m.used)?;
                tl.ledger.acquired = acquired(m.acquired)?;
                tl.mark(&m.mark);
            }
            stretch(&mut tl, w.ledger.seg_used, w.ledger.seg_acquired)?;
            // A window without a malloc (or a device alloc) has no peak of its own: the
            // placeholder is not a byte count.
            let (p, ticks, ordinal) = w.ledger.peak_used;
            if p != i64::MIN {
                let p = used(p)?;
                if p > tl.ledger.peak_used.0 {
                    tl.ledger.peak_used = (p, ticks, tl.ordinal + ordinal);
                }
            }
            let (p, ticks) = w.ledger.peak_acquired;
            if p != i64::MIN {
                let p = acquired(p)?;
                if p > tl.ledger.peak_acquired.0 {
                    tl.ledger.peak_acquired = (p, ticks);
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
            tl.ledger.used = used(w.ledger.used)?;
            tl.ledger.acquired = acquired(w.ledger.acquired)?;
            tl.ordinal += w.ordinal;
            tl.ledger.counts.add(&w.ledger.counts);
            tl.ledger.devices.after(&w.ledger.devices);
        }
        Some(tl)
    }
}
