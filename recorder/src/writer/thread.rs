//! Per-thread writers: the hot path.
//!
//! Each thread that records gets, per recorder, one open chunk per event stream, living in the
//! mapped file. Recording an event is: a thread-local lookup, one relaxed load (is the recorder
//! closed?), a clock read (or a time the caller read), a 16- or 32-byte copy and a store of the new length. No lock, no
//! syscall, no allocation. A full chunk is sealed in place and a new region is reserved with one
//! atomic. When the thread exits, its chunks are sealed by the thread-local's destructor.

use std::cell::{Cell, UnsafeCell};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use poolsight_schema::{align8, fb};

use super::chunk::{OpenChunk, Stream};
use super::Shared;
use crate::kinds::{MarkKind, MemKind};

pub(crate) struct ThreadWriter {
    shared: Arc<Shared>,
    thread: u32,
    chunks: [Option<OpenChunk>; 3],
}

impl ThreadWriter {
    fn new(shared: Arc<Shared>) -> ThreadWriter {
        let thread = shared.next_thread.fetch_add(1, Ordering::Relaxed);
        let current = std::thread::current();
        let name = current
            .name()
            .map(str::to_owned)
            .unwrap_or_else(|| format!("{:?}", current.id()));
        shared.define_thread(thread, os_tid(), &name);
        ThreadWriter {
            shared,
            thread,
            chunks: [None, None, None],
        }
    }

    /// The open chunk of `stream` with room for `need` events, opening a new one if needed.
    #[inline(always)]
    fn chunk(&mut self, stream: Stream, need: u32, now: u64) -> Option<&mut OpenChunk> {
        let idx = stream as usize;
        let has_room = matches!(&self.chunks[idx], Some(c) if c.count + need <= c.cap);
        if !has_room {
            self.rotate(stream, now)?;
        }
        self.chunks[idx].as_mut()
    }

    #[cold]
    fn rotate(&mut self, stream: Stream, now: u64) -> Option<()> {
        self.seal(stream);
        let shared = &self.shared;
        let region = match stream {
            Stream::Mark => shared.file.reserve(align8(shared.mark_chunk_len)),
            _ if shared.file.is_ring() => shared.file.claim_slot(),
            _ => shared.file.reserve(shared.chunk_len),
        }?;
        let seq = shared.next_seq();
        let chunk = OpenChunk::open(
            &shared.file,
            region,
            shared.template(stream),
            seq,
            self.thread,
            now,
        );
        self.chunks[stream as usize] = Some(chunk);
        Some(())
    }

    fn seal(&mut self, stream: Stream) {
        if let Some(mut c) = self.chunks[stream as usize].take() {
            c.seal();
            self.shared.file.release_slot(&c.region);
            self.shared
                .events
                .fetch_add(c.count as u64, Ordering::Relaxed);
            self.shared.chunks.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn seal_all(&mut self) {
        for s in Stream::ALL {
            self.seal(s);
        }
    }

    #[inline(always)]
    pub fn mem(&mut self, r: &MemRecord, now: u64) {
        let Some(c) = self.chunk(Stream::Mem, 2, now) else {
            return self.shared.count_dropped(1);
        };
        let mut delta = now.wrapping_sub(c.base_ticks);
        if delta > u32::MAX as u64 {
            c.push(&rebase_mem(now).0);
            c.base_ticks = now;
            delta = 0;
        }
        let ev = fb::MemEvent::new(
            delta as u32,
            r.kind.into(),
            r.device,
            r.stream,
            r.ptr,
            r.bytes,
            r.stack,
            r.pmem,
        );
        c.push(&ev.0);
    }

    #[inline(always)]
    pub fn scope(&mut self, stack: u32, start_ticks: u64, now: u64) {
        let Some(c) = self.chunk(Stream::Scope, 2, now) else {
            return self.shared.count_dropped(1);
        };
        let mut delta = now.wrapping_sub(c.base_ticks);
        if delta > u32::MAX as u64 {
            c.push(&fb::ScopeEvent::new(0, 0, now).0);
            c.base_ticks = now;
            delta = 0;
        }
        let ev = fb::ScopeEvent::new(delta as u32, stack, now.saturating_sub(start_ticks));
        c.push(&ev.0);
    }

    pub fn mark(&mut self, kind: MarkKind, aux: u32, a: u64, b: u64, now: u64) {
        let Some(c) = self.chunk(Stream::Mark, 1, now) else {
            return self.shared.count_dropped(1);
        };
        c.push(&fb::MarkEvent::new(now, kind.into(), aux, a, b).0);
    }
}

fn rebase_mem(now: u64) -> fb::MemEvent {
    fb::MemEvent::new(0, fb::MemKind::Rebase, 0, 0, now, 0, 0, 0)
}

impl Drop for ThreadWriter {
    fn drop(&mut self) {
        self.seal_all();
    }
}

/// The thread id the OS shows (`top -H`, `perf`), to name the thread in reports.
#[cfg(target_os = "linux")]
fn os_tid() -> u64 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u64 }
}

/// Other systems have no portable numeric thread id; the trace's own thread ids and names
/// still tell threads apart.
#[cfg(not(target_os = "linux"))]
fn os_tid() -> u64 {
    0
}

/// One memory event (see `MemEvent` in trace.fbs for what each field holds per kind).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemRecord {
    pub kind: MemKind,
    pub device: u8,
    /// The stream (arena) id; 0 is the default stream.
    pub stream: u16,
    /// Address (0 when an allocation failed).
    pub ptr: u64,
    /// `Malloc*`: the requested size; `Alloc*`, `Free*`: the size accounted; other kinds: see
    /// [`MemKind`].
    pub bytes: u64,
    /// `Malloc*`, `Alloc*`: the interned stack of the allocation; `Relabel`: the block's new
    /// stack; else 0.
    pub stack: u32,
    /// The allocation's id (the low 32 bits are kept), pairing a free with its malloc; 0 on
    /// error.
    pub pmem: u32,
}

impl MemRecord {
    /// An event of `kind` with the other fields zeroed, for struct-update syntax. The format
    /// stores devices in a byte and streams in 16 bits: larger ids saturate rather than alias
    /// another device or stream.
    #[inline]
    pub fn new(kind: MemKind, device: u32, stream: u32) -> MemRecord {
        MemRecord {
            kind,
            device: device.min(u8::MAX as u32) as u8,
            stream: stream.min(u16::MAX as u32) as u16,
            ptr: 0,
            bytes: 0,
            stack: 0,
            pmem: 0,
        }
    }
}

/// The writers of this thread, one per recorder it recorded to; usually exactly one. Boxed, so
/// that [`LAST`] can point at one while the list changes.
#[allow(clippy::vec_box)] // the boxes are the point: a pushed writer must not move the others
struct Writers(Vec<Box<ThreadWriter>>);

impl Drop for Writers {
    fn drop(&mut self) {
        forget_last();
        for w in &mut self.0 {
            w.seal_all();
        }
    }
}

thread_local! {
    static WRITERS: UnsafeCell<Writers> = const { UnsafeCell::new(Writers(Vec::new())) };
    /// The writer this thread used last and its recorder: the hot path's one thread-local read.
    /// No destructor and a constant initializer, so reading it is a plain load with no
    /// "is it initialized, is it destroyed" check (which `WRITERS`, having a destructor, needs).
    /// It points into `WRITERS`, and is cleared before any writer it may point at is dropped.
    static LAST: Cell<(*const Shared, *mut ThreadWriter)> =
        const { Cell::new((std::ptr::null(), std::ptr::null_mut())) };
}

fn forget_last() {
    LAST.set((std::ptr::null(), std::ptr::null_mut()));
}

/// Runs `f` with this thread's writer for `shared`, creating it on first use. Returns `None`
/// (and counts a dropped event) after the recorder closed or while the thread is exiting.
#[inline(always)]
pub(crate) fn with_writer(shared: &Arc<Shared>, f: impl FnOnce(&mut ThreadWriter)) {
    if shared.closed.load(Ordering::Relaxed) {
        seal_current_thread(shared);
        return shared.count_dropped(1);
    }
    let (last_shared, last) = LAST.get();
    if std::ptr::eq(last_shared, Arc::as_ptr(shared)) {
        // SAFETY: `last` points at this thread's writer for `shared`, boxed in `WRITERS`, which
        // clears `LAST` before dropping it; nothing else holds a reference to it, since this
        // function never re-enters itself (`f` writes to the mapping and may intern
        // definitions, neither records events).
        return f(unsafe { &mut *last });
    }
    with_writer_slow(shared, f)
}

#[cold]
#[inline(never)]
fn with_writer_slow(shared: &Arc<Shared>, f: impl FnOnce(&mut ThreadWriter)) {
    if shared.forked() {
        // A forked child never caches its parent's recorder in `LAST` (its writers were
        // abandoned at the fork): every event of it comes here, and goes no further.
        return shared.count_dropped(1);
    }
    let ran = WRITERS.try_with(|cell| {
        // SAFETY: as in with_writer; `LAST` is not used while this reference lives.
        let writers = unsafe { &mut *cell.get() };
        let w = find_or_create(writers, shared);
        LAST.set((Arc::as_ptr(shared), w as *mut ThreadWriter));
        f(w)
    });
    if ran.is_err() {
        shared.count_dropped(1);
    }
}

fn find_or_create<'a>(writers: &'a mut Writers, shared: &Arc<Shared>) -> &'a mut ThreadWriter {
    // Writers of recorders that finished hold their mapping alive; let them go.
    forget_last();
    writers
        .0
        .retain(|w| !w.shared.closed.load(Ordering::Relaxed));
    let idx = match writers
        .0
        .iter()
        .position(|w| Arc::ptr_eq(&w.shared, shared))
    {
        Some(i) => i,
        None => {
            writers.0.push(Box::new(ThreadWriter::new(shared.clone())));
            writers.0.len() - 1
        }
    };
    &mut writers.0[idx]
}

/// In a forked child: lets go of this thread's writers without sealing them (their chunks are
/// in the parent's trace, which the parent goes on writing). Leaks them: the child must not
/// run their destructors.
pub(crate) fn abandon_writers() {
    forget_last();
    let _ = WRITERS.try_with(|cell| {
        // SAFETY: as in with_writer; the child's only thread runs this, between two events.
        let writers = unsafe { &mut *cell.get() };
        std::mem::forget(std::mem::take(&mut writers.0));
    });
}

/// Seals this thread's chunks of `shared` (used by `finish` on the finishing thread).
pub(crate) fn seal_current_thread(shared: &Arc<Shared>) {
    let _ = WRITERS.try_with(|cell| {
        // SAFETY: as in with_writer.
        let writers = unsafe { &mut *cell.get() };
        forget_last();
        writers.0.retain_mut(|w| {
            if Arc::ptr_eq(&w.shared, shared) {
                w.seal_all();
                false
            } else {
                true
            }
        });
    });
}
