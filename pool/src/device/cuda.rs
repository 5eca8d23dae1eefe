//! A real GPU through the CUDA driver API (`cudarc`, loaded dynamically).
//!
//! Dynamic loading is what lets the crate build everywhere, but `cudarc` panics when the driver
//! library is missing; a recorder must never take the training run down with it, so
//! [`CudaDevice::new`] probes for the library first and turns every failure into a
//! [`DeviceError`].

use std::ffi::CStr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, DriverError};

use super::{Device, DeviceError};

/// Library names tried before handing over to `cudarc` (the same ones it loads first).
const DRIVER_LIBS: [&CStr; 2] = [c"libcuda.so.1", c"libcuda.so"];

/// One CUDA device, with the primary context of its ordinal.
///
/// Every driver call first binds the context to the calling thread, so the device can be used
/// from any thread of the run, as the pool is.
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    id: u32,
    name: String,
    capacity: u64,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("capacity", &self.capacity)
            .finish()
    }
}

fn driver_err(what: &str, e: DriverError) -> DeviceError {
    DeviceError::Driver(format!("{what}: {e:?}"))
}

/// Whether the driver library can be opened at all; `Err` carries the loader's message.
fn probe_driver() -> Result<(), String> {
    let mut last = String::from("unknown dlopen error");
    for lib in DRIVER_LIBS {
        // SAFETY: `lib` is a valid NUL-terminated name; the handle is closed right away.
        let handle = unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_LAZY) };
        if !handle.is_null() {
            // SAFETY: `handle` came from a successful dlopen.
            unsafe { libc::dlclose(handle) };
            return Ok(());
        }
        // SAFETY: dlerror returns NULL or a valid C string owned by the loader.
        let msg = unsafe { libc::dlerror() };
        if !msg.is_null() {
            // SAFETY: non-null pointer from dlerror, read immediately.
            last = unsafe { CStr::from_ptr(msg) }
                .to_string_lossy()
                .into_owned();
        }
    }
    Err(last)
}

impl CudaDevice {
    /// Opens CUDA device `ordinal`.
    ///
    /// Returns [`DeviceError::Unavailable`] when there is no driver or no such device, instead
    /// of panicking, so callers can fall back to [`super::HostDevice`].
    pub fn new(ordinal: u32) -> Result<CudaDevice, DeviceError> {
        probe_driver().map_err(|e| {
            DeviceError::Unavailable(format!("no CUDA driver (libcuda.so.1 not found): {e}"))
        })?;
        let opened = catch_unwind(AssertUnwindSafe(|| -> Result<CudaDevice, DeviceError> {
            let ctx = CudaContext::new(ordinal as usize).map_err(|e| {
                DeviceError::Unavailable(format!("cannot open CUDA device {ordinal}: {e:?}"))
            })?;
            let name = ctx.name().map_err(|e| driver_err("cuDeviceGetName", e))?;
            let capacity = ctx
                .total_mem()
                .map_err(|e| driver_err("cuDeviceTotalMem", e))? as u64;
            Ok(CudaDevice {
                ctx,
                id: ordinal,
                name,
                capacity,
            })
        }));
        match opened {
            Ok(r) => r,
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("panic in the CUDA loader");
                Err(DeviceError::Unavailable(format!(
                    "CUDA initialisation failed: {msg}"
                )))
            }
        }
    }

    /// Free and total device memory as the driver reports them (`cuMemGetInfo`), including
    /// memory held by other processes; the pool's own figures do not see those.
    pub fn mem_get_info(&self) -> Result<(u64, u64), DeviceError> {
        self.bind()?;
        let (free, total) = result::mem_get_info().map_err(|e| driver_err("cuMemGetInfo", e))?;
        Ok((free as u64, total as u64))
    }

    fn bind(&self) -> Result<(), DeviceError> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver_err("cuCtxSetCurrent", e))
    }
}

impl Device for CudaDevice {
    fn id(&self) -> u32 {
        self.id
    }

    fn name(&self) -> String {
        format!("cuda:{} ({})", self.id, self.name)
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn alloc(&self, size: u64) -> Result<u64, DeviceError> {
        self.bind()?;
        let bytes = usize::try_from(size).map_err(|_| DeviceError::OutOfMemory {
            requested: size,
            capacity: self.capacity,
            in_use: 0,
        })?;
        // SAFETY: the context is current on this thread; the pointer is owned by the caller.
        match unsafe { result::malloc_sync(bytes) } {
            Ok(ptr) => Ok(ptr),
            Err(DriverError(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY)) => {
                let in_use = self
                    .mem_get_info()
                    .map(|(free, total)| total.saturating_sub(free))
                    .unwrap_or(0);
                Err(DeviceError::OutOfMemory {
                    requested: size,
                    capacity: self.capacity,
                    in_use,
                })
            }
            Err(e) => Err(driver_err("cuMemAlloc", e)),
        }
    }

    unsafe fn free(&self, ptr: u64, _size: u64) {
        // A failure here cannot be reported to anyone useful (this runs from Drop); the
        // allocation is then leaked, which is the safe outcome.
        if self.bind().is_ok() {
            // SAFETY: the caller guarantees `ptr` came from `alloc` and is not used again.
            let _ = unsafe { result::free_sync(ptr) };
        }
    }

    fn copy_from_host(&self, dst: u64, src: &[u8]) -> Result<(), DeviceError> {
        if src.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: synchronous copy from a live host slice; the driver validates `dst`.
        unsafe { result::memcpy_htod_sync(dst, src) }.map_err(|e| driver_err("cuMemcpyHtoD", e))
    }

    fn copy_to_host(&self, src: u64, dst: &mut [u8]) -> Result<(), DeviceError> {
        if dst.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: synchronous copy into a live host slice; the driver validates `src`.
        unsafe { result::memcpy_dtoh_sync(dst, src) }.map_err(|e| driver_err("cuMemcpyDtoH", e))
    }
}
