//! Why a run ran out of memory: one time-ordered walk over a trace's memory events that keeps
//! the allocator's state — its segments (device allocations: a snapshot's `segment_alloc`s and
//! the segments it held from the start, a pool's chunks) and the live blocks inside them — and
//! describes it at each out-of-memory event, or at the end of a trace that has none (a dump
//! taken by an OOM observer is its state at the OOM).
//!
//! A segment's free blocks are the gaps between its live blocks (the caching allocator merges
//! free neighbours, so each gap is one free block); a gap in a segment that also holds live
//! blocks is an inactive split block. A segment of 2 MiB is the small pool's (PyTorch's
//! `kSmallBuffer`: requests up to 1 MiB), any other the large pool's. A snapshot's blocks count
//! at the size the program asked for (its `alloc` entries record the request; a block held
//! from the start, its `requested_size`) rounded up to 512 B, the allocator's unit: the block
//! size is not in the trace, so a block the allocator left unsplit can look up to 1 MiB
//! smaller than it is.

use std::collections::{BTreeMap, HashMap};

use poolsight_schema::fb;
use serde::Serialize;

use super::fold::Effect;
use super::merge::{sorted_marks, walk, Sink};
use super::stacks::frames_of_stack;
use super::{Frame, Units};
use crate::read::names::FrameKind;
use crate::read::Trace;

/// PyTorch's small pool's segments (`kSmallBuffer`) and its largest request (`kSmallSize`).
const SMALL_SEGMENT: u64 = 2 << 20;
const SMALL_REQUEST: u64 = 1 << 20;
/// The caching allocator's unit (`kMinBlockSize`).
const UNIT: u64 = 512;
/// Lines listed in `top_lines`.
const TOP_LINES: usize = 10;

/// The allocator's state at an out-of-memory (or at the end of a trace without one).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct OomState {
    /// The trace, when several were read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace: Option<String>,
    /// When, ns since the trace's start.
    pub ns: u64,
    pub device: u32,
    /// The bytes asked for (`None`: no OOM in the file; the state at its end).
    pub requested_bytes: Option<u64>,
    /// The request as PyTorch's allocator rounds it (`round_size`, default settings).
    pub rounded_bytes: Option<u64>,
    /// The pool the request goes to (`small` up to 1 MiB, else `large`).
    pub request_pool: Option<&'static str>,
    pub stream: u32,
    /// What CUDA reported free on the device at the OOM, where the file says.
    pub device_free_bytes: Option<u64>,
    /// Bytes held from the device (the segments).
    pub reserved_bytes: u64,
    /// Bytes of live blocks.
    pub allocated_bytes: u64,
    pub reserved_unallocated_bytes: u64,
    pub pools: Vec<PoolState>,
    pub live_by_category: BTreeMap<String, u64>,
    pub top_lines: Vec<LineBytes>,
    /// The stack of the request that failed, innermost last (`file:line:name`).
    pub request_stack: Vec<String>,
    pub advice: Vec<String>,
}

/// One pool of one stream.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PoolState {
    pub pool: &'static str,
    pub stream: u32,
    pub segments: u64,
    pub reserved_bytes: u64,
    pub free_bytes: u64,
    pub largest_free_block_bytes: u64,
    /// Free blocks in segments that also hold live blocks (split, not returnable).
    pub inactive_split_blocks: u64,
    pub inactive_split_bytes: u64,
}

/// Live bytes of one line (a stack's innermost frame with a file and line).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LineBytes {
    pub line: String,
    pub bytes: u64,
}

#[derive(Debug, Clone, Copy)]
struct Segment {
    size: u64,
    stream: u32,
}

#[derive(Debug, Clone, Copy)]
struct Block {
    size: u64,
    stack: u32,
}

/// The walk: the state, and each OOM's description as it happens.
struct Walk<'t> {
    trace: &'t Trace,
    /// (device, address) -> segment; a segment without an address (memory held from the start
    /// whose layout the file does not give) is in `unplaced`.
    segments: BTreeMap<(u32, u64), Segment>,
    unplaced: HashMap<u32, u64>,
    blocks: BTreeMap<(u32, u64), Block>,
    states: Vec<OomState>,
    /// When each of `states` happened, in ticks.
    oom_ticks: Vec<u64>,
    stacks: HashMap<u32, Vec<Frame>>,
    last_ticks: u64,
    units: Units,
}

/// The state at each out-of-memory of `trace`, in order; with none, the state at its end
/// for each device that held memory.
pub fn oom_states(trace: &Trace) -> Vec<OomState> {
    let mut w = Walk {
        trace,
        segments: BTreeMap::new(),
        unplaced: HashMap::new(),
        blocks: BTreeMap::new(),
        states: Vec::new(),
        oom_ticks: Vec::new(),
        stacks: HashMap::new(),
        last_ticks: trace.header.ticks0,
        units: Units::of(trace),
    };
    walk(trace, &mut w, None);
    // The device's free bytes, reported by a `DeviceFree` mark at the moment of its OOM.
    let free: HashMap<(u32, u64), u64> = sorted_marks(trace)
        .iter()
        .filter(|m| m.kind() == fb::MarkKind::DeviceFree)
        .map(|m| ((m.aux(), m.ticks()), m.a()))
        .collect();
    for (s, &at) in w.states.iter_mut().zip(&w.oom_ticks) {
        // Else, for a device of known capacity (a pool's), what its segments leave of it.
        let capacity = trace
            .defs
            .devices
            .iter()
            .find(|d| d.id == s.device && d.capacity > 0)
            .map(|d| d.capacity.saturating_sub(s.reserved_bytes));
        if let Some(f) = free.get(&(s.device, at)).copied().or(capacity) {
            s.device_free_bytes = Some(f);
            s.advice = advice(s);
        }
    }
    if w.states.is_empty() {
        let mut devices: Vec<u32> = w
            .segments
            .keys()
            .map(|k| k.0)
            .chain(w.blocks.keys().map(|k| k.0))
            .chain(w.unplaced.keys().copied())
            .collect();
        devices.sort_unstable();
        devices.dedup();
        for d in devices {
            let s = w.state(w.last_ticks, d, None, 0, 0);
            w.states.push(s);
        }
    }
    w.states
}

impl Sink for Walk<'_> {
    fn mem(&mut self, ticks: u64, e: &fb::MemEvent) -> bool {
        self.last_ticks = self.last_ticks.max(ticks);
        let d = e.device() as u32;
        // The allocator's own layout: blocks at the size asked (the rounding is the model's,
        // not the recorded pool's), segments as the device gave them.
        match Effect::of(e, &self.units) {
            Effect::Malloc { size } if size > 0 => {
                self.blocks.insert(
                    (d, e.ptr()),
                    Block {
                        size: e.bytes(),
                        stack: e.stack(),
                    },
                );
            }
            Effect::Free { .. } => {
                self.blocks.remove(&(d, e.ptr()));
            }
            // What is live by line and category follows the block to its new stack.
            Effect::Relabel => {
                if let Some(b) = self.blocks.get_mut(&(d, e.ptr())) {
                    b.stack = e.stack();
                }
            }
            Effect::Acquire { bytes } => {
                // Memory held from the start without a layout is written at address 1.
                if e.ptr() <= 1 {
                    *self.unplaced.entry(d).or_default() += bytes;
                } else {
                    self.segments.insert(
                        (d, e.ptr()),
                        Segment {
                            size: bytes,
                            stream: e.stream() as u32,
                        },
                    );
                }
            }
            Effect::Release { bytes } => {
                let placed = self.segments.remove(&(d, e.ptr())).is_some();
                if !placed {
                    let u = self.unplaced.entry(d).or_default();
                    *u = u.saturating_sub(bytes);
                }
            }
            Effect::OutOfMemory { bytes } => {
                let s = self.state(ticks, d, Some(bytes), e.stream() as u32, e.stack());
                self.oom_ticks.push(ticks);
                self.states.push(s);
            }
            _ => {}
        }
        true
    }

    fn mark(&mut self, _: &fb::MarkEvent) {}
}

/// PyTorch's `round_size` with default settings: at least 512 B, a multiple of 512 B.
pub fn round_size(bytes: u64) -> u64 {
    bytes.max(1).div_ceil(UNIT).saturating_mul(UNIT)
}

fn pool_of_segment(size: u64) -> &'static str {
    if size == SMALL_SEGMENT {
        "small"
    } else {
        "large"
    }
}

impl Walk<'_> {
    fn frames(&mut self, stack: u32) -> &[Frame] {
        let trace = self.trace;
        self.stacks
            .entry(stack)
            .or_insert_with(|| frames_of_stack(trace, stack))
    }

    fn state(
        &mut self,
        ticks: u64,
        device: u32,
        requested: Option<u64>,
        stream: u32,
        stack: u32,
    ) -> OomState {
        let mut pools: BTreeMap<(&'static str, u32), PoolState> = BTreeMap::new();
        let blocks: Vec<(u64, Block)> = self
            .blocks
            .range((device, 0)..=(device, u64::MAX))
            .map(|(&(_, a), &b)| (a, b))
            .collect();
        let mut reserved = self.unplaced.get(&device).copied().unwrap_or(0);
        for (&(_, addr), seg) in self.segments.range((device, 0)..=(device, u64::MAX)) {
            reserved += seg.size;
            let end = addr.saturating_add(seg.size);
            let pool = pool_of_segment(seg.size);
            let p = pools.entry((pool, seg.stream)).or_insert(PoolState {
                pool,
                stream: seg.stream,
                ..PoolState::default()
            });
            p.segments += 1;
            p.reserved_bytes += seg.size;
            // The gaps between the live blocks inside the segment.
            let first = blocks.partition_point(|&(a, _)| a < addr);
            let mut at = addr;
            let mut gaps: Vec<u64> = Vec::new();
            let mut live_inside = false;
            for &(a, b) in blocks[first..].iter().take_while(|&&(a, _)| a < end) {
                live_inside = true;
                if a > at {
                    gaps.push(a - at);
                }
                at = at.max(a.saturating_add(round_size(b.size)).min(end));
            }
            if end > at {
                gaps.push(end - at);
            }
            for g in gaps {
                p.free_bytes += g;
                p.largest_free_block_bytes = p.largest_free_block_bytes.max(g);
                if live_inside {
                    p.inactive_split_blocks += 1;
                    p.inactive_split_bytes += g;
                }
            }
        }
        let allocated: u64 = blocks.iter().map(|(_, b)| b.size).sum();
        // What was live, by category and by line.
        let mut by_category: BTreeMap<String, u64> = BTreeMap::new();
        let mut by_line: HashMap<String, u64> = HashMap::new();
        for &(_, b) in &blocks {
            let frames = self.frames(b.stack);
            let category = frames
                .iter()
                .rev()
                .find(|f| f.kind == FrameKind::Label)
                .map_or_else(|| "(unlabelled)".to_string(), |f| f.name.to_string());
            let refs: Vec<&Frame> = frames.iter().collect();
            let line = user_line(&refs);
            *by_category.entry(category).or_default() += b.size;
            *by_line.entry(line).or_default() += b.size;
        }
        let mut top_lines: Vec<LineBytes> = by_line
            .into_iter()
            .map(|(line, bytes)| LineBytes { line, bytes })
            .collect();
        top_lines.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.line.cmp(&b.line)));
        top_lines.truncate(TOP_LINES);
        let request_stack = match requested {
            Some(_) if stack != 0 => self
                .frames(stack)
                .iter()
                .filter(|f| f.kind != FrameKind::Label)
                .map(Frame::key)
                .collect(),
            _ => Vec::new(),
        };
        let rounded = requested.map(round_size);
        let mut s = OomState {
            trace: None,
            ns: self.trace.ns_since_start(ticks),
            device,
            requested_bytes: requested,
            rounded_bytes: rounded,
            request_pool: rounded.map(|r| if r <= SMALL_REQUEST { "small" } else { "large" }),
            stream,
            device_free_bytes: None,
            reserved_bytes: reserved,
            allocated_bytes: allocated,
            reserved_unallocated_bytes: reserved.saturating_sub(allocated),
            pools: pools.into_values().collect(),
            live_by_category: by_category,
            top_lines,
            request_stack,
            advice: Vec::new(),
        };
        s.advice = advice(&s);
        s
    }
}

/// Where bytes were allocated, as a person reads it: the innermost frame with a file and a
/// line (the user's line, in the `user` frames of a PyTorch file), else the innermost frame
/// that is not a label, with the operator inside it when there is one.
pub fn user_line(frames: &[&Frame]) -> String {
    let shown: Vec<&Frame> = frames
        .iter()
        .copied()
        .filter(|f| f.kind != FrameKind::Label)
        .collect();
    let Some(last) = shown.last() else {
        return "(no stack)".to_string();
    };
    match shown.iter().rposition(|f| !f.file.is_empty() && f.line > 0) {
        Some(i) => {
            let f = shown[i];
            let mut s = format!("{}:{}:{}", f.file, f.line, f.name);
            if i + 1 < shown.len() {
                s.push_str(&format!(" > {}", last.name));
            }
            s
        }
        // No located frame (a backward operator on the autograd engine's thread): the
        // operator, under its autograd node.
        None => match shown.len() {
            1 => last.name.to_string(),
            n => format!("{} > {}", shown[n - 2].name, last.name),
        },
    }
}

fn human(b: u64) -> String {
    crate::units::humanized(b)
}

/// Which allocator setting would plausibly help, and why, from the figures alone.
/// The smallest `max_split_size_mb` PyTorch accepts, in bytes.
const MIN_MAX_SPLIT: u64 = 20 << 20;

fn advice(s: &OomState) -> Vec<String> {
    let mut out = Vec::new();
    let Some(req) = s.rounded_bytes else {
        if s.reserved_unallocated_bytes > 0 {
            out.push(format!(
                "{} reserved but unallocated at the end ({} largest free block)",
                human(s.reserved_unallocated_bytes),
                human(
                    s.pools
                        .iter()
                        .map(|p| p.largest_free_block_bytes)
                        .max()
                        .unwrap_or(0)
                )
            ));
        }
        return out;
    };
    let pool = s.request_pool.unwrap_or("large");
    let same: Vec<&PoolState> = s
        .pools
        .iter()
        .filter(|p| p.pool == pool && p.stream == s.stream)
        .collect();
    let largest_here = same
        .iter()
        .map(|p| p.largest_free_block_bytes)
        .max()
        .unwrap_or(0);
    let free_here: u64 = same.iter().map(|p| p.free_bytes).sum();
    let free_elsewhere: u64 = s
        .pools
        .iter()
        .filter(|p| p.stream != s.stream)
        .map(|p| p.free_bytes)
        .sum();
    let free_total: u64 = s.pools.iter().map(|p| p.free_bytes).sum();
    let device_free = s.device_free_bytes.unwrap_or(0);
    if largest_here >= req {
        out.push(format!(
            "a free block of {} on this stream's {pool} pool would hold the request: the file \
             does not explain the failure (a memory fraction or another process's use?)",
            human(largest_here)
        ));
        return out;
    }
    if free_here >= req {
        out.push(format!(
            "fragmentation: {} is free in this stream's {pool} pool, but in blocks of at most {} \
             (the request needs {} in one block). expandable_segments:True maps memory into one \
             growing segment per stream, so free pieces join up instead of staying apart (`poolsight \
             whatif --setting expandable_segments:True` replays the run to check)",
            human(free_here),
            human(largest_here),
            human(req)
        ));
    }
    let split: u64 = same.iter().map(|p| p.inactive_split_bytes).sum();
    // PyTorch refuses max_split_size_mb below 20: below that size no setting keeps a block of
    // the request's size whole.
    if pool == "large" && split >= req && req >= MIN_MAX_SPLIT {
        out.push(format!(
            "{} sits in inactive split blocks of large segments: max_split_size_mb (set to about \
             {} or less) stops the allocator from splitting blocks larger than that, so large \
             free blocks stay whole for large requests (`poolsight whatif --setting \
             max_split_size_mb:{}` replays the run to check)",
            human(split),
            req >> 20,
            req >> 20
        ));
    }
    if free_elsewhere >= req {
        out.push(format!(
            "{} is free in segments of other streams, which this stream cannot use (a block is \
             reused only on its stream): allocate on one stream, or free the others' cache with \
             torch.cuda.empty_cache()",
            human(free_elsewhere)
        ));
    }
    if free_total + device_free < req {
        let mut cats: Vec<(&String, &u64)> = s.live_by_category.iter().collect();
        cats.sort_by(|a, b| b.1.cmp(a.1));
        let top: Vec<String> = cats
            .iter()
            .take(3)
            .map(|(c, b)| format!("{c} {}", human(**b)))
            .collect();
        out.push(format!(
            "the live tensors themselves need more: {} allocated, {} free in the cache and {} \
             on the device, {} asked; no allocator setting makes it fit. Largest: {}",
            human(s.allocated_bytes),
            human(free_total),
            human(device_free),
            human(req),
            top.join(", ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(pools: Vec<PoolState>, req: u64, device_free: u64) -> OomState {
        OomState {
            requested_bytes: Some(req),
            rounded_bytes: Some(round_size(req)),
            request_pool: Some(if req <= SMALL_REQUEST {
                "small"
            } else {
                "large"
            }),
            device_free_bytes: Some(device_free),
            pools,
            ..OomState::default()
        }
    }

    fn large(free: u64, largest: u64, split: u64, stream: u32) -> PoolState {
        PoolState {
            pool: "large",
            stream,
            segments: 2,
            free_bytes: free,
            largest_free_block_bytes: largest,
            inactive_split_blocks: 2,
            inactive_split_bytes: split,
            ..PoolState::default()
        }
    }

    #[test]
    fn the_advice_follows_the_figures() {
        let m = 1u64 << 20;
        // Enough free in pieces: fragmentation, expandable segments.
        let a = advice(&state(vec![large(9 * m, 3 * m, 9 * m, 0)], 6 * m, 0));
        assert!(a.iter().any(|s| s.contains("expandable_segments")), "{a:?}");
        // A 6 MiB request: no max_split_size_mb PyTorch accepts (20 and up) keeps such a
        // block whole; a 24 MiB one: max_split_size_mb:24.
        assert!(!a.iter().any(|s| s.contains("max_split_size_mb")), "{a:?}");
        let a = advice(&state(vec![large(90 * m, 12 * m, 90 * m, 0)], 24 * m, 0));
        assert!(
            a.iter()
                .any(|s| s.contains("--setting max_split_size_mb:24`")),
            "{a:?}"
        );
        // Free on another stream only.
        let a = advice(&state(
            vec![large(0, 0, 0, 0), large(9 * m, 9 * m, 0, 1)],
            6 * m,
            0,
        ));
        assert!(a.iter().any(|s| s.contains("other streams")), "{a:?}");
        assert!(!a.iter().any(|s| s.contains("expandable")), "{a:?}");
        // Nothing free anywhere: no setting helps.
        let a = advice(&state(vec![large(m, m, m, 0)], 6 * m, m));
        assert!(
            a.iter().any(|s| s.contains("no allocator setting")),
            "{a:?}"
        );
        assert_eq!(a.len(), 1, "{a:?}");
    }

    #[test]
    fn requests_round_as_pytorchs_allocator_rounds_them() {
        assert_eq!(round_size(1), 512);
        assert_eq!(round_size(512), 512);
        assert_eq!(round_size(513), 1024);
        assert_eq!(round_size(0), 512);
    }
}
