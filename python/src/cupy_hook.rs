//! The recording side of `poolsight.cupy.TraceHook`: CuPy calls these methods directly (the
//! Python hook binds them as its callbacks), so a callback runs no Python bytecode, only the
//! keyword-argument parsing and the event write.
//!
//! The mapping is the Rust `TraceHook`'s (pool/src/trace_hook.rs): by default only the post
//! events, which carry the answer (pointer, pmem id) as well as the request; `pre_events`
//! keeps the pre events too. A malloc's event holds the requested `size` (the analyzer rounds
//! it by the device's allocation unit, 512 as CuPy's pool rounds); device allocations and frees
//! hold `mem_size`. Failures arrive as CuPy sends them, post events with `mem_ptr` 0.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use pyo3::prelude::*;

use poolsight_recorder::MemKind;

use crate::Recorder;

/// CuPy's `ALLOCATION_UNIT_SIZE`: its pool rounds every request up to a multiple of it.
const CUPY_ALLOCATION_UNIT: u64 = 512;

/// ``CupyHookSink(recorder, python_stacks=False, max_depth=0, pre_events=False)``: the six
/// callbacks of ``cupy.cuda.MemoryHook`` with CuPy's keyword arguments, writing memory events.
#[pyclass(module = "poolsight._native", frozen)]
pub struct CupyHookSink {
    recorder: Py<Recorder>,
    python_stacks: bool,
    max_depth: u32,
    pre_events: bool,
    /// Device ids already defined in the trace: a bit per id < 64, larger ids in the list.
    defined: AtomicU64,
    defined_high: Mutex<Vec<u32>>,
}

impl CupyHookSink {
    fn device(&self, id: i64) -> u32 {
        let id = u32::try_from(id).unwrap_or(0);
        let new = if id < 64 {
            let bit = 1u64 << id;
            self.defined.load(Ordering::Relaxed) & bit == 0
                && self.defined.fetch_or(bit, Ordering::Relaxed) & bit == 0
        } else {
            let mut high = self.defined_high.lock().unwrap_or_else(|e| e.into_inner());
            !high.contains(&id) && {
                high.push(id);
                true
            }
        };
        if new {
            let _ = self.recorder.get().session.define_device(
                id,
                &format!("cuda:{id}"),
                0,
                CUPY_ALLOCATION_UNIT,
            );
        }
        id
    }

    fn stack(&self, py: Python<'_>) -> u32 {
        let rec = self.recorder.get();
        let stack = if self.python_stacks {
            rec.python_stack(py, self.max_depth, 0)
        } else {
            rec.scopes_stack()
        };
        // A finished recording or a frame that cannot be read must not raise into CuPy.
        stack.unwrap_or(0)
    }

    fn write(&self, kind: MemKind, device: u32, ptr: u64, bytes: u64, stack: u32, pmem: u64) {
        self.recorder
            .get()
            .session
            .mem_event(kind, device, 0, ptr, bytes, stack, pmem as u32);
    }
}

#[pymethods]
impl CupyHookSink {
    #[new]
    #[pyo3(signature = (recorder, python_stacks=false, max_depth=0, pre_events=false))]
    fn new(
        recorder: &Bound<'_, PyAny>,
        python_stacks: bool,
        max_depth: u32,
        pre_events: bool,
    ) -> PyResult<Self> {
        Ok(CupyHookSink {
            recorder: crate::native_recorder(recorder)?,
            python_stacks,
            max_depth,
            pre_events,
            defined: AtomicU64::new(0),
            defined_high: Mutex::new(Vec::new()),
        })
    }

    #[getter]
    fn pre_events(&self) -> bool {
        self.pre_events
    }

    #[pyo3(signature = (*, device_id, size, mem_size))]
    fn malloc_preprocess(&self, py: Python<'_>, device_id: i64, size: u64, mem_size: u64) {
        let _ = mem_size;
        if self.pre_events {
            let device = self.device(device_id);
            let stack = self.stack(py);
            self.write(MemKind::MallocPre, device, 0, size, stack, 0);
        }
    }

    #[pyo3(signature = (*, device_id, size, mem_size, mem_ptr, pmem_id))]
    fn malloc_postprocess(
        &self,
        py: Python<'_>,
        device_id: i64,
        size: u64,
        mem_size: u64,
        mem_ptr: u64,
        pmem_id: u64,
    ) {
        let _ = mem_size;
        let device = self.device(device_id);
        let stack = self.stack(py);
        self.write(MemKind::MallocPost, device, mem_ptr, size, stack, pmem_id);
    }

    #[pyo3(signature = (*, device_id, mem_size))]
    fn alloc_preprocess(&self, py: Python<'_>, device_id: i64, mem_size: u64) {
        if self.pre_events {
            let device = self.device(device_id);
            let stack = self.stack(py);
            self.write(MemKind::AllocPre, device, 0, mem_size, stack, 0);
        }
    }

    #[pyo3(signature = (*, device_id, mem_size, mem_ptr))]
    fn alloc_postprocess(&self, py: Python<'_>, device_id: i64, mem_size: u64, mem_ptr: u64) {
        let device = self.device(device_id);
        let stack = self.stack(py);
        self.write(MemKind::AllocPost, device, mem_ptr, mem_size, stack, 0);
    }

    #[pyo3(signature = (*, device_id, mem_size, mem_ptr, pmem_id))]
    fn free_preprocess(&self, device_id: i64, mem_size: u64, mem_ptr: u64, pmem_id: u64) {
        if self.pre_events {
            let device = self.device(device_id);
            self.write(MemKind::FreePre, device, mem_ptr, mem_size, 0, pmem_id);
        }
    }

    #[pyo3(signature = (*, device_id, mem_size, mem_ptr, pmem_id))]
    fn free_postprocess(&self, device_id: i64, mem_size: u64, mem_ptr: u64, pmem_id: u64) {
        let device = self.device(device_id);
        self.write(MemKind::FreePost, device, mem_ptr, mem_size, 0, pmem_id);
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<CupyHookSink>()
}
