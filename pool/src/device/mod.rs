//! Device memory backends behind one trait, so the pool, the hooks and every test run the same
//! code on a laptop (the simulated [`HostDevice`]) and on a GPU ([`CudaDevice`], feature `cuda`).
//!
//! The trait is deliberately the smallest surface a caching pool needs: raw allocation, raw free
//! and host transfers. Everything clever (rounding, caching, splitting) lives in
//! [`crate::MemoryPool`], once, instead of in each backend.

pub mod host;

#[cfg(feature = "cuda")]
pub mod cuda;

#[cfg(feature = "cuda")]
pub use cuda::CudaDevice;
pub use host::HostDevice;

/// Why a device could not do what it was asked.
///
/// `OutOfMemory` is separate from `Driver` because the pool reacts to it (it releases its cached
/// blocks and retries, as CuPy does) while any other failure is returned to the caller at once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// The device cannot hold `requested` more bytes.
    #[error(
        "device out of memory: requested {requested} bytes, capacity {capacity} bytes, \
         {in_use} bytes in use"
    )]
    OutOfMemory {
        /// Bytes asked for.
        requested: u64,
        /// Bytes the device can hold in all.
        capacity: u64,
        /// Bytes already allocated on the device (by anyone) when the request failed.
        in_use: u64,
    },
    /// Any other failure reported by the driver or the backend (bad pointer, bad copy range...).
    #[error("device driver error: {0}")]
    Driver(String),
    /// The backend cannot be used at all on this machine (no driver, no such device).
    #[error("device unavailable: {0}")]
    Unavailable(String),
}

/// A place where the pool gets its memory from.
///
/// Pointers are plain `u64` device addresses rather than Rust pointers: device memory is not
/// addressable by the host in general, and a `u64` crosses a C ABI or a trace file unchanged.
/// Implementations must be `Send + Sync` because one pool is shared by all the threads of a
/// training run.
pub trait Device: Send + Sync {
    /// The ordinal recorded in hook events and traces (CuPy's `device_id`).
    fn id(&self) -> u32;

    /// A human-readable name for reports and trace headers.
    fn name(&self) -> String;

    /// Total bytes the device can hold; lets reports put the pool's figures in proportion.
    fn capacity(&self) -> u64;

    /// Allocates `size` bytes of device memory and returns its address (never 0 on success).
    ///
    /// Fails with [`DeviceError::OutOfMemory`] when the device is full, so that the pool can
    /// release its cache and retry.
    fn alloc(&self, size: u64) -> Result<u64, DeviceError>;

    /// Returns an allocation to the device.
    ///
    /// # Safety
    /// `ptr` must have been returned by [`Device::alloc`] on this same device with this same
    /// `size`, must not have been freed already, and must not be used after this call.
    unsafe fn free(&self, ptr: u64, size: u64);

    /// Copies `src` to device address `dst`. Backends check the range against their live
    /// allocations where they can, and fail with [`DeviceError::Driver`] otherwise.
    fn copy_from_host(&self, dst: u64, src: &[u8]) -> Result<(), DeviceError>;

    /// Copies `dst.len()` bytes from device address `src` into `dst`.
    fn copy_to_host(&self, src: u64, dst: &mut [u8]) -> Result<(), DeviceError>;
}
