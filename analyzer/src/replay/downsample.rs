//! The used and acquired bytes over time, folded into at most a given number of points of equal
//! width as they come, each holding the maximum reached in it, so no peak falls between two
//! points whatever the trace's length.

/// Max used and acquired bytes per time bucket; the bucket width doubles (buckets merge
/// pairwise) whenever time runs past the last one, so the count stays bounded without knowing
/// the trace's length in advance.
pub(super) struct Downsampler {
    pub(super) t0: u64,
    pub(super) shift: u32,
    pub(super) cap: usize,
    pub(super) buckets: Vec<Option<Bucket>>,
}

#[derive(Clone, Copy)]
pub(super) struct Bucket {
    pub(super) used: i64,
    pub(super) acquired: i64,
    /// The first memory event (merge ordinal) that reached `used`.
    pub(super) used_ordinal: u64,
}

impl Bucket {
    pub(super) fn max(self, o: Bucket) -> Bucket {
        let first = if o.used > self.used { o } else { self };
        Bucket {
            acquired: self.acquired.max(o.acquired),
            ..first
        }
    }
}

impl Downsampler {
    pub(super) fn new(t0: u64, cap: usize) -> Downsampler {
        Downsampler {
            t0,
            shift: 10,
            cap,
            buckets: Vec::new(),
        }
    }

    #[inline]
    pub(super) fn add(&mut self, ticks: u64, used: i64, acquired: i64, ordinal: u64) {
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
    pub(super) fn put(&mut self, i: usize, now: Bucket) {
        if i >= self.buckets.len() {
            self.buckets.resize(i + 1, None);
        }
        let b = &mut self.buckets[i];
        *b = Some(match *b {
            Some(b) => b.max(now),
            None => now,
        });
    }

    pub(super) fn coarsen(&mut self) {
        let merged = self
            .buckets
            .chunks(2)
            .map(|p| p.iter().flatten().copied().reduce(Bucket::max))
            .collect();
        self.buckets = merged;
        self.shift += 1;
    }
}
