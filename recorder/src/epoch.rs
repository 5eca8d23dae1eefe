//! Epoch boundaries, for fastai's `PeakMemMetric` columns (cpu used/peak, gpu used/peak).
//!
//! Only the CPU figures are taken here, per the header's `CpuSource`. The GPU figures are not
//! sampled at all: the analyzer replays the pool's events between the two marks, which gives
//! the exact used bytes at each boundary and the exact peak in between, where fastai polls.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::cpu::{self, CountingAllocator};
use crate::kinds::MarkKind;
use crate::writer::{CpuSource, Handle};

/// Per-recorder epoch state. Epoch calls are rare (twice per epoch), so a process-wide mutex is
/// simpler than anything thread-local, and lets an epoch end on another thread than it began.
struct EpochState {
    recorder: u64,
    /// Highest RSS read since the epoch began, by the epoch calls and the sampler.
    rss_peak: Arc<AtomicU64>,
}

static EPOCHS: Mutex<Vec<EpochState>> = Mutex::new(Vec::new());

/// Recorders are few; past this many, the oldest states are forgotten (an epoch of a recorder
/// that far back loses the sampler's contribution to its RSS peak, nothing else).
const MAX_STATES: usize = 64;

fn rss_peak_of(handle: &Handle) -> Arc<AtomicU64> {
    let id = handle.id();
    let mut states = EPOCHS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(s) = states.iter().find(|s| s.recorder == id) {
        return Arc::clone(&s.rss_peak);
    }
    if states.len() >= MAX_STATES {
        states.remove(0);
    }
    let rss_peak = Arc::new(AtomicU64::new(0));
    states.push(EpochState {
        recorder: id,
        rss_peak: Arc::clone(&rss_peak),
    });
    rss_peak
}

fn warn_heap_not_installed() {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if !CountingAllocator::is_installed() && !WARNED.swap(true, Ordering::Relaxed) {
        eprintln!(
            "poolsight: the recorder's cpu_source is Heap but CountingAllocator is not the \
             #[global_allocator]; CPU figures will read 0"
        );
    }
}

impl Handle {
    /// Marks the start of epoch `n`, with the CPU bytes in use now, and starts the epoch's CPU
    /// peak from them. With [`CpuSource::Heap`] the epoch's figures count only the blocks
    /// allocated from now on, as `tracemalloc` started now would (so the mark carries 0).
    pub fn epoch_begin(&self, n: u32) {
        let source = self.cpu_source();
        let now = match source {
            CpuSource::None | CpuSource::Tracemalloc => 0,
            CpuSource::Heap => {
                warn_heap_not_installed();
                CountingAllocator::reset_peak();
                CountingAllocator::begin_epoch();
                CountingAllocator::epoch_current()
            }
            CpuSource::Rss => {
                let now = cpu::bytes_now(source);
                rss_peak_of(self).store(now, Ordering::Relaxed);
                now
            }
        };
        self.record_mark(MarkKind::EpochBegin, n, now, 0);
    }

    /// Marks the end of epoch `n`, with the CPU bytes in use now and the CPU peak since the
    /// matching [`Handle::epoch_begin`] (absolute bytes; the analyzer takes fastai's deltas).
    pub fn epoch_end(&self, n: u32) {
        let source = self.cpu_source();
        let (now, peak) = match source {
            CpuSource::None | CpuSource::Tracemalloc => (0, 0),
            CpuSource::Heap => {
                let now = CountingAllocator::epoch_current();
                (now, CountingAllocator::epoch_peak().max(now))
            }
            CpuSource::Rss => {
                let now = cpu::bytes_now(source);
                (
                    now,
                    rss_peak_of(self).fetch_max(now, Ordering::Relaxed).max(now),
                )
            }
        };
        self.record_mark(MarkKind::EpochEnd, n, now, peak);
    }

    /// Takes one sample of the recorder's CPU source: a `CpuSample` mark (the CPU line of the
    /// timeline) and, for RSS, a raise of the epoch's peak. What [`Handle::start_cpu_sampler`]
    /// does every interval, for callers that sample on their own schedule (the Python
    /// package). Nothing with `CpuSource::None`.
    pub fn cpu_sample(&self) {
        let source = self.cpu_source();
        if !matches!(source, CpuSource::None | CpuSource::Tracemalloc) {
            let rss_peak = (source == CpuSource::Rss).then(|| rss_peak_of(self));
            take_sample(self, source, rss_peak.as_deref());
        }
    }

    /// Starts a thread that reads the recorder's CPU source every `interval`, writes a
    /// `CpuSample` mark each time (the CPU line of the timeline) and, for RSS, raises the epoch
    /// peak, which the epoch calls alone only see at the boundaries. The heap source needs no
    /// sampling for its peak (it is exact); sampling it only draws the timeline.
    ///
    /// Stops when the returned guard drops; drop it before finishing the recorder, or its last
    /// samples are counted as dropped events. With `CpuSource::None` no thread is started.
    pub fn start_cpu_sampler(&self, interval: Duration) -> CpuSampler {
        let source = self.cpu_source();
        if matches!(source, CpuSource::None | CpuSource::Tracemalloc) {
            return CpuSampler {
                stop: Arc::default(),
                thread: None,
                forks: 0,
            };
        }
        let stop: Arc<(Mutex<bool>, Condvar)> = Arc::default();
        let rss_peak = (source == CpuSource::Rss).then(|| rss_peak_of(self));
        let handle = self.clone();
        let stop2 = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("poolsight-cpu-sampler".into())
            .spawn(move || sample(&handle, source, rss_peak, interval, &stop2));
        let thread = match thread {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!("poolsight: cannot start the CPU sampler thread: {e}");
                None
            }
        };
        CpuSampler {
            stop,
            thread,
            forks: crate::writer::fork::generation(),
        }
    }
}

fn sample(
    handle: &Handle,
    source: CpuSource,
    rss_peak: Option<Arc<AtomicU64>>,
    interval: Duration,
    stop: &(Mutex<bool>, Condvar),
) {
    let (lock, cv) = stop;
    let mut stopped = lock.lock().unwrap_or_else(|e| e.into_inner());
    while !*stopped {
        take_sample(handle, source, rss_peak.as_deref());
        stopped = match cv.wait_timeout(stopped, interval) {
            Ok((g, _)) => g,
            Err(e) => e.into_inner().0,
        };
    }
}

fn take_sample(handle: &Handle, source: CpuSource, rss_peak: Option<&AtomicU64>) {
    let now = cpu::bytes_now(source);
    if let Some(peak) = rss_peak {
        peak.fetch_max(now, Ordering::Relaxed);
    }
    handle.record_mark(MarkKind::CpuSample, 0, now, 0);
}

/// Keeps the CPU sampler running; dropping it stops the thread and waits for it.
#[must_use = "the sampler stops when the guard is dropped"]
#[derive(Debug)]
pub struct CpuSampler {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
    /// The fork generation it started in: a forked child has no sampler thread to stop.
    forks: u64,
}

impl Drop for CpuSampler {
    fn drop(&mut self) {
        if self.thread.is_some() && crate::writer::fork::forked_since(self.forks) {
            // The thread is the parent's; its lock may have been held when the child forked.
            std::mem::forget(self.thread.take());
            return;
        }
        let (lock, cv) = &*self.stop;
        *lock.lock().unwrap_or_else(|e| e.into_inner()) = true;
        cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
