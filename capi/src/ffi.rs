//! The C functions. Each one checks its pointers, catches panics (none should happen; one
//! must never unwind into C) and reports failure by its return value, with the reason from
//! `ps_last_error`.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use poolsight_recorder::{FrameKind, Mode, Phase, RecorderConfig, ScopeKind, ScopeToken};

use crate::session::{Session, SessionError, SessionPool};

/// A recording (opaque). Made by `ps_recorder_create`, released by `ps_recorder_finish`.
pub struct PsRecorder {
    session: Arc<Session>,
}

/// A memory pool (opaque). Made by `ps_pool_create_host` or `ps_pool_create_cuda`,
/// released by `ps_pool_destroy`.
pub struct PsPool {
    pool: SessionPool,
}

/// `PsConfig::mode`: lossless, the file grows.
pub const PS_MODE_GROW: u32 = 0;
/// `PsConfig::mode`: flight recorder, `ring_slots` chunks, the oldest overwritten.
pub const PS_MODE_RING: u32 = 1;

/// An open scope, from `ps_scope_enter` for `ps_scope_exit`. Opaque: copy it, store it,
/// give it back on the thread that opened it.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PsScopeToken {
    pub opaque: [u64; 5],
}

/// Settings for `ps_recorder_create`; fill with `ps_config_default` first.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PsConfig {
    /// `PS_MODE_GROW` or `PS_MODE_RING`.
    pub mode: u32,
    /// Ring mode: the number of chunk slots.
    pub ring_slots: u32,
    /// Bytes per event chunk (4 KiB .. 16 MiB).
    pub chunk_size: u32,
    /// The file never grows past this many bytes.
    pub max_bytes: u64,
    /// Rank of this process in a multi-process job, or -1.
    pub rank: i64,
    /// Number of processes of the job, or -1.
    pub world_size: i64,
    /// 1: replace a file already at the path (as a new file; never one being recorded).
    /// 0 (the default): an existing file is an error.
    pub overwrite: u32,
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_error(message: impl std::fmt::Display) {
    let text = message.to_string().replace('\0', " ");
    let text = CString::new(text).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = text);
}

/// Runs `f`, turning an error or a panic into `fail` plus the message for `ps_last_error`.
fn guard<T>(fail: T, f: impl FnOnce() -> Result<T, SessionError>) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            set_error(e);
            fail
        }
        Err(_) => {
            set_error("internal error in poolsight (a bug: please report it)");
            fail
        }
    }
}

fn invalid(what: &str) -> SessionError {
    SessionError::Invalid(what.to_owned())
}

/// # Safety
/// `p` is null or a NUL-terminated string.
unsafe fn text<'a>(p: *const c_char, what: &str) -> Result<&'a str, SessionError> {
    if p.is_null() {
        return Err(invalid(&format!("{what} is NULL")));
    }
    CStr::from_ptr(p)
        .to_str()
        .map_err(|_| invalid(&format!("{what} is not UTF-8")))
}

/// # Safety
/// `p` is null or was returned by `ps_recorder_create` and not yet finished.
unsafe fn recorder<'a>(p: *const PsRecorder) -> Result<&'a PsRecorder, SessionError> {
    p.as_ref().ok_or_else(|| invalid("recorder is NULL"))
}

/// # Safety
/// `p` is null or was returned by a `ps_pool_create_*` and not yet destroyed.
unsafe fn pool<'a>(p: *const PsPool) -> Result<&'a PsPool, SessionError> {
    p.as_ref().ok_or_else(|| invalid("pool is NULL"))
}

/// The message of the last failed call on this thread ("" if none). Valid until the next
/// poolsight call on this thread.
#[no_mangle]
pub extern "C" fn ps_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// Fills `out` with the defaults: grow mode, 64 KiB chunks, 1 TiB at most, no rank.
///
/// # Safety
/// `out` is null (nothing happens) or points to a writable `PsConfig`.
#[no_mangle]
pub unsafe extern "C" fn ps_config_default(out: *mut PsConfig) {
    let d = RecorderConfig::default();
    if let Some(out) = out.as_mut() {
        *out = PsConfig {
            mode: PS_MODE_GROW,
            ring_slots: 1024,
            chunk_size: d.chunk_size,
            max_bytes: d.max_bytes,
            rank: -1,
            world_size: -1,
            overwrite: 0,
        };
    }
}

fn config(c: &PsConfig) -> Result<RecorderConfig, SessionError> {
    let opt = |v: i64, what: &str| -> Result<Option<u32>, SessionError> {
        match v {
            -1 => Ok(None),
            v => u32::try_from(v)
                .map(Some)
                .map_err(|_| invalid(&format!("{what} {v} is neither -1 nor a u32"))),
        }
    };
    Ok(RecorderConfig {
        mode: match c.mode {
            PS_MODE_GROW => Mode::Grow,
            PS_MODE_RING => Mode::Ring {
                slots: c.ring_slots,
            },
            other => {
                return Err(invalid(&format!(
                    "mode {other} is neither PS_MODE_GROW nor PS_MODE_RING"
                )))
            }
        },
        chunk_size: c.chunk_size,
        max_bytes: c.max_bytes,
        rank: opt(c.rank, "rank")?,
        world_size: opt(c.world_size, "world_size")?,
        overwrite: match c.overwrite {
            0 => false,
            1 => true,
            other => return Err(invalid(&format!("overwrite {other} is neither 0 nor 1"))),
        },
        ..RecorderConfig::default()
    })
}

/// Creates the trace file `path` and starts recording. `config` may be NULL (the defaults).
/// Returns NULL on failure (see `ps_last_error`): among others when `path` exists (unless
/// `config->overwrite`) or another recording writes it.
///
/// # Safety
/// `path` is a NUL-terminated string; `config` is NULL or points to a `PsConfig`.
#[no_mangle]
pub unsafe extern "C" fn ps_recorder_create(
    path: *const c_char,
    config: *const PsConfig,
) -> *mut PsRecorder {
    guard(std::ptr::null_mut(), || {
        let path = text(path, "path")?;
        let config = match config.as_ref() {
            Some(c) => self::config(c)?,
            None => RecorderConfig::default(),
        };
        let session = Arc::new(Session::create(path, config)?);
        Ok(Box::into_raw(Box::new(PsRecorder { session })))
    })
}

/// Seals the trace and releases `rec` (also when sealing fails). Returns 0, or -1 with
/// `ps_last_error`. Pools made with `rec` stay usable but record nothing more.
///
/// # Safety
/// `rec` is NULL or from `ps_recorder_create`, not used again after this call.
#[no_mangle]
pub unsafe extern "C" fn ps_recorder_finish(rec: *mut PsRecorder) -> c_int {
    guard(-1, || {
        if rec.is_null() {
            return Err(invalid("recorder is NULL"));
        }
        let rec = Box::from_raw(rec);
        rec.session.finish()?;
        Ok(0)
    })
}

/// Events that could not be recorded so far (disk full, size limit).
///
/// # Safety
/// `rec` is NULL (returns 0) or a live recorder.
#[no_mangle]
pub unsafe extern "C" fn ps_recorder_dropped_events(rec: *const PsRecorder) -> u64 {
    guard(0, || Ok(recorder(rec)?.session.dropped_events()))
}

/// Opens a scope on the calling thread and stores its token in `*out`. `file` may be NULL.
/// Returns 0, or -1 (then `*out` is untouched) with `ps_last_error`.
///
/// # Safety
/// `rec` is a live recorder; `name` (and `file` unless NULL) are NUL-terminated strings; `out`
/// points to a writable `PsScopeToken`.
#[no_mangle]
pub unsafe extern "C" fn ps_scope_enter(
    rec: *const PsRecorder,
    kind: u32,
    name: *const c_char,
    phase: u32,
    file: *const c_char,
    line: u32,
    out: *mut PsScopeToken,
) -> c_int {
    guard(-1, || {
        let rec = recorder(rec)?;
        let name = text(name, "name")?;
        let file = if file.is_null() {
            ""
        } else {
            text(file, "file")?
        };
        // The PS_ values are the trace format's (`constants.rs` makes them from its kinds).
        let kind = u8::try_from(kind)
            .ok()
            .and_then(|k| FrameKind::try_from(k).ok())
            .and_then(|k| ScopeKind::try_from(k).ok())
            .ok_or_else(|| invalid(&format!("scope kind {kind} is not a PS_SCOPE_* value")))?;
        let phase = u8::try_from(phase)
            .ok()
            .and_then(|p| Phase::try_from(p).ok())
            .ok_or_else(|| invalid(&format!("phase {phase} is not a PS_PHASE_* value")))?;
        let out = out.as_mut().ok_or_else(|| invalid("out is NULL"))?;
        let token = rec.session.enter(kind, name, phase, file, line);
        *out = PsScopeToken {
            opaque: token.to_words(),
        };
        Ok(0)
    })
}

/// Closes the scope of `token` (from `ps_scope_enter` on this thread). 0, or -1 when the token
/// is not an open scope of this recorder and thread (closed twice, another thread's).
///
/// # Safety
/// `rec` is a live recorder.
#[no_mangle]
pub unsafe extern "C" fn ps_scope_exit(rec: *const PsRecorder, token: PsScopeToken) -> c_int {
    guard(-1, || {
        recorder(rec)?
            .session
            .exit(ScopeToken::from_words(token.opaque))?;
        Ok(0)
    })
}

/// Closes the scope of `token` as a call that did not complete (it failed, raised, or was
/// cancelled): it is not counted as a call of its function (no row, no occurrence, no time),
/// and what it allocated stays with the calls around it. Returns 0, or -1 as `ps_scope_exit`.
///
/// # Safety
/// `rec` is a live recorder.
#[no_mangle]
pub unsafe extern "C" fn ps_scope_abort(rec: *const PsRecorder, token: PsScopeToken) -> c_int {
    guard(-1, || {
        recorder(rec)?
            .session
            .abort(ScopeToken::from_words(token.opaque))?;
        Ok(0)
    })
}

/// Marks the beginning of epoch `epoch`, with the CPU bytes in use then (0 if unknown).
///
/// # Safety
/// `rec` is a live recorder.
#[no_mangle]
pub unsafe extern "C" fn ps_epoch_begin(
    rec: *const PsRecorder,
    epoch: u32,
    cpu_bytes: u64,
) -> c_int {
    guard(-1, || {
        recorder(rec)?.session.epoch_begin(epoch, cpu_bytes);
        Ok(0)
    })
}

/// Marks the end of epoch `epoch`, with the CPU bytes in use and the peak since its beginning.
///
/// # Safety
/// `rec` is a live recorder.
#[no_mangle]
pub unsafe extern "C" fn ps_epoch_end(
    rec: *const PsRecorder,
    epoch: u32,
    cpu_bytes: u64,
    cpu_peak_bytes: u64,
) -> c_int {
    guard(-1, || {
        recorder(rec)?
            .session
            .epoch_end(epoch, cpu_bytes, cpu_peak_bytes);
        Ok(0)
    })
}

/// The stack of scopes open on this thread (0 when none, or on failure).
///
/// # Safety
/// `rec` is a live recorder.
#[no_mangle]
pub unsafe extern "C" fn ps_stack_current(rec: *const PsRecorder) -> u32 {
    guard(0, || Ok(recorder(rec)?.session.current_stack()))
}

/// The stack `parent` plus the frame `file:line:function` (your own call stack, outermost
/// first, one call per frame). Returns 0 on failure.
///
/// # Safety
/// `rec` is a live recorder; `file` and `function` are NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn ps_stack_push(
    rec: *const PsRecorder,
    parent: u32,
    file: *const c_char,
    line: u32,
    function: *const c_char,
) -> u32 {
    guard(0, || {
        let rec = recorder(rec)?;
        let file = text(file, "file")?;
        let function = text(function, "function")?;
        Ok(rec.session.push_frame(parent, file, line, function))
    })
}

/// Says that the block at `ptr` on device `device` (`bytes`, the size it was allocated with)
/// now belongs to `stack` (from `ps_stack_*`), its live bytes unchanged: for a block whose
/// owner or kind is known only later (a buffer that becomes a model's state). Reports of what
/// is live at an instant show it under `stack` from now on; cumulative figures (bytes
/// allocated per function and line) keep it where it was allocated. Returns 0, or -1 with
/// `ps_last_error`.
///
/// # Safety
/// `rec` is a live recorder.
#[no_mangle]
pub unsafe extern "C" fn ps_relabel(
    rec: *const PsRecorder,
    device: u32,
    ptr: u64,
    bytes: u64,
    stack: u32,
) -> c_int {
    guard(-1, || {
        recorder(rec)?.session.relabel(device, ptr, bytes, stack);
        Ok(0)
    })
}

fn new_pool(made: Result<SessionPool, SessionError>) -> Result<*mut PsPool, SessionError> {
    Ok(Box::into_raw(Box::new(PsPool { pool: made? })))
}

/// A CuPy-style caching pool over `capacity` bytes of simulated device memory in host RAM
/// (real, usable memory). With `rec` (may be NULL) its events go into that recording.
///
/// # Safety
/// `rec` is NULL or a live recorder.
#[no_mangle]
pub unsafe extern "C" fn ps_pool_create_host(
    rec: *const PsRecorder,
    device_id: u32,
    capacity: u64,
) -> *mut PsPool {
    guard(std::ptr::null_mut(), || {
        let session = rec.as_ref().map(|r| Arc::clone(&r.session));
        new_pool(SessionPool::host(session, device_id, capacity))
    })
}

/// A CuPy-style caching pool over CUDA device `ordinal`. NULL when this build has no CUDA
/// support or no driver/device is found (see `ps_last_error`).
///
/// # Safety
/// `rec` is NULL or a live recorder.
#[no_mangle]
pub unsafe extern "C" fn ps_pool_create_cuda(rec: *const PsRecorder, ordinal: u32) -> *mut PsPool {
    guard(std::ptr::null_mut(), || {
        let session = rec.as_ref().map(|r| Arc::clone(&r.session));
        new_pool(SessionPool::cuda(session, ordinal))
    })
}

/// Allocates `size` bytes for `stream` (0 = default). `stack` is the allocation's calling
/// context for the trace (from `ps_stack_*`), 0 for the open scopes. Returns the address, or 0
/// on failure (out of memory: see `ps_last_error`) and for a 0-byte request.
///
/// # Safety
/// `pool` is a live pool.
#[no_mangle]
pub unsafe extern "C" fn ps_pool_malloc(
    pool: *const PsPool,
    size: u64,
    stream: u32,
    stack: u32,
) -> u64 {
    guard(0, || self::pool(pool)?.pool.malloc(size, stream, stack))
}

/// Returns `ptr` to the pool (0 is ignored). 0, or -1 when `ptr` is not a live allocation of
/// this pool.
///
/// # Safety
/// `pool` is a live pool.
#[no_mangle]
pub unsafe extern "C" fn ps_pool_free(pool: *const PsPool, ptr: u64) -> c_int {
    guard(-1, || {
        self::pool(pool)?.pool.free(ptr)?;
        Ok(0)
    })
}

/// Bytes handed out and not freed (rounded to the pool's 512-byte unit).
///
/// # Safety
/// `pool` is NULL (returns 0) or a live pool.
#[no_mangle]
pub unsafe extern "C" fn ps_pool_used_bytes(pool: *const PsPool) -> u64 {
    guard(0, || Ok(self::pool(pool)?.pool.pool().used_bytes()))
}

/// Bytes the pool holds from the device (used plus cached).
///
/// # Safety
/// `pool` is NULL (returns 0) or a live pool.
#[no_mangle]
pub unsafe extern "C" fn ps_pool_total_bytes(pool: *const PsPool) -> u64 {
    guard(0, || Ok(self::pool(pool)?.pool.pool().total_bytes()))
}

/// Returns cached blocks to the device; the bytes released.
///
/// # Safety
/// `pool` is NULL (returns 0) or a live pool.
#[no_mangle]
pub unsafe extern "C" fn ps_pool_free_all_blocks(pool: *const PsPool) -> u64 {
    guard(0, || {
        Ok(self::pool(pool)?.pool.pool().free_all_blocks(None))
    })
}

/// Limits the bytes the pool may hold from the device (0 = no limit).
///
/// # Safety
/// `pool` is NULL (nothing happens) or a live pool.
#[no_mangle]
pub unsafe extern "C" fn ps_pool_set_limit(pool: *const PsPool, bytes: u64) {
    guard((), || {
        self::pool(pool)?.pool.pool().set_limit(bytes);
        Ok(())
    })
}

/// Releases the pool; allocations still live go back to it first (their frees are recorded).
///
/// # Safety
/// `pool` is NULL or a live pool, not used again after this call.
#[no_mangle]
pub unsafe extern "C" fn ps_pool_destroy(pool: *mut PsPool) {
    guard((), || {
        if !pool.is_null() {
            drop(Box::from_raw(pool));
        }
        Ok(())
    })
}
