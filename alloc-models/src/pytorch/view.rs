//! What the allocator holds, as a snapshot shows it (`torch.cuda.memory._snapshot()`'s
//! `segments`), and the knobs a live use of the model needs beside `malloc` and `free`: a
//! device capacity that changes, peaks reset. A program run with fake CUDA tensors
//! (`poolsight.torch.fake_cuda`) is served by an [`Allocator`] as its requests come, and asks
//! it what `torch.cuda.memory_reserved()` and `_dump_snapshot()` would have answered.

use std::collections::HashSet;

use super::allocator::{Allocator, NIL};

/// One block of a segment, in address order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockView {
    pub addr: u64,
    pub size: u64,
    /// Handed out and not freed (`active_allocated`).
    pub allocated: bool,
    /// Freed, but another stream may still use it (`active_pending_free`).
    pub pending: bool,
    /// The allocation it holds (its [`super::Handle::id`]), when allocated or pending.
    pub id: u64,
}

/// One segment the allocator holds from the device, with its blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentView {
    pub addr: u64,
    /// Bytes held (mapped bytes for an expandable segment).
    pub size: u64,
    pub stream: u32,
    /// In the small pool (blocks of at most 1 MiB).
    pub small: bool,
    pub expandable: bool,
    pub blocks: Vec<BlockView>,
}

impl Allocator {
    /// The segments held now, in address order, each with its blocks.
    pub fn segments(&self) -> Vec<SegmentView> {
        let stale: HashSet<u32> = self.free_slots.iter().copied().collect();
        let view = |b: u32| {
            let blk = &self.blocks[b as usize];
            BlockView {
                addr: blk.addr,
                size: blk.size,
                allocated: blk.allocated,
                pending: blk.pending,
                id: if blk.allocated || blk.pending {
                    blk.id
                } else {
                    0
                },
            }
        };
        let mut out = Vec::new();
        // A plain segment: the chain of blocks from the one at its base.
        let heads: Vec<u32> = (0..self.blocks.len() as u32)
            .filter(|b| !stale.contains(b))
            .filter(|&b| {
                let blk = &self.blocks[b as usize];
                blk.es == NIL && blk.prev == NIL && self.segments.contains_key(&blk.addr)
            })
            .collect();
        for head in heads {
            let first = &self.blocks[head as usize];
            let (size, _) = self.segments[&first.addr];
            let mut blocks = Vec::new();
            let mut b = head;
            while b != NIL {
                blocks.push(view(b));
                b = self.blocks[b as usize].next;
            }
            out.push(SegmentView {
                addr: first.addr,
                size,
                stream: first.stream,
                small: first.small,
                expandable: false,
                blocks,
            });
        }
        // An expandable segment: its mapped blocks, whatever links them.
        for (i, e) in self.expandables.iter().enumerate() {
            let Some(e) = e else { continue };
            let mut blocks: Vec<u32> = (0..self.blocks.len() as u32)
                .filter(|b| !stale.contains(b))
                .filter(|&b| {
                    let blk = &self.blocks[b as usize];
                    blk.es == i as u32 && blk.mapped
                })
                .collect();
            if blocks.is_empty() {
                continue;
            }
            blocks.sort_by_key(|&b| self.blocks[b as usize].addr);
            let first = &self.blocks[blocks[0] as usize];
            out.push(SegmentView {
                addr: e.base,
                size: blocks.iter().map(|&b| self.blocks[b as usize].size).sum(),
                stream: first.stream,
                small: first.small,
                expandable: true,
                blocks: blocks.into_iter().map(view).collect(),
            });
        }
        out.sort_by_key(|s| s.addr);
        out
    }

    /// The device's capacity from now on (`None`: without limit); what is held is kept.
    pub fn set_capacity(&mut self, capacity: Option<u64>) {
        self.capacity = capacity;
    }

    /// The device's capacity (`None`: without limit).
    pub fn capacity(&self) -> Option<u64> {
        self.capacity
    }

    /// `torch.cuda.reset_peak_memory_stats()`: the peaks start again from what is held now.
    pub fn reset_peaks(&mut self) {
        self.stats.peak_allocated = self.stats.allocated;
        self.stats.peak_reserved = self.stats.reserved;
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Allocator, Settings, LARGE_BUFFER, SMALL_BUFFER};

    #[test]
    fn segments_list_their_blocks_in_address_order() {
        let mut a = Allocator::new(Settings::default(), None);
        let x = a.malloc(1000, 0).unwrap();
        let y = a.malloc(3000, 0).unwrap();
        let big = a.malloc(5 << 20, 0).unwrap();
        a.free(x.id);
        let segs = a.segments();
        assert_eq!(segs.len(), 2);
        let small = segs.iter().find(|s| s.small).unwrap();
        assert_eq!(small.size, SMALL_BUFFER);
        let sizes: Vec<_> = small.blocks.iter().map(|b| (b.size, b.allocated)).collect();
        assert_eq!(
            sizes,
            [(1024, false), (3072, true), (SMALL_BUFFER - 4096, false)]
        );
        assert_eq!(small.blocks[1].id, y.id);
        let large = segs.iter().find(|s| !s.small).unwrap();
        assert_eq!((large.size, large.blocks[0].id), (LARGE_BUFFER, big.id));
        assert_eq!(
            small.blocks.iter().map(|b| b.size).sum::<u64>(),
            small.size,
            "blocks tile their segment"
        );
    }

    #[test]
    fn a_capacity_set_later_refuses_what_does_not_fit_and_peaks_restart() {
        let mut a = Allocator::new(Settings::default(), None);
        let x = a.malloc(30 << 20, 0).unwrap();
        a.set_capacity(Some(40 << 20));
        assert!(a.malloc(30 << 20, 0).is_err());
        a.free(x.id);
        assert_eq!(a.stats().peak_allocated, 30 << 20);
        a.reset_peaks();
        assert_eq!(a.stats().peak_allocated, 0);
        assert_eq!(a.stats().peak_reserved, a.stats().reserved);
        a.set_capacity(None);
        assert!(a.malloc(60 << 20, 0).is_ok());
    }
}
