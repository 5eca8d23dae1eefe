//! The model checked against the real allocator: a recording's allocs and frees replayed with
//! its own settings should reproduce its device allocations (same number, sizes and order)
//! and place every block at the same offset in the same segment.
//!
//! The model's `cudaMalloc` returns, in order, the addresses the recorded one did (while they
//! overlap nothing the model holds), so that best fit breaks ties between equal blocks by the
//! same addresses as the real run.

use std::collections::BTreeMap;

use rustc_hash::FxHashSet;

use super::allocator::{round_size, Allocator, SegmentOp};
use super::settings::Settings;
use super::{MIN_BLOCK, SMALL_BUFFER, SMALL_SIZE};
use crate::replay::{Op, Replayer, Request};

/// A segment a snapshot held when it was taken (its `segments`), for a recording that did not
/// begin with the allocator empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub addr: u64,
    pub size: u64,
    pub small: bool,
    /// Its blocks handed out then: address, size.
    pub allocated: Vec<(u64, u64)>,
}

/// How far the model agrees with a recording.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Agreement {
    /// Device allocations (`segment_alloc` / `segment_map`) recorded, and made by the model.
    pub segments_recorded: u64,
    pub segments_simulated: u64,
    /// Positions where both made an allocation of the same size (in order).
    pub segments_matching: u64,
    /// Recorded allocations inside a segment the recording allocated, and of those, the ones
    /// the model placed in the same segment (by order) at the same offset.
    pub blocks_checked: u64,
    pub block_offsets_matching: u64,
    /// Whether the recording starts with the allocator empty (no memory held from before it
    /// began).
    pub starts_empty: bool,
    /// When it does not: the segments the model starts with, as the snapshot's `segments` and
    /// its entries imply them (0 when they could not be told: the model then starts empty, and
    /// agreement is not expected).
    pub initial_segments: u64,
    /// The first disagreement, in words.
    pub first_mismatch: Option<String>,
}

impl Agreement {
    /// Every segment and every block checked agrees.
    pub fn exact(&self) -> bool {
        self.segments_recorded == self.segments_simulated
            && self.segments_matching == self.segments_recorded
            && self.block_offsets_matching == self.blocks_checked
    }
}

/// A segment to start from: where, its stream and pool, and its blocks live from the start
/// (recorded address, block size).
struct Seed {
    addr: u64,
    size: u64,
    stream: u32,
    small: bool,
    blocks: Vec<(u64, u64)>,
}

/// The state a recording began in, from what it held at its end (`held`) and what its entries
/// did: the segments held at the end that no entry allocated, and those an entry freed before
/// any allocated them; in them, the blocks live from the start (the importer writes them as
/// allocations before the held-from-the-start lump). A block still held at the end has its
/// size from `segments`; another its request rounded, grown over a gap too small to have been
/// split off. Returns the index of the first request after the initial ones, and the seeds.
fn initial_state(
    requests: &[Request],
    held: &[Held],
    settings: &Settings,
) -> Option<(usize, Vec<Seed>)> {
    let lump = requests
        .iter()
        .position(|r| r.op == Op::Acquire && r.addr <= 1)?;
    let initial: Vec<&Request> = requests[..lump]
        .iter()
        .filter(|r| r.op == Op::Malloc)
        .collect();
    let rest = &requests[lump + 1..];
    let mut acquired: FxHashSet<u64> = FxHashSet::default();
    let mut seeds: Vec<Seed> = Vec::new();
    for r in rest {
        match r.op {
            Op::Acquire => {
                acquired.insert(r.addr);
            }
            Op::Release if r.addr > 1 && !acquired.contains(&r.addr) => {
                acquired.insert(r.addr);
                seeds.push(Seed {
                    addr: r.addr,
                    size: r.size,
                    stream: r.stream,
                    small: r.size == SMALL_BUFFER,
                    blocks: Vec::new(),
                });
            }
            _ => {}
        }
    }
    for h in held {
        if !acquired.contains(&h.addr) {
            seeds.push(Seed {
                addr: h.addr,
                size: h.size,
                stream: 0,
                small: h.small,
                blocks: Vec::new(),
            });
        }
    }
    seeds.sort_by_key(|s| s.addr);
    // Blocks held at the end and freed by no entry: their sizes are known.
    let freed: FxHashSet<u64> = rest
        .iter()
        .filter(|r| r.op == Op::Free)
        .map(|r| r.addr)
        .collect();
    let end_size = |addr: u64| {
        held.iter()
            .flat_map(|h| &h.allocated)
            .find(|b| b.0 == addr)
            .map(|b| b.1)
    };
    for seed in &mut seeds {
        let end = seed.addr.saturating_add(seed.size);
        let mut mine: Vec<&&Request> = initial
            .iter()
            .filter(|r| r.addr >= seed.addr && r.addr < end)
            .collect();
        mine.sort_by_key(|r| r.addr);
        for (i, r) in mine.iter().enumerate() {
            let next = mine.get(i + 1).map_or(end, |n| n.addr);
            let size = match end_size(r.addr).filter(|_| !freed.contains(&r.addr)) {
                Some(s) => s,
                None => {
                    let s = round_size(settings, r.size).min(next - r.addr);
                    let gap = next - r.addr - s;
                    let whole = if seed.small {
                        gap < MIN_BLOCK
                    } else {
                        gap <= SMALL_SIZE || s >= settings.max_split_size
                    };
                    if whole {
                        s + gap
                    } else {
                        s
                    }
                }
            };
            seed.blocks.push((r.addr, size));
        }
        // The stream of the first entry inside the segment.
        if let Some(r) = requests
            .iter()
            .find(|r| matches!(r.op, Op::Malloc | Op::Free) && r.addr >= seed.addr && r.addr < end)
        {
            seed.stream = r.stream;
        }
    }
    Some((lump + 1, seeds))
}

/// Replays `requests` (one device's) with `settings` and compares the model's decisions with
/// the recorded ones. `held`: the snapshot's segments at its end, from which a recording that
/// did not begin empty gets its initial state.
pub fn check(
    requests: &[Request],
    settings: &Settings,
    capacity: Option<u64>,
    held: &[Held],
) -> Agreement {
    // A held-from-the-start lump (the importer writes it at address 0 or 1) or a block
    // allocated before any segment means the allocator was not empty when recording began.
    let recorded: Vec<&Request> = requests
        .iter()
        .filter(|r| r.op == Op::Acquire && r.addr > 1)
        .collect();
    let lump = requests.iter().any(|r| r.op == Op::Acquire && r.addr <= 1);
    let first = requests
        .iter()
        .find(|r| matches!(r.op, Op::Acquire | Op::Malloc));
    let starts_empty = !lump && first.is_none_or(|r| r.op == Op::Acquire);

    let mut alloc = Allocator::new(settings.clone(), capacity)
        .with_log()
        .with_address_hints(recorded.iter().map(|r| r.addr));
    // The recorded segments live as the replay reaches each request: address -> (size,
    // ordinal). Mapped ranges of expandable segments that touch are one range.
    let mut live: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    let mut ordinal = 0u64;
    let mut seeded = Vec::new();
    let mut start = 0;
    let mut initial_segments = 0;
    if !starts_empty && !held.is_empty() && !settings.expandable_segments {
        if let Some((from, seeds)) = initial_state(requests, held, settings) {
            start = from;
            initial_segments = seeds.len() as u64;
            for s in seeds {
                let handles = alloc.seed_segment(s.addr, s.size, s.stream, s.small, &s.blocks);
                seeded.extend(
                    s.blocks
                        .iter()
                        .map(|b| b.0)
                        .zip(handles.into_iter().map(|h| (h, 0))),
                );
                live.insert(s.addr, (s.size, ordinal));
                ordinal += 1;
            }
        }
    }
    let requests = &requests[start..];
    let mut r = Replayer::new(alloc);
    r.blocks.extend(seeded);
    r.follow_recording = true;
    let expandable = settings.expandable_segments;

    let mut at = 0usize;
    let mut checked = 0u64;
    let mut matching = 0u64;
    let mut first_mismatch: Option<String> = None;
    // The replay calls back at each served malloc; catch the recorded segments up to it.
    let served = |a: &Allocator, idx: usize, q: &Request, h: &super::allocator::Handle| {
        while at < idx {
            let e = &requests[at];
            match e.op {
                Op::Acquire if e.addr > 1 => {
                    add_range(&mut live, e.addr, e.size, ordinal, expandable);
                    ordinal += 1;
                }
                Op::Release if e.addr > 1 => remove_range(&mut live, e.addr, e.size),
                _ => {}
            }
            at += 1;
        }
        let Some((&base, &(size, ord))) = live.range(..=q.addr).next_back() else {
            return;
        };
        if q.addr >= base.saturating_add(size) {
            return;
        }
        checked += 1;
        let same = match a.segment_of(h.addr) {
            Some((mbase, mord)) => h.addr - mbase == q.addr - base && (expandable || mord == ord),
            None => false,
        };
        if same {
            matching += 1;
        } else if first_mismatch.is_none() {
            first_mismatch = Some(format!(
                "the block of {} bytes at {} ns: recorded at offset {} of segment {}, \
                 the model's at offset {} of segment {}",
                q.size,
                q.ns,
                q.addr - base,
                ord + 1,
                a.segment_of(h.addr).map_or(0, |(b, _)| h.addr - b),
                a.segment_of(h.addr).map_or(0, |(_, o)| o + 1),
            ));
        }
    };
    r.run(requests, false, served);

    let simulated: Vec<u64> = r
        .model
        .segment_log()
        .iter()
        .filter(|e| matches!(e.op, SegmentOp::Alloc | SegmentOp::Map))
        .map(|e| e.size)
        .collect();
    let mut seg_matching = 0u64;
    for (i, (rec, sim)) in recorded.iter().zip(&simulated).enumerate() {
        if rec.size == *sim {
            seg_matching += 1;
        } else if first_mismatch.is_none() {
            first_mismatch = Some(format!(
                "device allocation {}: recorded {} bytes, the model {} bytes",
                i + 1,
                rec.size,
                sim
            ));
        }
    }
    if first_mismatch.is_none() && recorded.len() != simulated.len() {
        first_mismatch = Some(format!(
            "{} device allocations recorded, the model made {}",
            recorded.len(),
            simulated.len()
        ));
    }
    Agreement {
        segments_recorded: recorded.len() as u64,
        segments_simulated: simulated.len() as u64,
        segments_matching: seg_matching,
        blocks_checked: checked,
        block_offsets_matching: matching,
        starts_empty,
        initial_segments,
        first_mismatch,
    }
}

fn add_range(live: &mut BTreeMap<u64, (u64, u64)>, addr: u64, size: u64, ord: u64, join: bool) {
    if join {
        if let Some((&b, &(s, o))) = live.range(..addr).next_back() {
            if b.saturating_add(s) == addr {
                live.insert(b, (s.saturating_add(size), o));
                return;
            }
        }
    }
    live.insert(addr, (size, ord));
}

fn remove_range(live: &mut BTreeMap<u64, (u64, u64)>, addr: u64, size: u64) {
    if let Some((s, o)) = live.remove(&addr) {
        if size < s {
            live.insert(addr.saturating_add(size), (s - size, o));
        }
        return;
    }
    // Pages unmapped from inside a joined range: keep what is left on either side.
    if let Some((&b, &(s, o))) = live.range(..addr).next_back() {
        let seg_end = b.saturating_add(s);
        if addr < seg_end {
            live.insert(b, (addr - b, o));
            let end = addr.saturating_add(size);
            if end < seg_end {
                live.insert(end, (seg_end - end, o));
            }
        }
    }
}
