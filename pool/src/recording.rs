//! A pool's events in a trace: the [`TraceHook`] made for a pool, which defines the pool's
//! device in the trace (name, capacity, rounding unit) once per recorder and device.

use std::sync::Mutex;

use poolsight_recorder::{DeviceInfo, Handle};

use crate::memory_pool::{MemoryPool, ALLOCATION_UNIT_SIZE};
use crate::trace_hook::TraceHook;

impl TraceHook {
    /// A hook writing to `handle`'s recorder, with `pool`'s device defined in the trace.
    pub fn for_pool(handle: Handle, pool: &MemoryPool) -> Self {
        define_pool_device(&handle, pool);
        Self::new(handle)
    }
}

/// (recorder id, device id) pairs already defined, so that several hooks or pools on one device
/// define it once.
static DEFINED: Mutex<Vec<(u64, u32)>> = Mutex::new(Vec::new());

/// Defines `pool`'s device in `handle`'s trace, once per recorder and device, so that reports
/// can name the device and know its capacity and rounding unit.
pub fn define_pool_device(handle: &Handle, pool: &MemoryPool) {
    let key = (handle.id(), pool.device_id());
    {
        let mut defined = DEFINED.lock().unwrap_or_else(|e| e.into_inner());
        if defined.contains(&key) {
            return;
        }
        defined.push(key);
    }
    let device = pool.device();
    handle.define_device(DeviceInfo::pool(
        pool.device_id(),
        device.name(),
        device.capacity(),
        ALLOCATION_UNIT_SIZE,
    ));
}
