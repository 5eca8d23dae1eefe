//! The device allocator (`DeviceCachingAllocator`), one function per function of
//! `CUDACachingAllocator.cpp`, same names where PyTorch has one, so a reader can hold the two
//! side by side. What it leaves out: CUDA graphs' private pools, IPC, the free-memory
//! callbacks (none is registered in a plain run), peer access. This file holds the blocks and
//! the malloc path; `segments.rs` the device memory under them (new segments, releases,
//! garbage collection) and `expandable.rs` the expandable segments.
//!
//! Blocks live in a slab and link to their neighbours in the segment (`prev`/`next`) as
//! PyTorch's do; each pool keeps its free blocks ordered by (stream, size, address) for best
//! fit, and the unmapped blocks of expandable segments by (stream, address). Device memory is
//! a counter against an optional capacity; device addresses come from a bump allocator, or
//! from hints (the addresses the real `cudaMalloc` returned, when checking a recording).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use rustc_hash::FxHashMap;

use super::settings::Settings;
use super::{LARGE_BUFFER, MIN_BLOCK, MIN_LARGE_ALLOC, ROUND_LARGE, SMALL_BUFFER, SMALL_SIZE};
use crate::replay::{Oom, Stats};

pub(super) const NIL: u32 = u32::MAX;

/// Where model addresses start when no hint gives one: above any address a GPU hands out.
pub(super) const BUMP_BASE: u64 = 1 << 48;

/// Requests above this (64 TiB) fail at once: no device has it, and sums of such sizes would
/// overflow.
const MAX_REQUEST: u64 = 1 << 46;

/// What the allocator did with device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegmentOp {
    /// `cudaMalloc` of a segment (`segment_alloc`).
    Alloc,
    /// `cudaFree` of a segment (`segment_free`).
    Free,
    /// Pages mapped into an expandable segment (`segment_map`).
    Map,
    /// Pages unmapped from an expandable segment (`segment_unmap`).
    Unmap,
}

/// One device-memory operation, in the order the allocator made them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentEvent {
    pub op: SegmentOp,
    pub addr: u64,
    pub size: u64,
    pub stream: u32,
}

/// A block handed out: its id (for the free) and address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handle {
    pub id: u64,
    pub addr: u64,
    /// The block's size (the request rounded, or a whole unsplit block).
    pub size: u64,
}

#[derive(Debug, Clone)]
pub(super) struct Block {
    pub(super) addr: u64,
    pub(super) size: u64,
    pub(super) stream: u32,
    pub(super) small: bool,
    pub(super) allocated: bool,
    /// Freed, but other streams may still use it (`event_count > 0`): neither reusable nor
    /// mergeable until its free completes.
    pub(super) pending: bool,
    pub(super) mapped: bool,
    pub(super) prev: u32,
    pub(super) next: u32,
    /// Its expandable segment, or NIL.
    pub(super) es: u32,
    /// `get_free_blocks_call_count` of its pool when it was cached (`gc_count_base`).
    pub(super) gc_base: i64,
    /// The id of the allocation it holds.
    pub(super) id: u64,
}

pub(super) type Key = (u32, u64, u64, u32);

#[derive(Debug, Default)]
pub(super) struct Pool {
    /// Free mapped blocks by (stream, size, address) (`BlockComparatorSize`).
    pub(super) blocks: BTreeSet<Key>,
    /// Unmapped ranges of expandable segments by (stream, address) (`BlockComparatorAddress`).
    pub(super) unmapped: BTreeSet<(u32, u64, u32)>,
    pub(super) get_free_blocks_call_count: i64,
}

/// One expandable segment: a reserved address range mapped page by page.
#[derive(Debug)]
pub(super) struct Expandable {
    pub(super) base: u64,
    /// Bytes of address space reserved.
    pub(super) size: u64,
    pub(super) page: u64,
    /// Which pages are mapped (`handles_`).
    pub(super) mapped: Vec<bool>,
    /// Its order among the device's segments.
    pub(super) ordinal: u64,
}

/// PyTorch's caching allocator for one device.
pub struct Allocator {
    pub(super) settings: Settings,
    pub(super) capacity: Option<u64>,
    pub(super) blocks: Vec<Block>,
    pub(super) free_slots: Vec<u32>,
    /// [large, small].
    pub(super) pools: [Pool; 2],
    /// Allocated and pending blocks by allocation id.
    pub(super) live: FxHashMap<u64, u32>,
    /// Blocks whose free waits for other streams, in the order they were freed.
    pub(super) pending: Vec<u32>,
    pub(super) expandables: Vec<Option<Expandable>>,
    /// `cudaMalloc`ed segments by address: (size, ordinal).
    pub(super) segments: BTreeMap<u64, (u64, u64)>,
    pub(super) next_ordinal: u64,
    pub(super) next_id: u64,
    pub(super) bump: u64,
    pub(super) hints: VecDeque<u64>,
    pub(super) stats: Stats,
    pub(super) log: Option<Vec<SegmentEvent>>,
}

/// The bytes a request is rounded to (`round_size`).
pub fn round_size(settings: &Settings, size: u64) -> u64 {
    if size < MIN_BLOCK {
        return MIN_BLOCK;
    }
    let divisions = settings.divisions_for(size);
    if divisions > 1 && size > MIN_BLOCK * divisions {
        roundup_power2_next_division(size, divisions)
    } else {
        size.div_ceil(MIN_BLOCK).saturating_mul(MIN_BLOCK)
    }
}

/// `roundup_power2_next_division`: the next of `divisions` equal steps between the powers of
/// two around `size` (1200 with 4 divisions: 1280).
fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> (63 - divisions.leading_zeros());
    if step == 0 {
        return floor << 1;
    }
    let down = size & !(step - 1);
    if down == size {
        size
    } else {
        down + step
    }
}

/// The segment a new request of `size` (rounded) gets (`get_allocation_size`).
pub fn get_allocation_size(size: u64) -> u64 {
    if size <= SMALL_SIZE {
        SMALL_BUFFER
    } else if size < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        size.div_ceil(ROUND_LARGE).saturating_mul(ROUND_LARGE)
    }
}

impl Allocator {
    /// An empty allocator with `settings` on a device that can give it `capacity` bytes
    /// (`None`: without limit).
    pub fn new(settings: Settings, capacity: Option<u64>) -> Allocator {
        Allocator {
            settings,
            capacity,
            blocks: Vec::new(),
            free_slots: Vec::new(),
            pools: [Pool::default(), Pool::default()],
            live: FxHashMap::default(),
            pending: Vec::new(),
            expandables: Vec::new(),
            segments: BTreeMap::new(),
            next_ordinal: 0,
            next_id: 0,
            bump: BUMP_BASE,
            hints: VecDeque::new(),
            stats: Stats::default(),
            log: None,
        }
    }

    /// Keeps a log of device-memory operations ([`Allocator::segment_log`]).
    pub fn with_log(mut self) -> Allocator {
        self.log = Some(Vec::new());
        self
    }

    /// Addresses for the next `cudaMalloc`s, in order (each used unless it would overlap a
    /// segment held): the real allocator's, so that ties of best fit break as they did.
    pub fn with_address_hints(mut self, hints: impl IntoIterator<Item = u64>) -> Allocator {
        self.hints = hints.into_iter().collect();
        self
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    pub fn segment_log(&self) -> &[SegmentEvent] {
        self.log.as_deref().unwrap_or(&[])
    }

    /// The segment holding `addr`: (its address, its order among the device's segments).
    pub fn segment_of(&self, addr: u64) -> Option<(u64, u64)> {
        if let Some((&base, &(size, ordinal))) = self.segments.range(..=addr).next_back() {
            if addr < base.saturating_add(size) {
                return Some((base, ordinal));
            }
        }
        self.expandables
            .iter()
            .flatten()
            .find(|e| addr >= e.base && addr < e.base + e.size)
            .map(|e| (e.base, e.ordinal))
    }

    pub(super) fn set_fraction(&self) -> bool {
        self.settings.memory_fraction.is_some() && self.capacity.is_some()
    }

    pub(super) fn allowed_memory_maximum(&self) -> u64 {
        match (self.settings.memory_fraction, self.capacity) {
            (Some(f), Some(c)) => (f * c as f64) as u64,
            _ => u64::MAX,
        }
    }

    pub(super) fn gc_on(&self) -> bool {
        self.set_fraction() && self.settings.garbage_collection_threshold > 0.0
    }

    /// Serves a request of `orig` bytes on `stream` (`malloc`): a cached block, else
    /// (after garbage collection, when on) a new segment, else after releasing oversize cached
    /// blocks, else after releasing every unsplit cached block, else out of memory.
    pub fn malloc(&mut self, orig: u64, stream: u32) -> Result<Handle, Oom> {
        let size = round_size(&self.settings, orig);
        if size > MAX_REQUEST {
            // More than any device holds (a damaged or hostile trace): refused outright.
            return Err(Oom {
                requested: orig,
                size,
                alloc_size: size,
                reserved: self.stats.reserved,
                allocated: self.stats.allocated,
            });
        }
        let small = size <= SMALL_SIZE;
        let alloc_size = get_allocation_size(size);
        // No free-memory callbacks are registered in a plain run: no second search.
        let mut found = self.get_free_block(small, stream, size);
        if found.is_none() {
            if self.gc_on() {
                self.garbage_collect_cached_blocks();
            }
            found = self.alloc_block(small, stream, size, alloc_size);
            if found.is_none() && self.release_available_cached_blocks(small, stream, size) {
                found = self.alloc_block(small, stream, size, alloc_size);
            }
            if found.is_none() {
                self.release_cached_blocks();
                found = self.alloc_block(small, stream, size, alloc_size);
            }
        }
        let Some(b) = found else {
            return Err(Oom {
                requested: orig,
                size,
                alloc_size,
                reserved: self.stats.reserved,
                allocated: self.stats.allocated,
            });
        };
        let split = self.should_split(b, size);
        Ok(self.alloc_found_block(b, size, split))
    }

    /// The free of an allocation is requested (`free` with stream uses recorded): its bytes
    /// stop counting as allocated, but the block is neither reused nor merged until
    /// [`Allocator::free_completed`].
    pub fn free_requested(&mut self, id: u64) {
        let Some(&b) = self.live.get(&id) else { return };
        if !self.blocks[b as usize].allocated {
            return;
        }
        self.unallocate(b);
        self.blocks[b as usize].pending = true;
        self.pending.push(b);
    }

    /// The free of an allocation completes (`free_block`), requested or not: the block goes
    /// back to its pool, merged with free neighbours. A free already completed (the cache
    /// was released meanwhile, which waits for every stream) does nothing.
    pub fn free_completed(&mut self, id: u64) {
        let Some(b) = self.live.remove(&id) else {
            return;
        };
        let blk = &mut self.blocks[b as usize];
        if blk.allocated {
            self.unallocate(b);
        } else if blk.pending {
            blk.pending = false;
            self.pending.retain(|&p| p != b);
        }
        self.free_block(b);
    }

    /// A free with no other stream using the block: requested and completed at once.
    pub fn free(&mut self, id: u64) {
        self.free_completed(id);
    }

    /// `torch.cuda.empty_cache()`: every unsplit cached block goes back to the device, and
    /// every free page of expandable segments is unmapped.
    pub fn empty_cache(&mut self) {
        self.release_cached_blocks();
    }

    /// Sets up a segment the allocator held before a recording began: `size` bytes at `addr`
    /// on `stream`, in the small pool or the large, with the blocks `allocated` (address,
    /// size; in address order, inside the segment) handed out and the gaps between them
    /// cached as free blocks. Returns the handles of the allocated blocks, in order. Not a
    /// device allocation of the run: it is not logged.
    pub fn seed_segment(
        &mut self,
        addr: u64,
        size: u64,
        stream: u32,
        small: bool,
        allocated: &[(u64, u64)],
    ) -> Vec<Handle> {
        self.segments.insert(addr, (size, self.next_ordinal));
        self.next_ordinal += 1;
        self.stats.reserved = self.stats.reserved.saturating_add(size);
        self.stats.segments += 1;
        self.note_reserved();
        let end = addr.saturating_add(size);
        let mut pieces: Vec<(u64, u64, bool)> = Vec::new();
        let mut at = addr;
        for &(a, s) in allocated {
            let (a, s) = (a.max(at), s.min(end.saturating_sub(a.max(at))));
            if s == 0 {
                continue;
            }
            if a > at {
                pieces.push((at, a - at, false));
            }
            pieces.push((a, s, true));
            at = a.saturating_add(s);
        }
        if at < end {
            pieces.push((at, end - at, false));
        }
        let mut prev = NIL;
        let mut handles = Vec::new();
        let split = pieces.len() > 1;
        for (a, s, taken) in pieces {
            let mut blk = self.block(a, s, stream, small, NIL);
            blk.prev = prev;
            let b = self.new_block(blk);
            if prev != NIL {
                self.blocks[prev as usize].next = b;
            }
            prev = b;
            if taken {
                let id = self.next_id;
                self.next_id += 1;
                let o = &mut self.blocks[b as usize];
                o.allocated = true;
                o.id = id;
                self.stats.allocated = self.stats.allocated.saturating_add(s);
                self.live.insert(id, b);
                handles.push(Handle {
                    id,
                    addr: a,
                    size: s,
                });
            } else {
                self.insert_into_blocks(b);
                if split {
                    self.stats.inactive_split = self.stats.inactive_split.saturating_add(s);
                }
            }
        }
        self.stats.peak_allocated = self.stats.peak_allocated.max(self.stats.allocated);
        handles
    }

    /// Returns the segment at `addr` to the device if it is cached whole (a recorded
    /// `segment_free` replayed where the model's segments are the recorded ones); false when
    /// the model holds no such free segment.
    pub fn release_segment(&mut self, addr: u64) -> bool {
        if !self.segments.contains_key(&addr) {
            return false;
        }
        for small in [false, true] {
            let found = self.pools[small as usize]
                .blocks
                .iter()
                .find(|k| k.2 == addr)
                .copied();
            if let Some(k) = found {
                if !self.is_split(k.3) && self.blocks[k.3 as usize].es == NIL {
                    self.release_block(k.3);
                    return true;
                }
            }
        }
        false
    }

    pub(super) fn unallocate(&mut self, b: u32) {
        let blk = &mut self.blocks[b as usize];
        blk.allocated = false;
        self.stats.allocated = self.stats.allocated.saturating_sub(blk.size);
    }

    pub(super) fn new_block(&mut self, b: Block) -> u32 {
        if let Some(i) = self.free_slots.pop() {
            self.blocks[i as usize] = b;
            i
        } else {
            self.blocks.push(b);
            (self.blocks.len() - 1) as u32
        }
    }

    pub(super) fn block(&self, addr: u64, size: u64, stream: u32, small: bool, es: u32) -> Block {
        Block {
            addr,
            size,
            stream,
            small,
            allocated: false,
            pending: false,
            mapped: true,
            prev: NIL,
            next: NIL,
            es,
            gc_base: 0,
            id: 0,
        }
    }

    pub(super) fn key(&self, b: u32) -> Key {
        let blk = &self.blocks[b as usize];
        (blk.stream, blk.size, blk.addr, b)
    }

    pub(super) fn pool(&mut self, small: bool) -> &mut Pool {
        &mut self.pools[small as usize]
    }

    pub(super) fn is_split(&self, b: u32) -> bool {
        let blk = &self.blocks[b as usize];
        blk.prev != NIL || blk.next != NIL
    }

    pub(super) fn insert_into_blocks(&mut self, b: u32) {
        let key = self.key(b);
        let small = self.blocks[b as usize].small;
        let pool = &mut self.pools[small as usize];
        self.blocks[b as usize].gc_base = pool.get_free_blocks_call_count;
        pool.blocks.insert(key);
    }

    pub(super) fn record(&mut self, op: SegmentOp, addr: u64, size: u64, stream: u32) {
        if let Some(log) = &mut self.log {
            log.push(SegmentEvent {
                op,
                addr,
                size,
                stream,
            });
        }
    }

    pub(super) fn note_reserved(&mut self) {
        self.stats.peak_reserved = self.stats.peak_reserved.max(self.stats.reserved);
    }

    /// Best fit (`get_free_block`): the smallest cached block of the stream at least `size`
    /// large, lowest address first; in expandable segments a block counts with the unmapped
    /// range after it; an oversize block serves only an oversize request, and only one less
    /// than `max_non_split_rounding` smaller.
    pub(super) fn get_free_block(&mut self, small: bool, stream: u32, size: u64) -> Option<u32> {
        let gc = self.gc_on();
        let expandable = self.settings.expandable_segments;
        let (max_split, rounding) = (
            self.settings.max_split_size,
            self.settings.max_non_split_rounding,
        );
        let pool = &mut self.pools[small as usize];
        if gc {
            pool.get_free_blocks_call_count += 1;
        }
        let blocks = &self.blocks;
        let mut it = pool.blocks.range((stream, size, 0, 0)..);
        let mut cur = *it.next()?;
        if cur.0 != stream {
            return None;
        }
        let is_es = |k: &Key| blocks[k.3 as usize].es != NIL;
        if is_es(&cur) {
            if expandable {
                let expandable_size = |k: &Key| {
                    let b = &blocks[k.3 as usize];
                    let next = b.next;
                    b.size
                        + if next != NIL && !blocks[next as usize].mapped {
                            blocks[next as usize].size
                        } else {
                            0
                        }
                };
                for next in it {
                    if !(is_es(&cur)
                        && next.0 == stream
                        && expandable_size(next) < expandable_size(&cur))
                    {
                        break;
                    }
                    cur = *next;
                }
            } else {
                loop {
                    cur = *it.next()?;
                    if !(is_es(&cur) && cur.0 == stream) {
                        break;
                    }
                }
                if cur.0 != stream {
                    return None;
                }
            }
        }
        let found = cur.1;
        if size < max_split && found >= max_split {
            return None;
        }
        if size >= max_split && found >= size.saturating_add(rounding) {
            return None;
        }
        pool.blocks.remove(&cur);
        Some(cur.3)
    }

    /// Whether to split a block of which `size` is used (`should_split`): in the small pool
    /// and in expandable segments when at least 512 bytes remain; in the large pool when the
    /// request is below `max_split_size` and more than 1 MiB remains.
    pub(super) fn should_split(&self, b: u32, size: u64) -> bool {
        let blk = &self.blocks[b as usize];
        let remaining = blk.size - size;
        if blk.small || self.settings.expandable_segments {
            remaining >= MIN_BLOCK
        } else {
            size < self.settings.max_split_size && remaining > SMALL_SIZE
        }
    }

    /// Hands out the front of block `b`, the rest cached as a block of its own when `split`
    /// (`alloc_found_block`).
    pub(super) fn alloc_found_block(&mut self, b: u32, size: u64, split: bool) -> Handle {
        let already_split = self.is_split(b);
        let blk = self.blocks[b as usize].clone();
        let mut out = b;
        if split {
            let mut front = self.block(blk.addr, size, blk.stream, blk.small, blk.es);
            front.prev = blk.prev;
            front.next = b;
            let nb = self.new_block(front);
            if blk.prev != NIL {
                self.blocks[blk.prev as usize].next = nb;
            }
            let rest = &mut self.blocks[b as usize];
            rest.prev = nb;
            rest.addr += size;
            rest.size -= size;
            let rest_size = rest.size;
            self.insert_into_blocks(b);
            if blk.es == NIL {
                if already_split {
                    self.stats.inactive_split = self.stats.inactive_split.saturating_sub(size);
                } else {
                    self.stats.inactive_split = self.stats.inactive_split.saturating_add(rest_size);
                }
            }
            out = nb;
        } else if already_split && blk.es == NIL {
            self.stats.inactive_split = self.stats.inactive_split.saturating_sub(blk.size);
        }
        let id = self.next_id;
        self.next_id += 1;
        let o = &mut self.blocks[out as usize];
        o.allocated = true;
        o.id = id;
        let handle = Handle {
            id,
            addr: o.addr,
            size: o.size,
        };
        self.stats.allocated = self.stats.allocated.saturating_add(o.size);
        self.stats.peak_allocated = self.stats.peak_allocated.max(self.stats.allocated);
        self.live.insert(id, out);
        handle
    }

    /// Caches a freed block, merged with its free neighbours (`free_block`).
    pub(super) fn free_block(&mut self, b: u32) {
        let (prev, next) = (self.blocks[b as usize].prev, self.blocks[b as usize].next);
        let mut net_size: i64 = 0;
        for c in [prev, next] {
            net_size -= self.try_merge_blocks(b, c) as i64;
        }
        self.insert_into_blocks(b);
        if self.is_split(b) {
            net_size += self.blocks[b as usize].size as i64;
        }
        if self.blocks[b as usize].es == NIL {
            self.stats.inactive_split = if net_size >= 0 {
                self.stats.inactive_split.saturating_add(net_size as u64)
            } else {
                self.stats
                    .inactive_split
                    .saturating_sub(net_size.unsigned_abs())
            };
        }
    }

    /// Merges `src` into `dst` when `src` is a free neighbour in the same mapped state
    /// (`try_merge_blocks`); returns the bytes merged.
    pub(super) fn try_merge_blocks(&mut self, dst: u32, src: u32) -> u64 {
        if src == NIL {
            return 0;
        }
        let s = self.blocks[src as usize].clone();
        if s.allocated || s.pending || s.mapped != self.blocks[dst as usize].mapped {
            return 0;
        }
        if self.blocks[dst as usize].prev == src {
            let d = &mut self.blocks[dst as usize];
            d.addr = s.addr;
            d.prev = s.prev;
            if s.prev != NIL {
                self.blocks[s.prev as usize].next = dst;
            }
        } else {
            self.blocks[dst as usize].next = s.next;
            if s.next != NIL {
                self.blocks[s.next as usize].prev = dst;
            }
        }
        self.blocks[dst as usize].size += s.size;
        let pool = &mut self.pools[s.small as usize];
        if s.mapped {
            pool.blocks.remove(&(s.stream, s.size, s.addr, src));
        } else {
            pool.unmapped.remove(&(s.stream, s.addr, src));
        }
        self.free_slots.push(src);
        s.size
    }
}
