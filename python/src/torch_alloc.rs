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
//! They adapt those signatures to the [`Shim`] (pools per device, arenas per stream, what a
//! failure does), made once per process by `torch_allocator_install`.

use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::alloc_shim::Shim;

static INSTALLED: OnceLock<Shim> = OnceLock::new();

/// PyTorch's `malloc`: see the module docs.
#[no_mangle]
pub extern "C" fn poolsight_torch_malloc(
    size: isize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    match INSTALLED.get() {
        Some(shim) => shim.malloc(size as i128, device.into(), stream),
        None => std::ptr::null_mut(),
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
    if let Some(shim) = INSTALLED.get() {
        shim.free(ptr, device.into());
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
    let shim = Shim::new(recorder, python_stacks, max_depth)?;
    INSTALLED.set(shim).map_err(|_| {
        PyRuntimeError::new_err(
            "poolsight's pool is already PyTorch's allocator in this process (use_pool runs once)",
        )
    })
}

/// Figures of the pool of CUDA device ``device`` (``None`` before its first allocation).
#[pyfunction]
fn torch_allocator_stats(py: Python<'_>, device: u32) -> PyResult<Option<Bound<'_, PyDict>>> {
    match INSTALLED.get() {
        Some(shim) => shim.stats(
            py,
            device,
            ["allocated_bytes", "reserved_bytes", "cached_bytes"],
        ),
        None => Ok(None),
    }
}

/// Returns the cached blocks of device ``device``'s pool to CUDA; the bytes released.
#[pyfunction]
fn torch_allocator_empty_cache(device: u32) -> u64 {
    INSTALLED
        .get()
        .map_or(0, |shim| shim.free_all_blocks(device))
}

/// Sets device ``device``'s pool limit in bytes (0: none). The pool must exist.
#[pyfunction]
fn torch_allocator_set_limit(device: u32, bytes: u64) -> PyResult<()> {
    let shim = INSTALLED
        .get()
        .ok_or_else(|| PyRuntimeError::new_err("use_pool() has not been called"))?;
    shim.set_limit(device, bytes)
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(torch_allocator_install, m)?)?;
    m.add_function(wrap_pyfunction!(torch_allocator_stats, m)?)?;
    m.add_function(wrap_pyfunction!(torch_allocator_empty_cache, m)?)?;
    m.add_function(wrap_pyfunction!(torch_allocator_set_limit, m)?)?;
    Ok(())
}
