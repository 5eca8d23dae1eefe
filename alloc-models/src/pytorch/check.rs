//! The model checked against the real allocator: a recording's allocs and frees replayed with
//! its own settings should reproduce its device allocations (same number, sizes and order)
//! and place every block at the same offset in the same segment.
//!
//! The model's `cudaMalloc` returns, in order, the addresses the recorded one did (while they
//! overlap nothing the model holds), so that best fit breaks ties between equal blocks by the
//! same addresses as the real run.

use std::collections::BTreeMap;

use super::allocator::{Allocator, SegmentOp};
use super::replay::{Op, Replayer, Request};
use super::settings::Settings;

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
    /// began); when not, the model starts empty anyway and agreement is not expected.
    pub starts_empty: bool,
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

/// Replays `requests` (one device's) with `settings` and compares the model's decisions with
/// the recorded ones.
pub fn check(requests: &[Request], settings: &Settings, capacity: Option<u64>) -> Agreement {
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

    let alloc = Allocator::new(settings.clone(), capacity)
        .with_log()
        .with_address_hints(recorded.iter().map(|r| r.addr));
    let mut r = Replayer::new(alloc);
    r.follow_recording = true;
    let expandable = settings.expandable_segments;

    // The recorded segments live as the replay reaches each request: address -> (size,
    // ordinal). Mapped ranges of expandable segments that touch are one range.
    let mut live: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    let mut ordinal = 0u64;
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
        if q.addr >= base + size {
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
        .alloc
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
        first_mismatch,
    }
}

fn add_range(live: &mut BTreeMap<u64, (u64, u64)>, addr: u64, size: u64, ord: u64, join: bool) {
    if join {
        if let Some((&b, &(s, o))) = live.range(..addr).next_back() {
            if b + s == addr {
                live.insert(b, (s + size, o));
                return;
            }
        }
    }
    live.insert(addr, (size, ord));
}

fn remove_range(live: &mut BTreeMap<u64, (u64, u64)>, addr: u64, size: u64) {
    if let Some((s, o)) = live.remove(&addr) {
        if size < s {
            live.insert(addr + size, (s - size, o));
        }
        return;
    }
    // Pages unmapped from inside a joined range: keep what is left on either side.
    if let Some((&b, &(s, o))) = live.range(..addr).next_back() {
        if addr < b + s {
            live.insert(b, (addr - b, o));
            let end = addr + size;
            if end < b + s {
                live.insert(end, (b + s - end, o));
            }
        }
    }
}
