//! CuPy's pool as a model a recorded run is replayed through: the policy of [`State`] over a
//! device that is a byte counter against an optional capacity, with CuPy's malloc path
//! (`SingleDeviceMemoryPool._malloc` and `_try_malloc`): a cached chunk by best fit, else a
//! device allocation of the rounded size, else `free_all_blocks` and again, twice (CuPy runs
//! `gc.collect()` before the third try, which frees nothing in a replay), else out of memory.

use rustc_hash::FxHashMap;

use super::arena::{State, NONE};
use super::round_size;
use crate::replay::{Model, Oom, Stats};

/// Where model addresses start: above any address a GPU hands out.
const BUMP_BASE: u64 = 1 << 48;

/// Requests above this (64 TiB) fail at once: no device has it, and sums of such sizes would
/// overflow.
const MAX_REQUEST: u64 = 1 << 46;

/// A block handed out: its id (for the free), address and size (the request rounded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    pub id: u64,
    pub addr: u64,
    pub size: u64,
}

/// CuPy's `SingleDeviceMemoryPool` for one device, as a model.
#[derive(Debug)]
pub struct Pool {
    state: State,
    capacity: Option<u64>,
    /// Blocks handed out, by id: their chunk. A block's free is made once, whether the trace
    /// requests it and completes it or only completes it.
    live: FxHashMap<u64, u32>,
    next_id: u64,
    bump: u64,
    stats: Stats,
}

impl Pool {
    /// An empty pool on a device that can give it `capacity` bytes (`None`: without limit;
    /// CuPy's `set_limit` is a capacity too).
    pub fn new(capacity: Option<u64>) -> Pool {
        Pool {
            state: State::default(),
            capacity,
            live: FxHashMap::default(),
            next_id: 0,
            bump: BUMP_BASE,
            stats: Stats::default(),
        }
    }

    /// Serves a request of `size` bytes on `stream` (`malloc`). A request of 0 bytes gets a
    /// null block without touching the pool, as CuPy's `Memory(0)`.
    pub fn malloc(&mut self, size: u64, stream: u32) -> Result<Block, Oom> {
        let Some(mem) = round_size(size).filter(|&m| m <= MAX_REQUEST) else {
            return Err(self.oom(size, u64::MAX));
        };
        let id = self.next_id;
        self.next_id += 1;
        if mem == 0 {
            return Ok(Block {
                id,
                addr: 0,
                size: 0,
            });
        }
        let arena = self.state.arena_index(stream);
        let (chunk, addr) = match self.state.take_best_fit(arena, mem) {
            Some((idx, ptr)) => {
                self.split_taken(idx, mem);
                (idx, ptr)
            }
            None => {
                let ptr = self.try_malloc(mem).ok_or_else(|| self.oom(size, mem))?;
                (self.state.add_allocation(ptr, mem, arena), ptr)
            }
        };
        self.live.insert(id, chunk);
        self.stats.allocated += mem;
        self.stats.peak_allocated = self.stats.peak_allocated.max(self.stats.allocated);
        Ok(Block {
            id,
            addr,
            size: mem,
        })
    }

    /// Returns a block to its arena, merged with free neighbours (`free`); a block freed
    /// already does nothing.
    pub fn free(&mut self, id: u64) {
        let Some(idx) = self.live.remove(&id) else {
            return;
        };
        let c = *self.state.chunk(idx);
        let free_size = |i: u32| {
            let n = (i != NONE).then(|| self.state.chunk(i)).filter(|n| n.free);
            n.map_or(0, |n| n.size)
        };
        let (before, after) = (free_size(c.prev), free_size(c.next));
        let prev = if before > 0 {
            self.state.chunk(c.prev).prev
        } else {
            c.prev
        };
        let next = if after > 0 {
            self.state.chunk(c.next).next
        } else {
            c.next
        };
        if prev == NONE && next == NONE {
            // The whole allocation is free again: its free pieces are no longer split.
            self.stats.inactive_split -= before + after;
        } else {
            self.stats.inactive_split += c.size;
        }
        self.state.give_back(idx);
        self.stats.allocated -= c.size;
    }

    /// Returns every free chunk that is a whole device allocation to the device
    /// (`free_all_blocks`).
    pub fn free_all_blocks(&mut self) {
        let (mut released, mut per_arena) = (Vec::new(), Vec::new());
        self.state
            .drain_unsplit(None, &mut released, &mut per_arena);
        for (_, size) in released {
            self.stats.reserved -= size;
            self.stats.segments -= 1;
            self.stats.device_frees += 1;
        }
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Free chunks cached, all arenas together.
    pub fn n_free_blocks(&self) -> usize {
        self.state.n_free_blocks()
    }

    /// Counts what taking chunk `idx` for `size` bytes did to the free bytes of split
    /// allocations: the chunk holds `size` bytes now, and the rest split off, if any, is the
    /// free chunk after it (no two free chunks are neighbours, so a free next is that rest).
    fn split_taken(&mut self, idx: u32, size: u64) {
        let c = *self.state.chunk(idx);
        let rest = (c.next != NONE)
            .then(|| self.state.chunk(c.next))
            .filter(|n| n.free);
        let next_before = rest.map_or(c.next, |r| r.next);
        let rest = rest.map_or(0, |r| r.size);
        if c.prev != NONE || next_before != NONE {
            self.stats.inactive_split -= size;
        } else {
            self.stats.inactive_split += rest;
        }
    }

    /// A new device allocation of `size` bytes (`_try_malloc`): tried, then after
    /// `free_all_blocks`, then after it again.
    fn try_malloc(&mut self, size: u64) -> Option<u64> {
        for attempt in 0..3 {
            if attempt > 0 {
                self.free_all_blocks();
            }
            if self
                .capacity
                .is_none_or(|c| self.stats.reserved.saturating_add(size) <= c)
            {
                let ptr = self.bump;
                self.bump += size;
                self.stats.reserved += size;
                self.stats.peak_reserved = self.stats.peak_reserved.max(self.stats.reserved);
                self.stats.segments += 1;
                self.stats.device_allocs += 1;
                return Some(ptr);
            }
        }
        None
    }

    fn oom(&self, requested: u64, size: u64) -> Oom {
        Oom {
            requested,
            size,
            alloc_size: size,
            reserved: self.stats.reserved,
            allocated: self.stats.allocated,
        }
    }
}

impl Model for Pool {
    type Block = Block;

    fn malloc(&mut self, size: u64, stream: u32) -> Result<Block, Oom> {
        Pool::malloc(self, size, stream)
    }

    fn block_size(block: &Block) -> u64 {
        block.size
    }

    /// CuPy frees a block at once: it has no `record_stream` wait.
    fn free_requested(&mut self, block: Block) {
        self.free(block.id);
    }

    fn free_completed(&mut self, block: Block) {
        self.free(block.id);
    }

    fn empty_cache(&mut self) {
        self.free_all_blocks();
    }

    fn stats(&self) -> Stats {
        self.stats
    }
}
