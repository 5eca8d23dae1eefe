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
//! `param` is the address of a [`CupyAllocator`]'s [`Shim`] (pools per device, what a failure
//! does), which the allocator object (the `owner` CuPy keeps alive with the allocator) owns.
//! CuPy's C allocator interface names no stream, so every allocation is in the pool's default
//! arena.

use std::ffi::{c_int, c_void};

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::alloc_shim::Shim;
use crate::err;

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
    match unsafe { (param as *const Shim).as_ref() } {
        Some(shim) => shim.malloc(size as i128, device_id.into(), std::ptr::null_mut()),
        None => std::ptr::null_mut(),
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
    if let Some(shim) = unsafe { (param as *const Shim).as_ref() } {
        shim.free(ptr, device_id.into());
    }
}

/// ``CupyAllocator(recorder=None, python_stacks=False, max_depth=0)``: the state behind
/// ``poolsight_cupy_malloc``/``poolsight_cupy_free``; ``param`` is its address for
/// ``CFunctionAllocator``, which must keep this object alive (its ``owner``).
#[pyclass(module = "poolsight._native", frozen)]
pub struct CupyAllocator {
    shim: Box<Shim>,
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
            shim: Box::new(Shim::new(recorder, python_stacks, max_depth)?),
        })
    }

    /// The address CuPy hands back to the C functions.
    #[getter]
    fn param(&self) -> usize {
        &*self.shim as *const Shim as usize
    }

    /// Creates device ``device``'s pool now, so that a machine without CUDA fails here with
    /// the reason rather than at the first allocation.
    fn open(&self, py: Python<'_>, device: u32) -> PyResult<()> {
        py.detach(|| self.shim.pool(device))
            .map(|_| ())
            .map_err(err)
    }

    /// Figures of device ``device``'s pool (``None`` before its first allocation).
    fn stats<'py>(&self, py: Python<'py>, device: u32) -> PyResult<Option<Bound<'py, PyDict>>> {
        self.shim
            .stats(py, device, ["used_bytes", "total_bytes", "free_bytes"])
    }

    /// Returns device ``device``'s cached blocks to CUDA; the bytes released.
    fn free_all_blocks(&self, device: u32) -> u64 {
        self.shim.free_all_blocks(device)
    }

    /// Caps the bytes device ``device``'s pool may hold (0: no limit).
    fn set_limit(&self, py: Python<'_>, device: u32, bytes: u64) -> PyResult<()> {
        py.detach(|| self.shim.set_limit(device, bytes))
            .map_err(err)
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<CupyAllocator>()
}
