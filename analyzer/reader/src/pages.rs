//! Giving a trace's pages back to the kernel once a pass is done with them, so that a pass over
//! a trace larger than RAM keeps only what is in flight resident; and grouping chunks into
//! windows of neighbouring regions, the unit of both parallel work and page release.

use memmap2::Mmap;

use super::trace::Trace;
use super::types::ChunkInfo;

impl Trace {
    /// Tells the kernel this process is done with a chunk's pages for now, so that a pass over
    /// a trace larger than RAM keeps only the chunks in flight resident. The bytes stay in the
    /// page cache; touching them again maps them back.
    pub fn release_pages(&self, c: &ChunkInfo) {
        release(&self.map, c.offset, c.offset + c.len as u64);
    }

    /// Gives back the whole pages between two file offsets (see [`Trace::release_pages`]).
    /// Releasing in large spans matters: each release interrupts every core running this
    /// process to flush its TLB, so a release per 64 KiB chunk costs more than the reading.
    pub fn release_span(&self, start: u64, end: u64) {
        release(&self.map, start, end);
    }

    /// Groups chunks into runs of neighbouring file regions of at most [`WINDOW`] bytes, in
    /// file order: the unit of parallel work of a pass that releases pages as it goes.
    pub fn windows<'a>(
        &self,
        chunks: impl Iterator<Item = &'a ChunkInfo>,
    ) -> Vec<Vec<&'a ChunkInfo>> {
        let list: Vec<&ChunkInfo> = chunks.collect();
        windows(&list, |c| (c.offset, c.len))
            .into_iter()
            .map(|w| w.into_iter().copied().collect())
            .collect()
    }

    /// Releases the pages of chunks a pass is done with, in as few calls as their layout
    /// allows: each call costs every other core running the pass a TLB flush, so neighbours
    /// go together, across gaps of up to [`MIN_WINDOW`] (whose pages some other worker may
    /// still read: it faults them back in).
    pub fn release_chunks<'a>(&self, chunks: impl Iterator<Item = &'a ChunkInfo>) {
        let mut spans: Vec<(u64, u64)> = chunks
            .map(|c| (c.offset, c.offset + c.len as u64))
            .collect();
        spans.sort_unstable();
        let mut run: Option<(u64, u64)> = None;
        for (lo, hi) in spans {
            run = match run {
                Some((a, b)) if lo <= b.saturating_add(MIN_WINDOW) => Some((a, b.max(hi))),
                Some((a, b)) => {
                    release(&self.map, a, b);
                    Some((lo, hi))
                }
                None => Some((lo, hi)),
            };
        }
        if let Some((a, b)) = run {
            release(&self.map, a, b);
        }
    }

    /// Releases the pages of a window of [`Trace::windows`] once it is processed.
    pub fn release_window(&self, window: &[&ChunkInfo]) {
        release_window(&self.map, window.iter().map(|c| (c.offset, c.len)));
    }
}

/// Bytes per unit of page release: large enough that releases are rare, small enough that a
/// pass keeps little resident.
pub const WINDOW: u64 = 8 << 20;

/// Smallest unit of parallel work, so that a small trace still splits across the threads.
const MIN_WINDOW: u64 = 256 << 10;

/// Groups items with (offset, len) into runs of neighbouring regions, sorted by offset: about
/// [`WINDOW`] bytes each, or fewer so that every thread gets several runs.
pub(super) fn windows<T>(items: &[T], span: impl Fn(&T) -> (u64, u32)) -> Vec<Vec<&T>> {
    let mut sorted: Vec<&T> = items.iter().collect();
    sorted.sort_by_key(|t| span(t).0);
    let total: u64 = sorted.iter().map(|t| span(t).1 as u64).sum();
    let size = (total / (4 * rayon::current_num_threads() as u64)).clamp(MIN_WINDOW, WINDOW);
    let mut out: Vec<Vec<&T>> = Vec::new();
    let mut start = 0u64;
    for t in sorted {
        let (off, _) = span(t);
        match out.last_mut() {
            Some(w) if off.saturating_sub(start) < size => w.push(t),
            _ => {
                start = off;
                out.push(vec![t]);
            }
        }
    }
    out
}

pub(super) fn release_window(map: &Mmap, spans: impl Iterator<Item = (u64, u32)>) {
    let (mut lo, mut hi) = (u64::MAX, 0u64);
    for (off, len) in spans {
        lo = lo.min(off);
        hi = hi.max(off + len as u64);
    }
    if lo < hi {
        release(map, lo, hi);
    }
}

const PAGE: u64 = 4096;

/// Releases the whole pages inside [start, end): pages shared with a neighbouring region,
/// which another thread may be reading, stay.
#[cfg(unix)]
pub(super) fn release(map: &Mmap, start: u64, end: u64) {
    let start = start.div_ceil(PAGE) * PAGE;
    let end = (end.min(map.len() as u64) / PAGE) * PAGE;
    if start >= end {
        return;
    }
    // SAFETY: the mapping is a read-only shared mapping of a file that is not written while
    // analyzed; MADV_DONTNEED on it only drops this process's page-table entries, and the next
    // access refaults the same bytes from the file. Slices into it stay valid. Failure only
    // means the pages stay resident, so the result is ignored.
    let _ = unsafe {
        map.unchecked_advise_range(
            memmap2::UncheckedAdvice::DontNeed,
            start as usize,
            (end - start) as usize,
        )
    };
}

#[cfg(not(unix))]
pub(super) fn release(_map: &Mmap, _start: u64, _end: u64) {}
