//! poolsight's pool behind another framework's C allocator interface, written once: PyTorch's
//! `CUDAPluggableAllocator` (`torch_alloc.rs`) and CuPy's `CFunctionAllocator`
//! (`cupy_alloc.rs`) each only adapt their C signatures to a [`Shim`].
//!
//! One pool per device, created on first use; each distinct stream gets its own arena (CuPy's
//! per-stream arenas: memory freed on one stream is not handed to another). Neither framework
//! can take an error from these functions, and nothing may unwind into them: a failed malloc
//! returns NULL, which the framework raises as its out-of-memory error; a free of an unknown
//! pointer is counted and otherwise ignored.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use pyo3::prelude::*;
use pyo3::types::PyDict;

use poolsight_capi::{SessionError, SessionPool};

use crate::{Map, Recorder};

pub(crate) struct Shim {
    recorder: Option<Py<Recorder>>,
    python_stacks: bool,
    max_depth: u32,
    pools: Mutex<Map<u32, Arc<SessionPool>>>,
    streams: Mutex<Map<usize, u32>>,
    failed: AtomicU64,
    unknown_frees: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shim {
    /// A shim whose allocations are recorded by `recorder` (a `poolsight.Recording` or its
    /// native recorder), or not.
    pub(crate) fn new(
        recorder: Option<&Bound<'_, PyAny>>,
        python_stacks: bool,
        max_depth: u32,
    ) -> PyResult<Shim> {
        Ok(Shim {
            recorder: recorder.map(crate::native_recorder).transpose()?,
            python_stacks,
            max_depth,
            pools: Mutex::new(Map::default()),
            streams: Mutex::new(Map::default()),
            failed: AtomicU64::new(0),
            unknown_frees: AtomicU64::new(0),
        })
    }

    /// Device `device`'s pool, created on first use.
    pub(crate) fn pool(&self, device: u32) -> Result<Arc<SessionPool>, SessionError> {
        if let Some(p) = lock(&self.pools).get(&device) {
            return Ok(Arc::clone(p));
        }
        let session = self.recorder.as_ref().map(|r| Arc::clone(&r.get().session));
        let pool = Arc::new(SessionPool::cuda(session, device)?);
        Ok(Arc::clone(lock(&self.pools).entry(device).or_insert(pool)))
    }

    /// Device `device`'s pool, if it was made.
    pub(crate) fn existing(&self, device: u32) -> Option<Arc<SessionPool>> {
        lock(&self.pools).get(&device).cloned()
    }

    /// The arena of a stream: 0 for the default (null) stream, then 1, 2, ... by first use.
    fn arena(&self, stream: *mut c_void) -> u32 {
        if stream.is_null() {
            return 0;
        }
        let mut streams = lock(&self.streams);
        let next = streams.len() as u32 + 1;
        *streams.entry(stream as usize).or_insert(next)
    }

    fn stack(&self) -> u32 {
        match &self.recorder {
            // The frameworks call the allocator with the GIL released; take it back for the
            // frame walk.
            Some(rec) if self.python_stacks => {
                Python::attach(|py| rec.get().python_stack(py, self.max_depth, 0)).unwrap_or(0)
            }
            _ => 0,
        }
    }

    /// A framework's malloc: `size` bytes on `device` for `stream` (null: the default).
    pub(crate) fn malloc(&self, size: i128, device: i64, stream: *mut c_void) -> *mut c_void {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let pool = self.pool(u32::try_from(device).ok()?).ok()?;
            let arena = self.arena(stream);
            let stack = self.stack();
            pool.malloc(u64::try_from(size).ok()?, arena, stack).ok()
        }));
        match result {
            Ok(Some(ptr)) => ptr as *mut c_void,
            _ => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                std::ptr::null_mut()
            }
        }
    }

    /// A framework's free of `ptr` on `device`.
    pub(crate) fn free(&self, ptr: *mut c_void, device: i64) {
        let freed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let pool = self.existing(u32::try_from(device).ok()?)?;
            pool.free(ptr as u64).ok()
        }));
        if !matches!(freed, Ok(Some(()))) {
            self.unknown_frees.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Figures of device `device`'s pool under the framework's names for used, total and
    /// cached bytes (`None` before its first allocation).
    pub(crate) fn stats<'py>(
        &self,
        py: Python<'py>,
        device: u32,
        [used, total, cached]: [&str; 3],
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(pool) = self.existing(device) else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        let p = pool.pool();
        d.set_item(used, p.used_bytes())?;
        d.set_item(total, p.total_bytes())?;
        d.set_item(cached, p.free_bytes())?;
        d.set_item("limit_bytes", p.get_limit())?;
        d.set_item("live_allocations", pool.live_allocations())?;
        d.set_item("failed_mallocs", self.failed.load(Ordering::Relaxed))?;
        d.set_item("unknown_frees", self.unknown_frees.load(Ordering::Relaxed))?;
        Ok(Some(d))
    }

    /// Returns device `device`'s cached blocks to the device; the bytes released.
    pub(crate) fn free_all_blocks(&self, device: u32) -> u64 {
        self.existing(device)
            .map_or(0, |p| p.pool().free_all_blocks(None))
    }

    /// Caps the bytes device `device`'s pool may hold (0: no limit), making the pool if needed.
    pub(crate) fn set_limit(&self, device: u32, bytes: u64) -> Result<(), SessionError> {
        self.pool(device)?.pool().set_limit(bytes);
        Ok(())
    }
}
