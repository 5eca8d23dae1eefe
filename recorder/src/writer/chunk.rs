//! One chunk in the mapped file: laid out from a template, filled in place, sealed in place.
//!
//! A template is a complete size-prefixed `Chunk` FlatBuffer built once per event stream with
//! the real builder, whose event vector is empty and is the last object of the buffer. Opening
//! a chunk copies the template into the region, then patches the size prefix (the region's
//! length) and the meta fields. Appending an event writes it just past the last one and then
//! stores the vector's new length, so at every instant the region is a valid buffer holding
//! every complete event — that is what survives a SIGKILL.

use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};

use flatbuffers::FlatBufferBuilder;
use poolsight_schema::{chunk_crc, fb, finish_chunk, meta_field, meta_offset};

use super::file::{MappedFile, Region};

/// The three per-thread event streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stream {
    Mem,
    Scope,
    Mark,
}

impl Stream {
    pub const ALL: [Stream; 3] = [Stream::Mem, Stream::Scope, Stream::Mark];

    pub fn event_size(self) -> usize {
        match self {
            Stream::Mem => std::mem::size_of::<fb::MemEvent>(),
            Stream::Scope => std::mem::size_of::<fb::ScopeEvent>(),
            Stream::Mark => std::mem::size_of::<fb::MarkEvent>(),
        }
    }
}

pub(crate) struct Template {
    bytes: Vec<u8>,
    /// Offsets from the region start (the size prefix).
    meta_at: usize,
    len_at: usize,
    event_size: usize,
}

impl Template {
    pub fn build(stream: Stream) -> Template {
        let mut fbb = FlatBufferBuilder::with_capacity(256);
        // Built first, so it ends up last in the buffer.
        let body = match stream {
            Stream::Mem => {
                let events = fbb.create_vector::<fb::MemEvent>(&[]);
                let t = fb::MemEvents::create(
                    &mut fbb,
                    &fb::MemEventsArgs {
                        events: Some(events),
                    },
                );
                (fb::ChunkBody::MemEvents, t.as_union_value())
            }
            Stream::Scope => {
                let events = fbb.create_vector::<fb::ScopeEvent>(&[]);
                let t = fb::ScopeEvents::create(
                    &mut fbb,
                    &fb::ScopeEventsArgs {
                        events: Some(events),
                    },
                );
                (fb::ChunkBody::ScopeEvents, t.as_union_value())
            }
            Stream::Mark => {
                let events = fbb.create_vector::<fb::MarkEvent>(&[]);
                let t = fb::MarkEvents::create(
                    &mut fbb,
                    &fb::MarkEventsArgs {
                        events: Some(events),
                    },
                );
                (fb::ChunkBody::MarkEvents, t.as_union_value())
            }
        };
        let bytes = finish_chunk(&mut fbb, body.0, body.1);
        let chunk = fb::size_prefixed_root_as_chunk(&bytes).expect("template verifies");
        let meta_at = meta_offset(&bytes, chunk.meta());
        let events_at = match stream {
            Stream::Mem => {
                vector_start(&bytes, chunk.body_as_mem_events().and_then(|b| b.events()))
            }
            Stream::Scope => vector_start(
                &bytes,
                chunk.body_as_scope_events().and_then(|b| b.events()),
            ),
            Stream::Mark => {
                vector_start(&bytes, chunk.body_as_mark_events().and_then(|b| b.events()))
            }
        };
        // The append-in-place protocol depends on this; a flatbuffers upgrade that laid the
        // buffer out differently must fail loudly here, not write unreadable files.
        assert_eq!(
            events_at,
            bytes.len(),
            "event vector is not last in the template"
        );
        assert_eq!(events_at % 8, 0, "event vector is not 8-aligned");
        Template {
            len_at: events_at - 4,
            meta_at,
            event_size: stream.event_size(),
            bytes,
        }
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }
}

fn vector_start<T>(buf: &[u8], v: Option<flatbuffers::Vector<'_, T>>) -> usize {
    let v = v.expect("template has an event vector");
    v.bytes().as_ptr() as usize - buf.as_ptr() as usize
}

/// Writes a complete chunk (definitions, footer) into `region` and seals it.
pub(crate) fn write_sealed(file: &MappedFile, region: &Region, bytes: &[u8], seq: u64) {
    debug_assert!(bytes.len() as u64 <= region.len);
    let chunk = fb::size_prefixed_root_as_chunk(bytes).expect("built chunk verifies");
    let meta_at = meta_offset(bytes, chunk.meta());
    file.write_at(region.offset, bytes);
    let base = unsafe { file.base().add(region.offset as usize) };
    // SAFETY: the region was reserved by this caller and is at least `bytes.len()` long.
    unsafe {
        put_u32(base, 0, (region.len - 4) as u32);
        put_u64(base, meta_at + meta_field::SEQ, seq);
        seal(base, meta_at, bytes.len() - 4);
    }
}

/// How far ahead of the event being written its cache line is asked for (`prefetchw` where the
/// build targets it, `prefetcht0` otherwise). The chunk's lines are not in the core's caches
/// (the preparer faulted the pages in long before), so each first store to a line waits for
/// it; asking 512 bytes (16 events) ahead hides that wait behind the events in between: 3–4 ns
/// per event measured. A prefetch never faults, so one past the region's end is harmless.
#[cfg(target_arch = "x86_64")]
const PREFETCH_AHEAD: usize = 512;

/// A chunk being filled by one thread.
pub(crate) struct OpenChunk {
    pub region: Region,
    base: *mut u8,
    meta_at: usize,
    len_at: usize,
    event_size: usize,
    pub cap: u32,
    pub count: u32,
    /// Base of the 32-bit timestamp deltas.
    pub base_ticks: u64,
}

impl OpenChunk {
    pub fn open(
        file: &MappedFile,
        region: Region,
        tpl: &Template,
        seq: u64,
        thread: u32,
        now: u64,
    ) -> OpenChunk {
        let base = unsafe { file.base().add(region.offset as usize) };
        file.write_at(region.offset, &tpl.bytes);
        // SAFETY: the region was reserved by this thread and holds at least the template.
        unsafe {
            put_u32(base, 0, (region.len - 4) as u32);
            put_u64(base, tpl.meta_at + meta_field::SEQ, seq);
            put_u64(base, tpl.meta_at + meta_field::BASE_TICKS, now);
            put_u32(base, tpl.meta_at + meta_field::THREAD, thread);
        }
        let cap = ((region.len as usize - tpl.len()) / tpl.event_size) as u32;
        OpenChunk {
            region,
            base,
            meta_at: tpl.meta_at,
            len_at: tpl.len_at,
            event_size: tpl.event_size,
            cap,
            count: 0,
            base_ticks: now,
        }
    }

    /// Appends one event. The caller checked `!is_full()`.
    #[inline(always)]
    pub fn push<const N: usize>(&mut self, event: &[u8; N]) {
        debug_assert_eq!(N, self.event_size);
        debug_assert!(self.count < self.cap);
        // SAFETY: count < cap, so the event lies inside the region this thread owns; the length
        // field is 4-aligned (the vector start is 8-aligned and the field precedes it).
        unsafe {
            let at = self.len_at + 4 + self.count as usize * N;
            #[cfg(target_arch = "x86_64")]
            core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_ET0 }>(
                self.base.wrapping_add(at + PREFETCH_AHEAD) as *const i8,
            );
            std::ptr::copy_nonoverlapping(event.as_ptr(), self.base.add(at), N);
            self.count += 1;
            // Release: a reader that sees the new length sees the event's bytes (on x86 this is
            // a plain store; the ordering matters on weaker memory models).
            (*(self.base.add(self.len_at) as *const AtomicU32))
                .store(self.count, Ordering::Release);
        }
    }

    /// Seals the chunk in place: used length, checksum, then the state byte last.
    pub fn seal(&mut self) {
        let used = self.len_at + 4 + self.count as usize * self.event_size - 4;
        // SAFETY: as in push; the chunk is not touched after sealing.
        unsafe { seal(self.base, self.meta_at, used) };
    }
}

/// Seals the chunk at `base` whose buffer (after the size prefix) has `used` bytes in use. The
/// checksum covers the size prefix too (format 1.1), so the prefix is final before this runs.
unsafe fn seal(base: *mut u8, meta_at: usize, used: usize) {
    put_u32(base, meta_at + meta_field::USED, used as u32);
    let chunk = std::slice::from_raw_parts(base, 4 + used);
    let crc = chunk_crc(chunk, meta_at, 4 + used).unwrap_or(0);
    put_u32(base, meta_at + meta_field::CRC32, crc);
    // Release: the checksum and every event are visible before the state says Sealed.
    (*(base.add(meta_at + meta_field::STATE) as *const AtomicU8))
        .store(fb::ChunkState::Sealed.0, Ordering::Release);
}

unsafe fn put_u32(base: *mut u8, at: usize, v: u32) {
    std::ptr::copy_nonoverlapping(v.to_le_bytes().as_ptr(), base.add(at), 4);
}

unsafe fn put_u64(base: *mut u8, at: usize, v: u64) {
    std::ptr::copy_nonoverlapping(v.to_le_bytes().as_ptr(), base.add(at), 8);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_end_with_their_event_vector() {
        for s in Stream::ALL {
            let t = Template::build(s);
            assert_eq!(t.len_at + 4, t.len());
            assert!(t.meta_at < t.len_at);
        }
    }
}
