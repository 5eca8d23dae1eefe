//! Finding the chunks in a file (docs/format.md, "Chunk framing"): the footer slot, the ring
//! slots, then chunk after chunk, skipping zeroed space and resynchronizing after damage.

use std::fs::File;

use poolsight_schema::{align8, fb};

use memmap2::Mmap;

use super::pages::{release, WINDOW};
use super::types::{Header, Warning};
use super::MIN_PREFIXED_LEN;

/// The smallest chunk: size prefix, root offset, identifier, and a `ChunkMeta` (32 bytes).
pub(super) const MIN_CHUNK_LEN: u64 = 48;

/// Finds every chunk's (offset, length incl. prefix) without trusting anything but bounds.
pub(super) fn walk(
    map: &Mmap,
    file: &File,
    data_offset: u64,
    header: &Header,
    warnings: &mut Vec<Warning>,
) -> Vec<(u64, u32)> {
    let data: &[u8] = map;
    let end = data.len() as u64;
    let mut spans = Vec::new();
    // Size prefixes are read with `pread` and map nothing; what reads through the mapping (ring
    // slots, the searches past a damaged or empty stretch) sets `mapped`, and the pages it
    // passed go back a window at a time.
    let mut mapped = false;
    let mut off = match frame_read(file, data, data_offset) {
        Frame::Chunk(len) => {
            spans.push((data_offset, len));
            align8(data_offset + len as u64)
        }
        other => {
            mapped = true;
            let next = resync(data, data_offset + 8);
            warnings.push(Warning {
                offset: data_offset,
                what: format!(
                    "the footer slot {}: whether the run finished is unknown; reading resumes at offset {next}",
                    other.describe(data_offset, end)
                ),
                torn: true,
            });
            next
        }
    };
    if let (Some(slots), false) = (header.ring, header.packed) {
        // read_header refused slots too small to hold a chunk, so the loop below is bounded by
        // the file's size however large `slots` claims to be.
        let slot_len = align8(header.chunk_size as u64);
        let fit = end.saturating_sub(off) / slot_len;
        if slots as u64 > fit {
            warnings.push(Warning {
                offset: off,
                what: format!(
                    "the header declares {slots} ring slots of {slot_len} bytes but only {fit} fit in the file: it was truncated or its header is damaged"
                ),
                torn: true,
            });
        }
        let slots = (slots as u64).min(fit);
        mapped = true;
        for i in 0..slots {
            let at = off + i * slot_len;
            match frame_at(data, at) {
                Frame::Chunk(len) if len as u64 <= slot_len => spans.push((at, len)),
                Frame::Zero => {}
                other => warnings.push(Warning {
                    offset: at,
                    what: format!(
                        "ring slot {i} does not hold a whole chunk ({}); skipped",
                        match other {
                            Frame::Chunk(len) => format!("a chunk of {len} bytes overflows it"),
                            other => other.describe(at, end),
                        }
                    ),
                    torn: true,
                }),
            }
        }
        off += slots * slot_len;
    }
    let mut released = data_offset;
    while off < end {
        if mapped && off - released >= WINDOW {
            release(map, released, off);
            released = off;
        }
        match frame_read(file, data, off) {
            Frame::Chunk(len) => {
                spans.push((off, len));
                off = align8(off + len as u64);
            }
            Frame::End => break,
            Frame::Zero => {
                mapped = true;
                // A chunk never starts with a zero size, so the search starts one word on.
                let Some(next) = next_nonzero_word(data, off + 8) else {
                    break;
                };
                warnings.push(Warning {
                    offset: off,
                    what: format!(
                        "{} bytes were reserved for a chunk that was never written (writer killed mid-chunk?)",
                        next - off
                    ),
                    torn: true,
                });
                off = next;
            }
            other => {
                mapped = true;
                let next = resync(data, off + 8);
                let tail = if next < end {
                    format!("reading resumes at the next chunk, at offset {next}")
                } else {
                    "no chunk follows".to_owned()
                };
                warnings.push(Warning {
                    offset: off,
                    what: format!("{}; {tail}", other.describe(off, end)),
                    torn: true,
                });
                off = next;
            }
        }
    }
    if mapped {
        release(map, released, end);
    }
    spans
}

/// What starts at an offset where a chunk may start.
#[derive(Debug, Clone, Copy)]
enum Frame {
    /// A size prefix that fits in the file followed by the chunk identifier: the length, prefix
    /// included.
    Chunk(u32),
    /// A zero size prefix: reserved, never written.
    Zero,
    /// A size that runs past the end of the file.
    Cut { claims: u64 },
    /// A size that fits, but no chunk identifier after it.
    NotAChunk { claims: u64 },
    /// Fewer than 4 bytes left.
    End,
}

impl Frame {
    fn describe(self, off: u64, end: u64) -> String {
        match self {
            Frame::Chunk(len) => format!("holds a chunk of {len} bytes"),
            Frame::Zero => "is empty (zero size prefix)".to_owned(),
            Frame::Cut { claims } => format!(
                "chunk claims {claims} bytes but the file ends after {}: the file is truncated or the size is damaged; the chunk is lost",
                end.saturating_sub(off)
            ),
            Frame::NotAChunk { claims } => format!(
                "no chunk starts here (a size prefix of {} bytes without the \"PSTC\" identifier): the size of the chunk before it or this chunk was damaged",
                claims.saturating_sub(4)
            ),
            Frame::End => "is cut off by the end of the file".to_owned(),
        }
    }
}

fn frame_at(data: &[u8], off: u64) -> Frame {
    let end = data.len() as u64;
    let head = data.get(off as usize..).unwrap_or_default();
    frame_head(&head[..head.len().min(MIN_PREFIXED_LEN)], off, end)
}

/// [`frame_at`], reading the frame's first bytes with a system call rather than through the
/// mapping: the walk visits one spot every chunk, and a fault there would map the pages
/// around it too (the kernel's fault-around), pages the walk would then have to give back.
/// Where the read fails, the mapping has the same bytes.
#[cfg(unix)]
fn frame_read(file: &File, data: &[u8], off: u64) -> Frame {
    use std::os::unix::fs::FileExt;
    let end = data.len() as u64;
    let mut head = [0u8; MIN_PREFIXED_LEN];
    let n = end.saturating_sub(off).min(MIN_PREFIXED_LEN as u64) as usize;
    match file.read_exact_at(&mut head[..n], off) {
        Ok(()) => frame_head(&head[..n], off, end),
        Err(_) => frame_at(data, off),
    }
}

#[cfg(not(unix))]
fn frame_read(_file: &File, data: &[u8], off: u64) -> Frame {
    frame_at(data, off)
}

/// The frame at `off` from its first bytes, `head` (up to [`MIN_PREFIXED_LEN`] of them).
fn frame_head(head: &[u8], off: u64, end: u64) -> Frame {
    if off.checked_add(4).is_none_or(|e| e > end) {
        return Frame::End;
    }
    let size = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as u64;
    if size == 0 {
        return Frame::Zero;
    }
    let claims = size + 4;
    if off + claims > end {
        return Frame::Cut { claims };
    }
    if claims < MIN_PREFIXED_LEN as u64 || &head[8..12] != fb::CHUNK_IDENTIFIER.as_bytes() {
        return Frame::NotAChunk { claims };
    }
    Frame::Chunk(claims as u32)
}

/// The first 8-aligned offset at or after `from` where a chunk starts, or the file's end.
fn resync(data: &[u8], from: u64) -> u64 {
    let end = data.len() as u64;
    let mut at = align8(from);
    while at < end {
        if let Frame::Chunk(_) = frame_at(data, at) {
            return at;
        }
        at += 8;
    }
    end
}

/// The first 8-aligned offset at or after `from` whose 8 bytes are not all zero.
fn next_nonzero_word(data: &[u8], from: u64) -> Option<u64> {
    data.get(from as usize..)?
        .chunks_exact(8)
        .position(|w| w != [0u8; 8])
        .map(|i| from + 8 * i as u64)
}
