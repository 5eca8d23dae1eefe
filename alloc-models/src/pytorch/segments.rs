//! Device memory: where a new segment comes from (`alloc_block`, with the addresses the real
//! `cudaMalloc` returned when checking a recording), and how cached segments go back to the
//! device (`release_available_cached_blocks`, `release_cached_blocks`, `release_block`,
//! `garbage_collect_cached_blocks`).

use super::allocator::{Allocator, Key, NIL};
use super::{SegmentOp, ROUND_LARGE};

impl Allocator {
    /// A device address for a new segment of `size` bytes: the next hint that overlaps no
    /// segment held, else the bump allocator's.
    pub(super) fn device_address(&mut self, size: u64) -> u64 {
        if let Some(h) = self.hints.pop_front() {
            let below = self.segments.range(..h.saturating_add(size)).next_back();
            let overlaps = below.is_some_and(|(&a, &(s, _))| a + s > h);
            if !overlaps && h != 0 {
                return h;
            }
        }
        let addr = self.bump;
        self.bump = self
            .bump
            .saturating_add(size.div_ceil(ROUND_LARGE).saturating_mul(ROUND_LARGE));
        addr
    }

    /// A new segment from the device (`alloc_block`): refused past the memory fraction or
    /// the capacity; in expandable mode, pages mapped instead.
    pub(super) fn alloc_block(
        &mut self,
        small: bool,
        stream: u32,
        size: u64,
        alloc_size: u64,
    ) -> Option<u32> {
        if self.set_fraction()
            && self.stats.reserved.saturating_add(alloc_size) > self.allowed_memory_maximum()
        {
            return None;
        }
        if self.settings.expandable_segments {
            return self.try_allocate_expandable_block(small, stream, size);
        }
        if self
            .capacity
            .is_some_and(|c| self.stats.reserved.saturating_add(alloc_size) > c)
        {
            return None;
        }
        let addr = self.device_address(alloc_size);
        self.segments.insert(addr, (alloc_size, self.next_ordinal));
        self.next_ordinal += 1;
        self.stats.reserved = self.stats.reserved.saturating_add(alloc_size);
        self.stats.segments += 1;
        self.stats.device_allocs += 1;
        self.note_reserved();
        self.record(SegmentOp::Alloc, addr, alloc_size, stream);
        let b = self.block(addr, alloc_size, stream, small, NIL);
        Some(self.new_block(b))
    }

    /// Frees one cached oversize block at least as large as the request (or
    /// `max_split_size`), else the largest ones of the stream until that much is freed
    /// (`release_available_cached_blocks`). Only with `max_split_size` set.
    pub(super) fn release_available_cached_blocks(
        &mut self,
        small: bool,
        stream: u32,
        size: u64,
    ) -> bool {
        let max_split = self.settings.max_split_size;
        if max_split == u64::MAX {
            return false;
        }
        let want = size.max(max_split);
        let pool = &self.pools[small as usize];
        if let Some(&k) = pool.blocks.range((stream, want, 0, 0)..).next() {
            if k.0 == stream {
                if self.blocks[k.3 as usize].es != NIL {
                    return false;
                }
                self.release_block(k.3);
                return true;
            }
        }
        let mut released = 0u64;
        let mut to_release = Vec::new();
        for k in pool.blocks.range(..(stream, want, 0, 0)).rev() {
            if released >= want
                || k.1 < max_split
                || k.0 != stream
                || self.blocks[k.3 as usize].es != NIL
            {
                break;
            }
            released += k.1;
            to_release.push(k.3);
        }
        for b in to_release {
            self.release_block(b);
        }
        released >= want
    }

    /// Waits for every stream (completing pending frees), then returns every unsplit cached
    /// block to the device and unmaps every free page (`release_cached_blocks`).
    pub(super) fn release_cached_blocks(&mut self) {
        for b in std::mem::take(&mut self.pending) {
            let blk = &mut self.blocks[b as usize];
            if blk.pending {
                blk.pending = false;
                let id = blk.id;
                self.live.remove(&id);
                self.free_block(b);
            }
        }
        self.release_blocks(false);
        self.release_blocks(true);
    }

    pub(super) fn release_blocks(&mut self, small: bool) {
        let keys: Vec<Key> = self.pool(small).blocks.iter().copied().collect();
        let mut to_unmap = Vec::new();
        for k in keys {
            let b = k.3;
            if self.blocks[b as usize].es != NIL {
                to_unmap.push(b);
            } else if !self.is_split(b) {
                self.release_block(b);
            }
        }
        for b in to_unmap {
            self.unmap_block(b);
            if !self.is_split(b) && !self.blocks[b as usize].mapped {
                self.release_expandable_segment(b);
            }
        }
    }

    /// `cudaFree` of an unsplit cached block (`release_block`).
    pub(super) fn release_block(&mut self, b: u32) {
        let key = self.key(b);
        let blk = self.blocks[b as usize].clone();
        self.record(SegmentOp::Free, blk.addr, blk.size, blk.stream);
        self.stats.reserved = self.stats.reserved.saturating_sub(blk.size);
        self.stats.segments -= 1;
        self.stats.device_frees += 1;
        self.segments.remove(&blk.addr);
        self.pool(blk.small).blocks.remove(&key);
        self.free_slots.push(b);
    }

    /// Frees the large pool's unsplit cached blocks cached longest, until the reserved bytes
    /// are under the threshold (`garbage_collect_cached_blocks`): the blocks at least as old
    /// as the average age go first, round after round.
    pub(super) fn garbage_collect_cached_blocks(&mut self) {
        let threshold = (self.settings.garbage_collection_threshold
            * self.allowed_memory_maximum() as f64) as u64;
        if self.stats.reserved <= threshold {
            return;
        }
        let target = self.stats.reserved - threshold;
        let calls = self.pools[0].get_free_blocks_call_count;
        let age = |a: &Allocator, b: u32| (calls - a.blocks[b as usize].gc_base).max(0) as u64;
        let freeable = |a: &Allocator, b: u32| !a.is_split(b) && a.blocks[b as usize].es == NIL;
        let mut total_age = 0u64;
        let mut count = 0u64;
        for k in &self.pools[0].blocks {
            if freeable(self, k.3) {
                total_age += age(self, k.3);
                count += 1;
            }
        }
        let mut reclaimed = 0u64;
        let mut freed = true;
        while reclaimed < target && freed && count > 0 {
            let age_threshold = total_age as f64 / count as f64;
            freed = false;
            let keys: Vec<Key> = self.pools[0].blocks.iter().copied().collect();
            for k in keys {
                let b = k.3;
                if freeable(self, b) && age(self, b) as f64 >= age_threshold {
                    freed = true;
                    reclaimed += k.1;
                    total_age -= age(self, b);
                    count -= 1;
                    self.release_block(b);
                }
            }
        }
    }
}
