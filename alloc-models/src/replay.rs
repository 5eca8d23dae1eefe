//! A run's requests replayed through a model under a device capacity, whatever the model:
//! reserved bytes at their peak, fragmentation there, and the first request that would not
//! fit; and the smallest capacity the run fits in. Each model ([`crate::pytorch`],
//! [`crate::cupy`]) is a [`Model`]; the replay is the same for all.
//!
//! Requests name blocks by the addresses the recorded run gave them; the replay maps each to
//! the block the model handed out, so a free reaches the right block whatever the model placed
//! where.

use rustc_hash::FxHashMap;

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
    /// own decisions; [`crate::pytorch::check`] compares them with these).
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

/// An allocator's byte counts now and at their peaks (PyTorch's `memory_stats` names).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Bytes held from the device (`reserved_bytes`).
    pub reserved: u64,
    /// Bytes of blocks handed out and not yet freed (`allocated_bytes`).
    pub allocated: u64,
    /// Free bytes in split segments, outside expandable segments (`inactive_split_bytes`).
    pub inactive_split: u64,
    /// Segments held (`segment`), expandable segments counting one each.
    pub segments: u64,
    pub peak_reserved: u64,
    pub peak_allocated: u64,
    /// Device allocations (`num_device_alloc`) and frees (`num_device_free`).
    pub device_allocs: u64,
    pub device_frees: u64,
}

/// A request the allocator could not serve (`OutOfMemoryError`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Oom {
    /// Bytes asked.
    pub requested: u64,
    /// The request rounded.
    pub size: u64,
    /// The device allocation it needed: "Tried to allocate".
    pub alloc_size: u64,
    /// Reserved and allocated bytes when it failed (after the cache was released).
    pub reserved: u64,
    pub allocated: u64,
}

/// An allocator a run can be replayed through.
pub trait Model {
    /// A block handed out, as the model names it for the free.
    type Block: Copy;

    /// Serves a request of `size` bytes on `stream`, or fails as the allocator would.
    fn malloc(&mut self, size: u64, stream: u32) -> Result<Self::Block, Oom>;
    /// The bytes a block handed out holds.
    fn block_size(block: &Self::Block) -> u64;
    /// The free of `block` is requested: other streams may still use it until
    /// [`Model::free_completed`].
    fn free_requested(&mut self, block: Self::Block);
    /// The free of `block` completes (requested before or not).
    fn free_completed(&mut self, block: Self::Block);
    /// `torch.cuda.empty_cache()`, CuPy's `free_all_blocks()`: cached memory goes back to
    /// the device.
    fn empty_cache(&mut self);
    fn stats(&self) -> Stats;
    /// A recorded device release replayed on the model's own segment at `addr`, when the
    /// model follows a recording's own device allocations; `first_of_run` when the release
    /// before it was not one. Only a model that can be checked against a recording needs it.
    fn release_recorded(&mut self, _addr: u64, _first_of_run: bool) {}
}

/// The first request the model could not serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// Its index in the requests.
    pub index: usize,
    pub ns: u64,
    pub stream: u32,
    pub stack: u32,
    /// Bytes asked, and the device allocation it needed.
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

/// Replays `requests` through `model`; with `stop_at_failure`, stops at the first request
/// that does not fit (a search needs no more).
pub fn replay<M: Model>(model: M, requests: &[Request], stop_at_failure: bool) -> Outcome {
    let mut r = Replayer::new(model);
    r.run(requests, stop_at_failure, |_, _, _, _| {});
    r.outcome
}

/// The smallest capacity, a multiple of `granule` bytes, with which the run has no failure:
/// a binary search between `floor` (every capacity below it fails) and `start` bytes (the
/// first tried above; doubled until the run fits), the model (`model(capacity)`) re-run each
/// time. Assumes that a larger device never fails where a smaller one fits (true of the
/// allocators' rules in all but contrived runs). `None` when even the largest capacity tried
/// fails.
pub fn min_capacity<M: Model>(
    requests: &[Request],
    granule: u64,
    floor: u64,
    start: u64,
    model: impl Fn(Option<u64>) -> M,
) -> Option<u64> {
    if !requests
        .iter()
        .any(|r| matches!(r.op, Op::Malloc | Op::OutOfMemory))
    {
        return Some(0);
    }
    let fits = |c: u64| {
        replay(model(Some(c)), requests, true)
            .first_failure
            .is_none()
    };
    // Invariant: !fits(lo * granule) (nothing fits in 0 bytes, nor below the floor).
    let mut lo = floor.saturating_sub(1) / granule;
    let mut hi = start.div_ceil(granule).max(lo + 1);
    let mut tries = 0;
    while !fits(hi.saturating_mul(granule)) {
        lo = hi;
        hi = hi.saturating_mul(2);
        tries += 1;
        if tries > 20 {
            return None;
        }
    }
    // Invariant: fits(hi * granule) and !fits(lo * granule).
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

/// The most bytes the run's requests hold at once, as asked (before any rounding): a block
/// counts from its request to the request of its free. No allocator serves the run in less.
pub fn requested_peak(requests: &[Request]) -> u64 {
    let mut live: FxHashMap<u64, u64> = FxHashMap::default();
    let (mut now, mut peak) = (0u64, 0u64);
    for r in requests {
        match r.op {
            Op::Malloc => {
                if let Some(old) = live.insert(r.addr, r.size) {
                    now -= old;
                }
                now += r.size;
            }
            Op::OutOfMemory => peak = peak.max(now.saturating_add(r.size)),
            Op::FreeRequested | Op::Free => {
                if let Some(s) = live.remove(&r.addr) {
                    now -= s;
                }
            }
            Op::Acquire | Op::Release => {}
        }
        peak = peak.max(now);
    }
    peak
}

/// The replay's state: the model and the recorded blocks' handles.
pub(crate) struct Replayer<M: Model> {
    pub(crate) model: M,
    /// Recorded address of a live block -> the model's block and the stack of its request.
    pub(crate) blocks: FxHashMap<u64, (M::Block, u32)>,
    pub(crate) outcome: Outcome,
    /// Replaying a recording with its own settings and addresses ([`crate::pytorch::check`]):
    /// each recorded segment release is made on the model's segment at that address, and
    /// recorded out-of-memory requests (whose releases are among the recorded ones) are not
    /// retried.
    pub(crate) follow_recording: bool,
}

impl<M: Model> Replayer<M> {
    pub(crate) fn new(model: M) -> Replayer<M> {
        Replayer {
            model,
            blocks: FxHashMap::default(),
            outcome: Outcome::default(),
            follow_recording: false,
        }
    }

    /// Replays the requests; `served` sees each recorded malloc with the model's block.
    pub(crate) fn run(
        &mut self,
        requests: &[Request],
        stop_at_failure: bool,
        mut served: impl FnMut(&M, usize, &Request, &M::Block),
    ) {
        for (i, q) in requests.iter().enumerate() {
            let first_of_run = i == 0 || requests[i - 1].op != Op::Release;
            match q.op {
                Op::OutOfMemory if self.follow_recording => {}
                Op::Malloc | Op::OutOfMemory => {
                    self.outcome.requests += 1;
                    match self.model.malloc(q.size, q.stream) {
                        Ok(b) => {
                            self.after_malloc(q.ns);
                            if q.op == Op::OutOfMemory {
                                self.model.free_completed(b);
                            } else {
                                served(&self.model, i, q, &b);
                                if let Some((old, _)) = self.blocks.insert(q.addr, (b, q.stack)) {
                                    // Handed out twice without a free (a damaged trace).
                                    self.model.free_completed(old);
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
                    if let Some((b, _)) = self.blocks.get(&q.addr) {
                        self.model.free_requested(*b);
                    }
                }
                Op::Free => {
                    if let Some((b, _)) = self.blocks.remove(&q.addr) {
                        self.model.free_completed(b);
                    }
                }
                Op::Acquire => {}
                Op::Release if self.follow_recording => {
                    self.model.release_recorded(q.addr, first_of_run);
                }
                Op::Release => {
                    let next = requests[i..].iter().find(|r| r.op != Op::Release);
                    let in_malloc_path =
                        matches!(next, Some(r) if matches!(r.op, Op::Acquire | Op::OutOfMemory));
                    if first_of_run && !in_malloc_path {
                        self.model.empty_cache();
                    }
                }
            }
        }
        let s = self.model.stats();
        self.outcome.allocated_peak = s.peak_allocated;
        self.outcome.device_allocs = s.device_allocs;
        self.outcome.device_frees = s.device_frees;
    }

    fn live_by_stack(&self) -> Vec<(u32, u64)> {
        let mut by: FxHashMap<u32, u64> = FxHashMap::default();
        for (b, stack) in self.blocks.values() {
            *by.entry(*stack).or_default() += M::block_size(b);
        }
        let mut v: Vec<(u32, u64)> = by.into_iter().collect();
        v.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v.truncate(LIVE_STACKS);
        v
    }

    fn after_malloc(&mut self, ns: u64) {
        let s = self.model.stats();
        if s.reserved >= self.outcome.reserved_peak && s.reserved > 0 {
            self.outcome.reserved_peak = s.reserved;
            self.outcome.reserved_peak_ns = ns;
            self.outcome.fragmentation = s.reserved - s.allocated;
            self.outcome.inactive_split_at_peak = s.inactive_split;
            self.outcome.segments_at_peak = s.segments;
        }
    }
}
