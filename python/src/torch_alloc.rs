//! poolsight's pool as PyTorch's CUDA allocator.
//!
//! `torch.cuda.memory.CUDAPluggableAllocator(path, "poolsight_torch_malloc",
//! "poolsight_torch_free")` loads this very extension module and calls the two functions below
//! for every CUDA tensor's memory, with PyTorch's signatures:
//!
//! ```c
//! void* malloc(ssize_t size, int device, cudaStream_t stream);
//! void free(void* ptr, ssize_t size, int device, cudaStream_t stream);
//! ```
//!
//! One pool per device, created on first use; each distinct stream gets its own arena (CuPy's
//! per-stream arenas: memory freed on one stream is not handed to another). PyTorch cannot
//! take an error from these functions: a failed malloc returns NULL, which PyTorch raises as an
//! out-of-memory error; a free of an unknown pointer is counted and otherwise ignored.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use poolsight_capi::SessionPool;

use crate::{Map, Recorder};

struct Installed {
    recorder: Option<Py<Recorder>>,
    python_stacks: bool,
    max_depth: u32,
    pools: Mutex<Map<u32, Arc<SessionPool>>>,
    streams: Mutex<Map<usize, u32>>,
    failed: AtomicU64,
    unknown_frees: AtomicU64,
}

static INSTALLED: OnceLock<Installed> = OnceLock::new();

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Installed {
    fn pool(&self, device: u32) -> Result<Arc<SessionPool>, String> {
        if let Some(p) = lock(&self.pools).get(&device) {
            return Ok(Arc::clone(p));
        }
        let session = self.recorder.as_ref().map(|r| Arc::clone(&r.get().session));
        let pool = Arc::new(SessionPool::cuda(session, device).map_err(|e| e.to_string())?);
        Ok(Arc::clone(lock(&self.pools).entry(device).or_insert(pool)))
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
        let Some(rec) = &self.recorder else { return 0 };
        if !self.python_stacks {
            return 0;
        }
        // PyTorch calls the allocator with the GIL released; take it back for the frame walk.
        Python::attach(|py| rec.get().python_stack(py, self.max_depth, 0)).unwrap_or(0)
    }
}

/// PyTorch's `malloc`: see the module docs.
#[no_mangle]
pub extern "C" fn poolsight_torch_malloc(
    size: isize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    let Some(inst) = INSTALLED.get() else {
        return std::ptr::null_mut();
    };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let pool = inst.pool(u32::try_from(device).ok()?).ok()?;
        let arena = inst.arena(stream);
        let stack = inst.stack();
        pool.malloc(u64::try_from(size).ok()?, arena, stack).ok()
    }));
    match result {
        Ok(Some(ptr)) => ptr as *mut c_void,
        _ => {
            inst.failed.fetch_add(1, Ordering::Relaxed);
            std::ptr::null_mut()
        }
    }
}

/// PyTorch's `free`: see the module docs.
#[no_mangle]
pub extern "C" fn poolsight_torch_free(
    ptr: *mut c_void,
    _size: isize,
    device: c_int,
    _stream: *mut c_void,
) {
    let Some(inst) = INSTALLED.get() else { return };
    let freed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let pool = lock(&inst.pools)
            .get(&u32::try_from(device).ok()?)
            .cloned()?;
        pool.free(ptr as u64).ok()
    }));
    if !matches!(freed, Ok(Some(()))) {
        inst.unknown_frees.fetch_add(1, Ordering::Relaxed);
    }
}

/// Makes the exported functions serve allocations, recorded by ``recorder`` (or not). Only
/// once per process, as PyTorch allows one allocator change before CUDA's first use.
#[pyfunction]
#[pyo3(signature = (recorder, python_stacks=false, max_depth=0))]
fn torch_allocator_install(
    recorder: Option<&Bound<'_, PyAny>>,
    python_stacks: bool,
    max_depth: u32,
) -> PyResult<()> {
    let recorder = recorder.map(crate::native_recorder).transpose()?;
    let inst = Installed {
        recorder,
        python_stacks,
        max_depth,
        pools: Mutex::new(Map::default()),
        streams: Mutex::new(Map::default()),
        failed: AtomicU64::new(0),
        unknown_frees: AtomicU64::new(0),
    };
    INSTALLED.set(inst).map_err(|_| {
        PyRuntimeError::new_err(
            "poolsight's pool is already PyTorch's allocator in this process (use_pool runs once)",
        )
    })
}

/// Figures of the pool of CUDA device ``device`` (``None`` before its first allocation).
#[pyfunction]
fn torch_allocator_stats(py: Python<'_>, device: u32) -> PyResult<Option<Bound<'_, PyDict>>> {
    let Some(inst) = INSTALLED.get() else {
        return Ok(None);
    };
    let Some(pool) = lock(&inst.pools).get(&device).cloned() else {
        return Ok(None);
    };
    let d = PyDict::new(py);
    let p = pool.pool();
    d.set_item("allocated_bytes", p.used_bytes())?;
    d.set_item("reserved_bytes", p.total_bytes())?;
    d.set_item("cached_bytes", p.free_bytes())?;
    d.set_item("limit_bytes", p.get_limit())?;
    d.set_item("live_allocations", pool.live_allocations())?;
    d.set_item("failed_mallocs", inst.failed.load(Ordering::Relaxed))?;
    d.set_item("unknown_frees", inst.unknown_frees.load(Ordering::Relaxed))?;
    Ok(Some(d))
}

/// Returns the cached blocks of device ``device``'s pool to CUDA; the bytes released.
#[pyfunction]
fn torch_allocator_empty_cache(device: u32) -> u64 {
    INSTALLED
        .get()
        .and_then(|inst| lock(&inst.pools).get(&device).cloned())
        .map_or(0, |p| p.pool().free_all_blocks(None))
}

/// Sets device ``device``'s pool limit in bytes (0: none). The pool must exist.
#[pyfunction]
fn torch_allocator_set_limit(device: u32, bytes: u64) -> PyResult<()> {
    let inst = INSTALLED
        .get()
        .ok_or_else(|| PyRuntimeError::new_err("use_pool() has not been called"))?;
    let pool = inst.pool(device).map_err(PyRuntimeError::new_err)?;
    pool.pool().set_limit(bytes);
    Ok(())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(torch_allocator_install, m)?)?;
    m.add_function(wrap_pyfunction!(torch_allocator_stats, m)?)?;
    m.add_function(wrap_pyfunction!(torch_allocator_empty_cache, m)?)?;
    m.add_function(wrap_pyfunction!(torch_allocator_set_limit, m)?)?;
    Ok(())
}
