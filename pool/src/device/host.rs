//! Simulated device memory in host RAM.
//!
//! It exists so that the pool, the hooks, the recorder and the demo workload run, and are tested,
//! on machines without a GPU, with the one property of a GPU that matters to a caching pool: a
//! hard capacity, so out-of-memory and the pool's release-and-retry path are reachable.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use super::{Device, DeviceError};

/// Alignment of every allocation. CUDA guarantees at least 256 bytes; 512 also matches the
/// pool's rounding unit, so split chunks stay as aligned as on a real GPU.
pub const HOST_DEVICE_ALIGN: usize = 512;

#[derive(Default)]
struct HostState {
    /// Live allocations: address -> size. Lets copies be checked, so that the safe copy methods
    /// of [`Device`] really are safe on this backend.
    allocs: BTreeMap<u64, u64>,
    in_use: u64,
}

/// Device memory simulated with real host memory and a capacity.
///
/// Data written with `copy_from_host` can be read back, so a workload that computes through the
/// pool gives real results. Memory comes zeroed (so reading before writing is defined).
pub struct HostDevice {
    id: u32,
    capacity: u64,
    state: Mutex<HostState>,
}

impl HostDevice {
    /// A simulated device `id` that holds at most `capacity` bytes at once.
    pub fn new(id: u32, capacity: u64) -> Self {
        HostDevice {
            id,
            capacity,
            state: Mutex::new(HostState::default()),
        }
    }

    /// Bytes currently allocated on this device (by any pool); lets tests check that memory the
    /// pool says it released really went back.
    pub fn in_use(&self) -> u64 {
        self.lock().in_use
    }

    /// Number of live allocations; like [`HostDevice::in_use`], for leak checks.
    pub fn allocation_count(&self) -> usize {
        self.lock().allocs.len()
    }

    fn lock(&self) -> MutexGuard<'_, HostState> {
        // No code panics while holding this lock, but stay usable if that ever changes.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Checks that `[addr, addr + len)` lies inside one live allocation.
    fn check_range(state: &HostState, addr: u64, len: usize) -> Result<(), DeviceError> {
        let len = len as u64;
        let inside = state
            .allocs
            .range(..=addr)
            .next_back()
            .is_some_and(|(&base, &size)| {
                addr.checked_add(len).is_some_and(|end| end <= base + size)
            });
        if inside {
            Ok(())
        } else {
            Err(DeviceError::Driver(format!(
                "invalid device range {addr:#x}+{len}: not inside a live allocation"
            )))
        }
    }
}

impl Device for HostDevice {
    fn id(&self) -> u32 {
        self.id
    }

    fn name(&self) -> String {
        format!("host:{} (simulated, {} bytes)", self.id, self.capacity)
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn alloc(&self, size: u64) -> Result<u64, DeviceError> {
        if size == 0 {
            // cuMemAlloc rejects 0 bytes too; the pool never asks for it.
            return Err(DeviceError::Driver("cannot allocate 0 bytes".into()));
        }
        let mut state = self.lock();
        let oom = |in_use| DeviceError::OutOfMemory {
            requested: size,
            capacity: self.capacity,
            in_use,
        };
        if size > self.capacity - state.in_use {
            return Err(oom(state.in_use));
        }
        let layout = usize::try_from(size)
            .ok()
            .and_then(|s| Layout::from_size_align(s, HOST_DEVICE_ALIGN).ok())
            .ok_or_else(|| oom(state.in_use))?;
        // From `System`, not the global allocator: the simulated device memory is not the
        // program's CPU heap, and a counting global allocator (the CPU columns of the epochs
        // report) must not see it.
        // SAFETY: `layout` has a non-zero size (checked above).
        let p = unsafe { System.alloc_zeroed(layout) };
        if p.is_null() {
            return Err(oom(state.in_use));
        }
        let addr = p as u64;
        state.allocs.insert(addr, size);
        state.in_use += size;
        Ok(addr)
    }

    unsafe fn free(&self, ptr: u64, size: u64) {
        let mut state = self.lock();
        // Only memory this device handed out, with its recorded size, is released, so a
        // contract violation by the caller leaks instead of corrupting the heap.
        match state.allocs.get(&ptr) {
            Some(&s) if s == size => {}
            _ => {
                debug_assert!(
                    false,
                    "HostDevice::free of unknown allocation {ptr:#x}+{size}"
                );
                return;
            }
        }
        state.allocs.remove(&ptr);
        state.in_use -= size;
        // SAFETY: (ptr, size) was allocated by `alloc` with this exact layout (checked above).
        unsafe {
            System.dealloc(
                ptr as *mut u8,
                Layout::from_size_align_unchecked(size as usize, HOST_DEVICE_ALIGN),
            )
        };
    }

    fn copy_from_host(&self, dst: u64, src: &[u8]) -> Result<(), DeviceError> {
        if src.is_empty() {
            return Ok(());
        }
        // Hold the lock during the copy so the allocation cannot be freed under us.
        let state = self.lock();
        Self::check_range(&state, dst, src.len())?;
        // SAFETY: the range lies inside a live allocation of ours; `src` is a distinct host slice.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        Ok(())
    }

    fn copy_to_host(&self, src: u64, dst: &mut [u8]) -> Result<(), DeviceError> {
        if dst.is_empty() {
            return Ok(());
        }
        let state = self.lock();
        Self::check_range(&state, src, dst.len())?;
        // SAFETY: as in `copy_from_host`; the memory was zero-initialised at allocation.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }
}

impl Drop for HostDevice {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        for (&ptr, &size) in &state.allocs {
            // SAFETY: every entry was allocated by `alloc` with this layout and not yet freed.
            unsafe {
                System.dealloc(
                    ptr as *mut u8,
                    Layout::from_size_align_unchecked(size as usize, HOST_DEVICE_ALIGN),
                )
            };
        }
        state.allocs.clear();
    }
}

impl std::fmt::Debug for HostDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostDevice")
            .field("id", &self.id)
            .field("capacity", &self.capacity)
            .field("in_use", &self.in_use())
            .finish()
    }
}
