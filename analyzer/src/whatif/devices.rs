//! A trace's devices as a model replays them: each device's requests in time order (the
//! memory events as [`crate::replay::memory_requests`] gives them, mapped onto the model's
//! [`Request`]s), its capacity, and what the recorded allocator reserved.

use poolsight_alloc_models::replay::Request;
use poolsight_schema::kinds::MarkKind;

use crate::read::{ChunkKind, Trace};
use crate::replay::{memory_requests, request_line, MemRequest, RequestKind};

/// The label frame `poolsight-import` gives a segment a snapshot held from before its trace
/// began (`poolsight_import::events::HELD_BEFORE`; the analyzer does not depend on the
/// importer, a test in the root crate checks the two agree).
pub const HELD_BEFORE: &str = "<held before the trace>";

/// Where a device's capacity came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapacitySource {
    /// Given by the caller (`--capacity`).
    Given,
    /// The device memory a poolsight trace recorded.
    Device,
    /// At a snapshot's recorded out-of-memory: the bytes reserved plus the device's free.
    AtOutOfMemory,
    None,
}

impl CapacitySource {
    /// As the table and the JSON say it.
    pub fn text(self) -> &'static str {
        match self {
            CapacitySource::Given => "--capacity",
            CapacitySource::Device => "the trace's device",
            CapacitySource::AtOutOfMemory => {
                "reserved plus device free at the recorded out-of-memory"
            }
            CapacitySource::None => "none",
        }
    }
}

/// One device of one trace: its requests and what is known of its memory.
#[derive(Debug, Clone)]
pub struct Device {
    pub device: u32,
    pub requests: Vec<Request>,
    pub capacity: Option<u64>,
    pub capacity_source: CapacitySource,
    /// The most bytes the recorded allocator held from the device.
    pub recorded_reserved_peak: u64,
    /// Bytes held from before the trace began (a snapshot that does not start empty).
    pub held_at_start: u64,
}

/// The devices of `trace` with their requests, capacity (`capacity` when given) and recorded
/// reserved peak; a trace without memory events has one empty device 0.
pub fn devices(trace: &Trace, capacity: Option<u64>) -> Vec<Device> {
    let all = memory_requests(trace);
    let mut ids: Vec<u32> = all.iter().map(|r| r.device).collect();
    ids.sort_unstable();
    ids.dedup();
    if ids.is_empty() {
        ids.push(0);
    }
    let device_free = device_free_marks(trace);
    ids.into_iter()
        .map(|dev| {
            let mine: Vec<&MemRequest> = all.iter().filter(|r| r.device == dev).collect();
            let (mut held, mut peak, mut start) = (0u64, 0u64, 0u64);
            let mut inferred = None;
            let mut frees = device_free.iter().filter(|(d, _)| *d == dev);
            for r in &mine {
                match r.kind {
                    RequestKind::Acquire => {
                        held = held.saturating_add(r.bytes);
                        if r.addr <= 1 || held_before(trace, r) {
                            start += r.bytes;
                        }
                    }
                    RequestKind::Release => held = held.saturating_sub(r.bytes),
                    RequestKind::OutOfMemory => {
                        if let Some((_, free)) = frees.next() {
                            inferred.get_or_insert(held.saturating_add(*free));
                        }
                    }
                    _ => {}
                }
                peak = peak.max(held);
            }
            let recorded_capacity = trace
                .defs
                .devices
                .iter()
                .find(|d| d.id == dev)
                .map(|d| d.capacity)
                .filter(|&c| c > 0);
            let (capacity, capacity_source) = match (capacity, recorded_capacity, inferred) {
                (Some(c), _, _) => (Some(c), CapacitySource::Given),
                (None, Some(c), _) => (Some(c), CapacitySource::Device),
                (None, None, Some(c)) if c > 0 => (Some(c), CapacitySource::AtOutOfMemory),
                _ => (None, CapacitySource::None),
            };
            // An observed device's acquisitions and releases mirror each block (an observer of
            // PyTorch's allocator sees no segments): they are not the allocator's decisions,
            // and a run of releases would read as `empty_cache()`.
            let observed = trace
                .defs
                .devices
                .iter()
                .find(|d| d.id == dev)
                .is_some_and(|d| d.observed);
            // Segments held from before the trace are the state the replay starts from (taken
            // from the snapshot's `segments`), not segments the trace recorded: the model reads
            // them as memory held from the start (address 1, as an importer writes a lump).
            let requests = mine
                .iter()
                .filter(|r| {
                    !(observed && matches!(r.kind, RequestKind::Acquire | RequestKind::Release))
                })
                .map(|r| Request {
                    op: r.kind,
                    stream: r.stream,
                    addr: if r.kind == RequestKind::Acquire && held_before(trace, r) {
                        1
                    } else {
                        r.addr
                    },
                    size: r.bytes,
                    ns: r.ns,
                    stack: r.stack,
                })
                .collect();
            Device {
                device: dev,
                requests,
                capacity,
                capacity_source,
                recorded_reserved_peak: peak,
                held_at_start: start,
            }
        })
        .collect()
}

/// Whether an acquisition is a segment a snapshot held from before its trace began.
fn held_before(trace: &Trace, r: &MemRequest) -> bool {
    r.stack != 0 && request_line(trace, r.stack).is_some_and(|l| l.ends_with(HELD_BEFORE))
}

/// The `device_free` marks of out-of-memory events, in time order: (device, free bytes).
fn device_free_marks(trace: &Trace) -> Vec<(u32, u64)> {
    let mut marks: Vec<(u64, u32, u64)> = trace
        .chunks
        .iter()
        .filter(|c| c.kind == ChunkKind::Mark)
        .flat_map(|c| trace.mark_events(c))
        .filter(|m| MarkKind::try_from(m.kind()) == Ok(MarkKind::DeviceFree))
        .map(|m| (m.ticks(), m.aux(), m.a()))
        .collect();
    marks.sort_by_key(|m| m.0);
    marks.into_iter().map(|(_, d, f)| (d, f)).collect()
}
