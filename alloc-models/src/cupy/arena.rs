//! CuPy's pool policy (`SingleDeviceMemoryPool`'s bookkeeping): chunks of device allocations,
//! and per-stream arenas of free chunks, best fit over bins of sizes. The pool that serves real
//! memory (`poolsight-pool`) keeps one [`State`] behind its lock; the replay of a run through
//! CuPy's pool ([`super::model`]) keeps one too.
//!
//! The invariants live in this one small place:
//! - a chunk is a byte range of one device allocation; the chunks of an allocation are a
//!   doubly linked list in address order (`prev`/`next`), all in the same arena;
//! - a chunk is either handed out (owned by one `PooledMemory`) or free (in its arena's bins);
//! - no two neighbouring chunks are both free (freeing merges), so an allocation whose memory
//!   is all free is exactly one chunk with no neighbours, which `free_all_blocks` can return.

use std::collections::{BTreeMap, BTreeSet};

/// "No chunk", for `prev`/`next`.
pub const NONE: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
pub struct Chunk {
    pub ptr: u64,
    pub size: u64,
    pub prev: u32,
    pub next: u32,
    /// Index of the arena (stable: arenas are never removed).
    pub arena: u32,
    /// In the arena's bins (as opposed to handed out).
    pub free: bool,
    /// Position in its bin while free; makes removal for merging O(1).
    pub(crate) bin_pos: u32,
    /// Whether the slot holds a chunk (slots are recycled).
    pub live: bool,
}

/// Sizes up to this many allocation units (1 MiB) have a directly indexed bin; larger ones
/// live in an ordered map. Training workloads allocate mostly small and medium tensors, and an
/// indexed bin plus a bitmap search is several times cheaper than two B-tree walks per call.
const SMALL_BINS: usize = 2048;
const UNIT: u64 = super::ALLOCATION_UNIT_SIZE;

#[inline]
fn small_index(size: u64) -> Option<usize> {
    let units = (size / UNIT) as usize;
    (size <= SMALL_BINS as u64 * UNIT).then(|| units - 1)
}

/// Free chunks of one stream. CuPy keeps one arena per stream so that memory freed on one
/// stream is never handed to another stream while the first may still be using it.
#[derive(Debug)]
pub(crate) struct Arena {
    pub(crate) stream: u32,
    /// Free chunks of `(i + 1) * 512` bytes in `small[i]`, grown on demand. Emptied bins are
    /// kept, so that a steady malloc/free cycle does not allocate.
    small: Vec<Vec<u32>>,
    /// Bit `i` set when `small[i]` is non-empty: best fit is a scan for the next set bit.
    small_bits: [u64; SMALL_BINS / 64],
    /// Free chunks larger than the small bins, by size; `large_nonempty` is what best fit
    /// searches.
    large: BTreeMap<u64, Vec<u32>>,
    large_nonempty: BTreeSet<u64>,
    n_free: usize,
}

impl Arena {
    fn new(stream: u32) -> Self {
        Arena {
            stream,
            small: Vec::new(),
            small_bits: [0; SMALL_BINS / 64],
            large: BTreeMap::new(),
            large_nonempty: BTreeSet::new(),
            n_free: 0,
        }
    }

    /// The bin of `size`, created if needed.
    #[inline]
    fn bin_mut(&mut self, size: u64) -> &mut Vec<u32> {
        match small_index(size) {
            Some(i) => {
                if self.small.len() <= i {
                    self.small.resize_with(i + 1, Vec::new);
                }
                &mut self.small[i]
            }
            None => self.large.entry(size).or_default(),
        }
    }

    #[inline]
    fn set_nonempty(&mut self, size: u64, nonempty: bool) {
        match small_index(size) {
            Some(i) => {
                let bit = 1u64 << (i % 64);
                if nonempty {
                    self.small_bits[i / 64] |= bit;
                } else {
                    self.small_bits[i / 64] &= !bit;
                }
            }
            None => {
                if nonempty {
                    self.large_nonempty.insert(size);
                } else {
                    self.large_nonempty.remove(&size);
                }
            }
        }
    }

    /// Size of the smallest non-empty bin holding chunks of at least `size` bytes.
    #[inline]
    fn best_fit(&self, size: u64) -> Option<u64> {
        if let Some(i) = small_index(size) {
            let mut w = i / 64;
            let mut bits = self.small_bits[w] & (!0u64 << (i % 64));
            loop {
                if bits != 0 {
                    let j = w * 64 + bits.trailing_zeros() as usize;
                    return Some((j as u64 + 1) * UNIT);
                }
                w += 1;
                if w == self.small_bits.len() {
                    break;
                }
                bits = self.small_bits[w];
            }
        }
        self.large_nonempty.range(size..).next().copied()
    }

    fn push(&mut self, chunks: &mut [Chunk], idx: u32) {
        let size = chunks[idx as usize].size;
        let bin = self.bin_mut(size);
        let pos = bin.len() as u32;
        bin.push(idx);
        if pos == 0 {
            self.set_nonempty(size, true);
        }
        let c = &mut chunks[idx as usize];
        c.free = true;
        c.bin_pos = pos;
        self.n_free += 1;
    }

    fn remove(&mut self, chunks: &mut [Chunk], idx: u32) {
        let (size, pos) = {
            let c = &mut chunks[idx as usize];
            c.free = false;
            (c.size, c.bin_pos as usize)
        };
        let bin = self.bin_mut(size);
        debug_assert_eq!(bin.get(pos), Some(&idx));
        bin.swap_remove(pos);
        if let Some(&moved) = bin.get(pos) {
            chunks[moved as usize].bin_pos = pos as u32;
        }
        if bin.is_empty() {
            self.set_nonempty(size, false);
        }
        self.n_free -= 1;
    }

    /// Moves every whole-allocation chunk of `bin` to `out`/`vacated`; returns the bytes.
    fn drain_bin(
        bin: &mut Vec<u32>,
        chunks: &mut [Chunk],
        out: &mut Vec<(u64, u64)>,
        vacated: &mut Vec<u32>,
    ) -> u64 {
        let mut bytes = 0;
        let mut i = 0;
        while i < bin.len() {
            let idx = bin[i];
            let c = &chunks[idx as usize];
            if c.prev != NONE || c.next != NONE {
                i += 1;
                continue;
            }
            out.push((c.ptr, c.size));
            bytes += c.size;
            bin.swap_remove(i);
            if let Some(&moved) = bin.get(i) {
                chunks[moved as usize].bin_pos = i as u32;
            }
            vacated.push(idx);
        }
        bytes
    }

    /// Removes the free chunks that are whole device allocations; see [`State::drain_unsplit`].
    fn drain(
        &mut self,
        chunks: &mut [Chunk],
        out: &mut Vec<(u64, u64)>,
        vacated: &mut Vec<u32>,
    ) -> u64 {
        let before = vacated.len();
        let mut bytes = 0;
        for (i, bin) in self.small.iter_mut().enumerate() {
            bytes += Self::drain_bin(bin, chunks, out, vacated);
            if bin.is_empty() {
                self.small_bits[i / 64] &= !(1u64 << (i % 64));
            }
        }
        for (size, bin) in self.large.iter_mut() {
            bytes += Self::drain_bin(bin, chunks, out, vacated);
            if bin.is_empty() {
                self.large_nonempty.remove(size);
            }
        }
        // Forget large sizes no longer cached, so the map does not pile up over a long run.
        self.large.retain(|_, bin| !bin.is_empty());
        self.n_free -= vacated.len() - before;
        bytes
    }
}

/// Everything behind the pool's lock.
#[derive(Debug, Default)]
pub struct State {
    chunks: Vec<Chunk>,
    vacant: Vec<u32>,
    arenas: Vec<Arena>,
}

impl State {
    /// Index of the arena of `stream`, created on first use. Streams are few, so a linear scan
    /// beats hashing, and stream 0 (the common case) is usually first.
    #[inline]
    pub fn arena_index(&mut self, stream: u32) -> u32 {
        if let Some(i) = self.arenas.iter().position(|a| a.stream == stream) {
            return i as u32;
        }
        self.arenas.push(Arena::new(stream));
        (self.arenas.len() - 1) as u32
    }

    fn new_slot(&mut self, chunk: Chunk) -> u32 {
        match self.vacant.pop() {
            Some(i) => {
                self.chunks[i as usize] = chunk;
                i
            }
            None => {
                self.chunks.push(chunk);
                (self.chunks.len() - 1) as u32
            }
        }
    }

    /// The chunk in slot `idx` (as [`State::take_best_fit`] and [`State::add_allocation`]
    /// name them).
    #[inline]
    pub fn chunk(&self, idx: u32) -> &Chunk {
        &self.chunks[idx as usize]
    }

    fn release_slot(&mut self, idx: u32) {
        self.chunks[idx as usize].live = false;
        self.vacant.push(idx);
    }

    /// Registers a fresh device allocation as one handed-out chunk.
    #[inline]
    pub fn add_allocation(&mut self, ptr: u64, size: u64, arena: u32) -> u32 {
        self.new_slot(Chunk {
            ptr,
            size,
            prev: NONE,
            next: NONE,
            arena,
            free: false,
            bin_pos: 0,
            live: true,
        })
    }

    /// Best fit: takes the smallest free chunk of at least `size` bytes from the arena, splits
    /// off the rest (which stays free, unmerged, as in CuPy) and returns the chunk and address.
    #[inline]
    pub fn take_best_fit(&mut self, arena: u32, size: u64) -> Option<(u32, u64)> {
        let a = &mut self.arenas[arena as usize];
        let bin_size = a.best_fit(size)?;
        let idx = *a.bin_mut(bin_size).last()?;
        a.remove(&mut self.chunks, idx);
        let c = self.chunks[idx as usize];
        if c.size > size {
            let rest = self.new_slot(Chunk {
                ptr: c.ptr + size,
                size: c.size - size,
                prev: idx,
                next: c.next,
                arena,
                free: false,
                bin_pos: 0,
                live: true,
            });
            if c.next != NONE {
                self.chunks[c.next as usize].prev = rest;
            }
            let head = &mut self.chunks[idx as usize];
            head.next = rest;
            head.size = size;
            self.arenas[arena as usize].push(&mut self.chunks, rest);
        }
        Some((idx, c.ptr))
    }

    /// Returns a handed-out chunk to its arena, merged with free neighbours.
    #[inline]
    pub fn give_back(&mut self, mut idx: u32) {
        let arena = self.chunks[idx as usize].arena as usize;
        loop {
            let next = self.chunks[idx as usize].next;
            if next == NONE || !self.chunks[next as usize].free {
                break;
            }
            self.arenas[arena].remove(&mut self.chunks, next);
            let n = self.chunks[next as usize];
            let c = &mut self.chunks[idx as usize];
            c.size += n.size;
            c.next = n.next;
            if n.next != NONE {
                self.chunks[n.next as usize].prev = idx;
            }
            self.release_slot(next);
        }
        loop {
            let prev = self.chunks[idx as usize].prev;
            if prev == NONE || !self.chunks[prev as usize].free {
                break;
            }
            self.arenas[arena].remove(&mut self.chunks, prev);
            let c = self.chunks[idx as usize];
            let p = &mut self.chunks[prev as usize];
            p.size += c.size;
            p.next = c.next;
            if c.next != NONE {
                self.chunks[c.next as usize].prev = prev;
            }
            self.release_slot(idx);
            idx = prev;
        }
        self.arenas[arena].push(&mut self.chunks, idx);
    }

    /// Removes every free chunk that is a whole device allocation from the arenas selected by
    /// `stream` (all when `None`), appending `(ptr, size)` to `out` and `(stream, bytes)` per
    /// arena to `per_arena`. Split chunks stay: part of their allocation is still in use.
    pub fn drain_unsplit(
        &mut self,
        stream: Option<u32>,
        out: &mut Vec<(u64, u64)>,
        per_arena: &mut Vec<(u32, u64)>,
    ) {
        let mut vacated = Vec::new();
        for a in self.arenas.iter_mut() {
            if stream.is_some_and(|s| s != a.stream) {
                continue;
            }
            let bytes = a.drain(&mut self.chunks, out, &mut vacated);
            if bytes > 0 {
                per_arena.push((a.stream, bytes));
            }
        }
        for idx in vacated {
            self.chunks[idx as usize].free = false;
            self.release_slot(idx);
        }
    }

    pub fn n_free_blocks(&self) -> usize {
        self.arenas.iter().map(|a| a.n_free).sum()
    }

    /// Every device allocation as `(ptr, size)`, for returning them all when the pool dies.
    pub fn allocations(&self) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        for c in self.chunks.iter().filter(|c| c.live && c.prev == NONE) {
            let mut size = c.size;
            let mut next = c.next;
            while next != NONE {
                let n = &self.chunks[next as usize];
                size += n.size;
                next = n.next;
            }
            out.push((c.ptr, size));
        }
        out
    }
}
