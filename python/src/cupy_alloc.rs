//! poolsight's pool as CuPy's allocator.
//!
//! `cupy.cuda.memory.CFunctionAllocator(param, malloc_fn, free_fn, owner)` calls the two
//! functions below, found by their addresses in this very extension module, with CuPy's
//! signatures:
//!
//! ```c
//! void* poolsight_cupy_malloc(void* param, size_t size, int device_id);
//! void poolsight_cupy_free(void* param, void* ptr, int device_id);
//! ```
//!
//! `param` is the address of a [`CupyAllocator`]'s state, which the allocator object (the
//! `owner` CuPy keeps alive with the allocator) owns. One pool per device, created on first use;
//! CuPy's C allocator interface names no stream, so every allocation is in the pool's default
//! arena. A failed malloc returns NULL, which CuPy raises as its `OutOfMemoryError`; a free of
//! an unknown pointer is counted and otherwise ignored (nothing may unwind into CuPy).

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use pyo3::prelude::*;
use pyo3::types::PyDict;

use poolsight_capi::SessionPool;

use crate::{err, Map, Recorder};

struct State {
    recorder: Option<Py<Recorder>>,
    python_stacks: bool,
    max_depth: u32,
    pools: Mutex<Map<u32, Arc<SessionPool>>>,
    failed: AtomicU64,
    unknown_frees: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl State {
    fn pool(&self, device: u32) -> Result<Arc<SessionPool>, poolsight_capi::SessionError> {
        if let Some(p) = lock(&self.pools).get(&device) {
            return Ok(Arc::clone(p));
        }
        let session = self.recorder.as_ref().map(|r| Arc::clone(&r.get().session));
        let pool = Arc::new(SessionPool::cuda(session, device)?);
        Ok(Arc::clone(lock(&self.pools).entry(device).or_insert(pool)))
    }

    fn stack(&self) -> u32 {
        match &self.recorder {
            Some(rec) if self.python_stacks => {
                Python::attach(|py| rec.get().python_stack(py, self.max_depth, 0)).unwrap_or(0)
            }
            _ => 0,
        }
    }
}

/// CuPy's `malloc`: see the module docs.
///
/// # Safety
/// `param` must be the `param` of a live `CupyAllocator` (CuPy passes back what it was given).
#[no_mangle]
pub unsafe extern "C" fn poolsight_cupy_malloc(
    param: *mut c_void,
    size: usize,
    device_id: c_int,
) -> *mut c_void {
    // SAFETY: the caller passes the address `CupyAllocator.param` gave, whose owner CuPy keeps
    // alive as long as the allocator.
    let Some(state) = (unsafe { (param as *const State).as_ref() }) else {
        return std::ptr::null_mut();
    };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let pool = state.pool(u32::try_from(device_id).ok()?).ok()?;
        let stack = state.stack();
        pool.malloc(size as u64, 0, stack).ok()
    }));
    match result {
        Ok(Some(ptr)) => ptr as *mut c_void,
        _ => {
            state.failed.fetch_add(1, Ordering::Relaxed);
            std::ptr::null_mut()
        }
    }
}

/// CuPy's `free`: see the module docs.
///
/// # Safety
/// As for [`poolsight_cupy_malloc`].
#[no_mangle]
pub unsafe extern "C" fn poolsight_cupy_free(
    param: *mut c_void,
    ptr: *mut c_void,
    device_id: c_int,
) {
    // SAFETY: as in poolsight_cupy_malloc.
    let Some(state) = (unsafe { (param as *const State).as_ref() }) else {
        return;
    };
    let freed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let pool = lock(&state.pools)
            .get(&u32::try_from(device_id).ok()?)
            .cloned()?;
        pool.free(ptr as u64).ok()
    }));
    if !matches!(freed, Ok(Some(()))) {
        state.unknown_frees.fetch_add(1, Ordering::Relaxed);
    }
}

/// ``CupyAllocator(recorder=None, python_stacks=False, max_depth=0)``: the state behind
/// ``poolsight_cupy_malloc``/``poolsight_cupy_free``; ``param`` is its address for
/// ``CFunctionAllocator``, which must keep this object alive (its ``owner``).
#[pyclass(module = "poolsight._native", frozen)]
pub struct CupyAllocator {
    state: Box<State>,
}

#[pymethods]
impl CupyAllocator {
    #[new]
    #[pyo3(signature = (recorder=None, python_stacks=false, max_depth=0))]
    fn new(
        recorder: Option<&Bound<'_, PyAny>>,
        python_stacks: bool,
        max_depth: u32,
    ) -> PyResult<Self> {
        Ok(CupyAllocator {
            state: Box::new(State {
                recorder: recorder.map(crate::native_recorder).transpose()?,
                python_stacks,
                max_depth,
                pools: Mutex::new(Map::default()),
                failed: AtomicU64::new(0),
                unknown_frees: AtomicU64::new(0),
            }),
        })
    }

    /// The address CuPy hands back to the C functions.
    #[getter]
    fn param(&self) -> usize {
        &*self.state as *const State as usize
    }

    /// Creates device ``device``'s pool now, so that a machine without CUDA fails here with
    /// the reason rather than at the first allocation.
    fn open(&self, py: Python<'_>, device: u32) -> PyResult<()> {
        py.detach(|| self.state.pool(device))
            .map(|_| ())
            .map_err(err)
    }

    /// Figures of device ``device``'s pool (``None`` before its first allocation).
    fn stats<'py>(&self, py: Python<'py>, device: u32) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(pool) = lock(&self.state.pools).get(&device).cloned() else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        let p = pool.pool();
        d.set_item("used_bytes", p.used_bytes())?;
        d.set_item("total_bytes", p.total_bytes())?;
        d.set_item("free_bytes", p.free_bytes())?;
        d.set_item("limit_bytes", p.get_limit())?;
        d.set_item("live_allocations", pool.live_allocations())?;
        d.set_item("failed_mallocs", self.state.failed.load(Ordering::Relaxed))?;
        d.set_item(
            "unknown_frees",
            self.state.unknown_frees.load(Ordering::Relaxed),
        )?;
        Ok(Some(d))
    }

    /// Returns device ``device``'s cached blocks to CUDA; the bytes released.
    fn free_all_blocks(&self, device: u32) -> u64 {
        lock(&self.state.pools)
            .get(&device)
            .cloned()
            .map_or(0, |p| p.pool().free_all_blocks(None))
    }

    /// Caps the bytes device ``device``'s pool may hold (0: no limit).
    fn set_limit(&self, py: Python<'_>, device: u32, bytes: u64) -> PyResult<()> {
        let pool = py.detach(|| self.state.pool(device)).map_err(err)?;
        pool.pool().set_limit(bytes);
        Ok(())
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<CupyAllocator>()
}
