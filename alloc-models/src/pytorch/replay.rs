//! A run's requests replayed through the allocator under given settings and a device
//! capacity: reserved bytes at their peak, fragmentation there, and the first request that
//! would not fit; and the smallest capacity the run fits in.
//!
//! Requests name blocks by the addresses the recorded run gave them; the replay maps each to
//! the block the model handed out, so a free reaches the right block whatever the model placed
//! where.

use rustc_hash::FxHashMap;

use super::allocator::{Allocator, Handle};
use super::settings::Settings;
use super::ROUND_LARGE;

/// What a recorded memory event asks of the allocator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// A request of `size` bytes, served at `addr` in the recording.
    Malloc,
    /// The free of the block at `addr` was requested; other streams may still use it.
    FreeRequested,
    /// The free of the block at `addr` completed (or happened at once).
    Free,
    /// A request of `size` bytes that failed in the recording: replayed as a request whose
    /// block, if the model serves it, is freed at once (the program raised).
    OutOfMemory,
    /// The recorded allocator took `size` bytes at `addr` from the device (the model makes its
    /// own decisions; [`super::check`] compares them with these).
    Acquire,
    /// The recorded allocator gave `size` bytes at `addr` back. A run of releases not followed
    /// by an acquire (which would make them the malloc path's own) is an `empty_cache()`.
    Release,
}

/// One memory event of a recorded run, in time order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub op: Op,
    pub stream: u32,
    pub addr: u64,
    pub size: u64,
    /// Nanoseconds since the run began.
    pub ns: u64,
    /// The trace's stack id of the request (for naming the line of a failure).
    pub stack: u32,
}

/// How to replay.
#[derive(Debug, Clone)]
pub struct Config {
    pub settings: Settings,
    /// Bytes the allocator can get from the device (`None`: without limit).
    pub capacity: Option<u64>,
    /// Stop at the first request that does not fit (a search needs no more).
    pub stop_at_failure: bool,
}

/// The first request the model could not serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// Its index in the requests.
    pub index: usize,
    pub ns: u64,
    pub stream: u32,
    pub stack: u32,
    /// Bytes asked, and the segment it needed.
    pub requested: u64,
    pub alloc_size: u64,
    /// Reserved and allocated bytes when it failed, and the blocks live.
    pub reserved: u64,
    pub allocated: u64,
    pub live_blocks: u64,
    /// What was live: bytes of the blocks handed out, by the stack of their request, the
    /// largest first (at most [`LIVE_STACKS`]).
    pub live_by_stack: Vec<(u32, u64)>,
}

/// Stacks kept in [`Failure::live_by_stack`].
pub const LIVE_STACKS: usize = 5;

/// What a replay found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// The most bytes reserved from the device at once, and when (ns).
    pub reserved_peak: u64,
    pub reserved_peak_ns: u64,
    /// The most bytes allocated at once.
    pub allocated_peak: u64,
    /// At the reserved peak: reserved minus allocated, free bytes in split segments, and the
    /// segments held.
    pub fragmentation: u64,
    pub inactive_split_at_peak: u64,
    pub segments_at_peak: u64,
    pub first_failure: Option<Failure>,
    /// Requests that failed (the replay goes on after each, as a program that catches the
    /// error would).
    pub failures: u64,
    /// Device allocations (segments and mapped ranges) and frees over the run.
    pub device_allocs: u64,
    pub device_frees: u64,
    /// Requests replayed.
    pub requests: u64,
}

/// Replays `requests` through PyTorch's allocator under `config`.
pub fn replay(requests: &[Request], config: &Config) -> Outcome {
    let alloc = Allocator::new(config.settings.clone(), config.capacity);
    let mut r = Replayer::new(alloc);
    r.run(requests, config.stop_at_failure, |_, _, _, _| {});
    r.outcome
}

/// The smallest capacity (a multiple of 2 MiB, the granule of every segment and page) with
/// which the run has no failure: a binary search, the model re-run each time. Assumes that a
/// larger device never fails where a smaller one fits (true of the allocator's rules in all
/// but contrived runs). `None` when even the largest capacity tried fails.
pub fn min_capacity(requests: &[Request], settings: &Settings) -> Option<u64> {
    let fits = |c: u64| {
        let cfg = Config {
            settings: settings.clone(),
            capacity: Some(c),
            stop_at_failure: true,
        };
        replay(requests, &cfg).first_failure.is_none()
    };
    let unlimited = replay(
        requests,
        &Config {
            settings: settings.clone(),
            capacity: None,
            stop_at_failure: false,
        },
    );
    let granule = ROUND_LARGE;
    let fraction = settings.memory_fraction.unwrap_or(1.0);
    let mut hi = ((unlimited.reserved_peak as f64 / fraction).ceil() as u64)
        .div_ceil(granule)
        .max(1);
    let mut tries = 0;
    while !fits(hi * granule) {
        hi = hi.saturating_mul(2);
        tries += 1;
        if tries > 20 {
            return None;
        }
    }
    if unlimited.requests == 0 {
        return Some(0);
    }
    // Invariant: fits(hi * granule), and !fits(lo * granule) (nothing fits in 0 bytes).
    let mut lo = 0;
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid * granule) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi * granule)
}

/// The replay's state: the model and the recorded blocks' handles.
pub(super) struct Replayer {
    pub(super) alloc: Allocator,
    /// Recorded address of a live block -> the model's handle for it and the stack of its
    /// request.
    pub(super) blocks: FxHashMap<u64, (Handle, u32)>,
    pub(super) outcome: Outcome,
    /// Replaying a recording with its own settings and addresses ([`super::check`]): each
    /// recorded segment release is made on the model's segment at that address, and recorded
    /// out-of-memory requests (whose releases are among the recorded ones) are not retried.
    pub(super) follow_recording: bool,
}

impl Replayer {
    pub(super) fn new(alloc: Allocator) -> Replayer {
        Replayer {
            alloc,
            blocks: FxHashMap::default(),
            outcome: Outcome::default(),
            follow_recording: false,
        }
    }

    /// Replays the requests; `served` sees each recorded malloc with the model's handle.
    pub(super) fn run(
        &mut self,
        requests: &[Request],
        stop_at_failure: bool,
        mut served: impl FnMut(&Allocator, usize, &Request, &Handle),
    ) {
        for (i, q) in requests.iter().enumerate() {
            match q.op {
                Op::OutOfMemory if self.follow_recording => {}
                Op::Malloc | Op::OutOfMemory => {
                    self.outcome.requests += 1;
                    match self.alloc.malloc(q.size, q.stream) {
                        Ok(h) => {
                            self.after_malloc(q.ns);
                            if q.op == Op::OutOfMemory {
                                self.alloc.free(h.id);
                            } else {
                                served(&self.alloc, i, q, &h);
                                if let Some((old, _)) = self.blocks.insert(q.addr, (h, q.stack)) {
                                    // Handed out twice without a free (a damaged trace).
                                    self.alloc.free(old.id);
                                }
                            }
                        }
                        Err(oom) => {
                            self.after_malloc(q.ns);
                            self.outcome.failures += 1;
                            if self.outcome.first_failure.is_none() {
                                self.outcome.first_failure = Some(Failure {
                                    index: i,
                                    ns: q.ns,
                                    stream: q.stream,
                                    stack: q.stack,
                                    requested: q.size,
                                    alloc_size: oom.alloc_size,
                                    reserved: oom.reserved,
                                    allocated: oom.allocated,
                                    live_blocks: self.blocks.len() as u64,
                                    live_by_stack: self.live_by_stack(),
                                });
                            }
                            if stop_at_failure {
                                break;
                            }
                        }
                    }
                }
                Op::FreeRequested => {
                    if let Some((h, _)) = self.blocks.get(&q.addr) {
                        self.alloc.free_requested(h.id);
                    }
                }
                Op::Free => {
                    if let Some((h, _)) = self.blocks.remove(&q.addr) {
                        self.alloc.free_completed(h.id);
                    }
                }
                Op::Acquire => {}
                Op::Release if self.follow_recording => {
                    if self.alloc.settings().expandable_segments {
                        // Pages are unmapped only by releasing the whole cache.
                        if i == 0 || requests[i - 1].op != Op::Release {
                            self.alloc.empty_cache();
                        }
                    } else {
                        self.alloc.release_segment(q.addr);
                    }
                }
                Op::Release => {
                    let starts_run = i == 0 || requests[i - 1].op != Op::Release;
                    let next = requests[i..].iter().find(|r| r.op != Op::Release);
                    let in_malloc_path =
                        matches!(next, Some(r) if matches!(r.op, Op::Acquire | Op::OutOfMemory));
                    if starts_run && !in_malloc_path {
                        self.alloc.empty_cache();
                    }
                }
            }
        }
        let s = self.alloc.stats();
        self.outcome.allocated_peak = s.peak_allocated;
        self.outcome.device_allocs = s.device_allocs;
        self.outcome.device_frees = s.device_frees;
    }

    fn live_by_stack(&self) -> Vec<(u32, u64)> {
        let mut by: FxHashMap<u32, u64> = FxHashMap::default();
        for (h, stack) in self.blocks.values() {
            *by.entry(*stack).or_default() += h.size;
        }
        let mut v: Vec<(u32, u64)> = by.into_iter().collect();
        v.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v.truncate(LIVE_STACKS);
        v
    }

    fn after_malloc(&mut self, ns: u64) {
        let s = self.alloc.stats();
        if s.reserved >= self.outcome.reserved_peak && s.reserved > 0 {
            self.outcome.reserved_peak = s.reserved;
            self.outcome.reserved_peak_ns = ns;
            self.outcome.fragmentation = s.reserved - s.allocated;
            self.outcome.inactive_split_at_peak = s.inactive_split;
            self.outcome.segments_at_peak = s.segments;
        }
    }
}
