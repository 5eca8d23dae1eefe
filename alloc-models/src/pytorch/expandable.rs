//! Expandable segments: one segment per stream and pool, an address range reserved for more
//! than the device holds and mapped page by page (`find_expandable_block`, `map_block`,
//! `try_allocate_expandable_block`, `unmap_block`, `release_expandable_segment`).

use super::allocator::{Allocator, Expandable, NIL};
use super::{SegmentOp, LARGE_BUFFER, SMALL_BUFFER};

impl Allocator {
    pub(super) fn allocatable(&self, b: u32) -> bool {
        b != NIL && {
            let blk = &self.blocks[b as usize];
            !blk.allocated && !blk.pending
        }
    }

    /// The lowest-addressed free-or-unmapped run of the stream's expandable segments with
    /// room for `size`, else a new segment (`find_expandable_block`).
    pub(super) fn find_expandable_block(&mut self, small: bool, stream: u32, size: u64) -> u32 {
        let candidates: Vec<u32> = self.pools[small as usize]
            .unmapped
            .range((stream, 0, 0)..)
            .take_while(|k| k.0 == stream)
            .map(|k| k.2)
            .collect();
        for mut c in candidates {
            let prev = self.blocks[c as usize].prev;
            if self.allocatable(prev) {
                c = prev;
            }
            let (mut bytes, mut b) = (0u64, c);
            while bytes < size && self.allocatable(b) {
                bytes += self.blocks[b as usize].size;
                b = self.blocks[b as usize].next;
            }
            if bytes >= size {
                return c;
            }
        }
        let page = if small { SMALL_BUFFER } else { LARGE_BUFFER };
        // Address space for 1 1/8 of the device's memory.
        let space = self.capacity.map_or(1 << 40, |c| c + c / 8);
        let pages = space.div_ceil(page).max(1);
        let base = self.bump;
        self.bump = self.bump.saturating_add(pages * page);
        let es = self.expandables.len() as u32;
        self.expandables.push(Some(Expandable {
            base,
            size: pages * page,
            page,
            mapped: Vec::new(),
            ordinal: self.next_ordinal,
        }));
        self.next_ordinal += 1;
        self.stats.segments += 1;
        let mut blk = self.block(base, pages * page, stream, small, es);
        blk.mapped = false;
        let b = self.new_block(blk);
        self.pools[small as usize]
            .unmapped
            .insert((stream, base, b));
        b
    }

    /// Maps the pages under the first `size` bytes of unmapped block `b` (`map_block`).
    pub(super) fn map_block(&mut self, b: u32, size: u64) -> bool {
        let blk = self.blocks[b as usize].clone();
        let Some(es) = self.expandables[blk.es as usize].as_mut() else {
            return false;
        };
        let begin = (blk.addr - es.base) / es.page;
        let end = (blk.addr + size - es.base).div_ceil(es.page);
        if begin == end {
            return false;
        }
        let bytes = (end - begin) * es.page;
        if self
            .capacity
            .is_some_and(|c| self.stats.reserved.saturating_add(bytes) > c)
        {
            return false;
        }
        if es.mapped.len() < end as usize {
            es.mapped.resize(end as usize, false);
        }
        es.mapped[begin as usize..end as usize].fill(true);
        let start = es.base + begin * es.page;
        let pool = &mut self.pools[blk.small as usize];
        pool.unmapped.remove(&(blk.stream, blk.addr, b));
        self.blocks[b as usize].mapped = true;
        if bytes < blk.size {
            let mut rest = self.block(
                blk.addr + bytes,
                blk.size - bytes,
                blk.stream,
                blk.small,
                blk.es,
            );
            rest.mapped = false;
            rest.prev = b;
            rest.next = blk.next;
            let r = self.new_block(rest);
            if blk.next != NIL {
                self.blocks[blk.next as usize].prev = r;
            }
            self.blocks[b as usize].next = r;
            self.blocks[b as usize].size = bytes;
            self.pools[blk.small as usize]
                .unmapped
                .insert((blk.stream, blk.addr + bytes, r));
        }
        let prev = self.blocks[b as usize].prev;
        self.try_merge_blocks(b, prev);
        let next = self.blocks[b as usize].next;
        self.try_merge_blocks(b, next);
        self.insert_into_blocks(b);
        self.stats.reserved = self.stats.reserved.saturating_add(bytes);
        self.stats.device_allocs += 1;
        self.note_reserved();
        self.record(SegmentOp::Map, start, bytes, blk.stream);
        true
    }

    /// A free block of `size` bytes in an expandable segment, mapping pages as needed
    /// (`try_allocate_expandable_block`).
    pub(super) fn try_allocate_expandable_block(
        &mut self,
        small: bool,
        stream: u32,
        size: u64,
    ) -> Option<u32> {
        let mut c = self.find_expandable_block(small, stream, size);
        let blk = &self.blocks[c as usize];
        if !blk.mapped && !self.map_block(c, blk.size.min(size)) {
            return None;
        }
        while self.blocks[c as usize].size < size {
            let remaining = size - self.blocks[c as usize].size;
            let next = self.blocks[c as usize].next;
            if next == NIL {
                return None;
            }
            let n = self.blocks[next as usize].size;
            if !self.map_block(next, remaining.min(n)) {
                return None;
            }
            c = next;
        }
        let key = self.key(c);
        self.pool(small).blocks.remove(&key);
        Some(c)
    }

    /// Unmaps the whole pages inside free block `b` of an expandable segment, the partial
    /// pages at either end kept as free blocks (`unmap_block`).
    pub(super) fn unmap_block(&mut self, b: u32) {
        let blk = self.blocks[b as usize].clone();
        let Some(es) = self.expandables[blk.es as usize].as_ref() else {
            return;
        };
        let (base, page) = (es.base, es.page);
        let begin = (blk.addr - base).div_ceil(page);
        let end = (blk.addr + blk.size - base) / page;
        if begin >= end {
            return;
        }
        let key = self.key(b);
        self.pool(blk.small).blocks.remove(&key);
        let start = base + begin * page;
        let bytes = (end - begin) * page;
        let before = start - blk.addr;
        if before > 0 {
            let mut f = self.block(blk.addr, before, blk.stream, blk.small, blk.es);
            f.prev = blk.prev;
            f.next = b;
            let fb = self.new_block(f);
            if blk.prev != NIL {
                self.blocks[blk.prev as usize].next = fb;
            }
            self.blocks[b as usize].prev = fb;
            self.insert_into_blocks(fb);
        }
        let after = blk.size - before - bytes;
        if after > 0 {
            let mut f = self.block(start + bytes, after, blk.stream, blk.small, blk.es);
            f.prev = b;
            f.next = blk.next;
            let fa = self.new_block(f);
            if blk.next != NIL {
                self.blocks[blk.next as usize].prev = fa;
            }
            self.blocks[b as usize].next = fa;
            self.insert_into_blocks(fa);
        }
        {
            let m = &mut self.blocks[b as usize];
            m.addr = start;
            m.size = bytes;
            m.mapped = false;
        }
        let prev = self.blocks[b as usize].prev;
        self.try_merge_blocks(b, prev);
        let next = self.blocks[b as usize].next;
        self.try_merge_blocks(b, next);
        let addr = self.blocks[b as usize].addr;
        self.pools[blk.small as usize]
            .unmapped
            .insert((blk.stream, addr, b));
        if let Some(es) = self.expandables[blk.es as usize].as_mut() {
            let hi = (end as usize).min(es.mapped.len());
            if (begin as usize) < hi {
                es.mapped[begin as usize..hi].fill(false);
            }
            while es.mapped.last() == Some(&false) {
                es.mapped.pop();
            }
        }
        self.stats.reserved = self.stats.reserved.saturating_sub(bytes);
        self.stats.device_frees += 1;
        self.record(SegmentOp::Unmap, start, bytes, blk.stream);
    }

    /// Drops an expandable segment left wholly unmapped (`release_expandable_segment`).
    pub(super) fn release_expandable_segment(&mut self, b: u32) {
        let blk = self.blocks[b as usize].clone();
        self.pools[blk.small as usize]
            .unmapped
            .remove(&(blk.stream, blk.addr, b));
        self.expandables[blk.es as usize] = None;
        self.stats.segments -= 1;
        self.free_slots.push(b);
    }
}
