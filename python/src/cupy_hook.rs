//! The recording side of `poolsight.cupy.TraceHook`: CuPy calls these methods directly (the
//! Python hook binds them as its callbacks), so a callback runs no Python bytecode, only the
//! keyword-argument parsing and the event write.
//!
//! The mapping is the Rust `TraceHook`'s: each callback builds the pool's hook arguments and
//! hands them to a `TraceHook` (pool/src/trace_hook.rs, the one place that maps them onto
//! memory events), with the stack chosen here (`with_stack`). By default only the post events,
//! which carry the answer (pointer, pmem id) as well as the request; `pre_events` keeps the pre
//! events too. Failures arrive as CuPy sends them, post events with `mem_ptr` 0.

use std::panic::Location;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use pyo3::prelude::*;

use poolsight_pool::hooks::{AllocPost, AllocPre, FreeInfo, MallocPost, MallocPre, MemoryHook};
use poolsight_pool::{with_stack, TraceHook};

use crate::{err, Recorder};

/// CuPy's `ALLOCATION_UNIT_SIZE`: its pool rounds every request up to a multiple of it.
const CUPY_ALLOCATION_UNIT: u64 = 512;

/// ``CupyHookSink(recorder, python_stacks=False, max_depth=0, pre_events=False)``: the six
/// callbacks of ``cupy.cuda.MemoryHook`` with CuPy's keyword arguments, writing memory events.
#[pyclass(module = "poolsight._native", frozen)]
pub struct CupyHookSink {
    recorder: Py<Recorder>,
    hook: TraceHook,
    python_stacks: bool,
    max_depth: u32,
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
            self.recorder.get().session.define_device(
                id,
                &format!("cuda:{id}"),
                0,
                CUPY_ALLOCATION_UNIT,
            );
        }
        id
    }

    /// Runs `f` (a callback of the TraceHook) with the allocation's stack: the Python frames,
    /// or the open scopes (stack 0, which the TraceHook resolves to them). A frame that cannot
    /// be read must not raise into CuPy: the open scopes then.
    fn with_caller_stack(&self, py: Python<'_>, f: impl FnOnce(&TraceHook)) {
        let rec = self.recorder.get();
        // After finish the recorder counts what reaches it as dropped, as for any binding.
        let stack = if self.python_stacks {
            rec.python_stack(py, self.max_depth, 0).unwrap_or(0)
        } else {
            0
        };
        with_stack(stack, || f(&self.hook));
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
        let recorder = crate::native_recorder(recorder)?;
        let handle = recorder.get().session.handle().map_err(err)?.clone();
        Ok(CupyHookSink {
            recorder,
            hook: TraceHook::new(handle).with_pre_events(pre_events),
            python_stacks,
            max_depth,
            defined: AtomicU64::new(0),
            defined_high: Mutex::new(Vec::new()),
        })
    }

    #[getter]
    fn pre_events(&self) -> bool {
        self.hook.wants_pre()
    }

    #[pyo3(signature = (*, device_id, size, mem_size))]
    fn malloc_preprocess(&self, py: Python<'_>, device_id: i64, size: u64, mem_size: u64) {
        if self.hook.wants_pre() {
            let info = MallocPre {
                device_id: self.device(device_id),
                size,
                mem_size,
                stream: 0,
                caller: Location::caller(),
            };
            self.with_caller_stack(py, |h| h.malloc_preprocess(&info));
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
        let info = MallocPost {
            device_id: self.device(device_id),
            size,
            mem_size,
            mem_ptr,
            pmem_id,
            stream: 0,
            caller: Location::caller(),
            // CuPy calls its hooks outside its pool's lock: recorded at the time of the call.
            ticks: 0,
        };
        self.with_caller_stack(py, |h| h.malloc_postprocess(&info));
    }

    #[pyo3(signature = (*, device_id, mem_size))]
    fn alloc_preprocess(&self, py: Python<'_>, device_id: i64, mem_size: u64) {
        if self.hook.wants_pre() {
            let info = AllocPre {
                device_id: self.device(device_id),
                mem_size,
                stream: 0,
                caller: Location::caller(),
            };
            self.with_caller_stack(py, |h| h.alloc_preprocess(&info));
        }
    }

    #[pyo3(signature = (*, device_id, mem_size, mem_ptr))]
    fn alloc_postprocess(&self, py: Python<'_>, device_id: i64, mem_size: u64, mem_ptr: u64) {
        let info = AllocPost {
            device_id: self.device(device_id),
            mem_size,
            mem_ptr,
            stream: 0,
            caller: Location::caller(),
        };
        self.with_caller_stack(py, |h| h.alloc_postprocess(&info));
    }

    #[pyo3(signature = (*, device_id, mem_size, mem_ptr, pmem_id))]
    fn free_preprocess(&self, device_id: i64, mem_size: u64, mem_ptr: u64, pmem_id: u64) {
        if self.hook.wants_pre() {
            self.free(
                |h, i| h.free_preprocess(i),
                device_id,
                mem_size,
                mem_ptr,
                pmem_id,
            );
        }
    }

    #[pyo3(signature = (*, device_id, mem_size, mem_ptr, pmem_id))]
    fn free_postprocess(&self, device_id: i64, mem_size: u64, mem_ptr: u64, pmem_id: u64) {
        self.free(
            |h, i| h.free_postprocess(i),
            device_id,
            mem_size,
            mem_ptr,
            pmem_id,
        );
    }
}

impl CupyHookSink {
    /// A free callback: no stack, and nothing once the recording is finished (a late free is
    /// not a lost event, see `Session::mem_event`).
    fn free(
        &self,
        f: impl FnOnce(&TraceHook, &FreeInfo),
        device_id: i64,
        mem_size: u64,
        mem_ptr: u64,
        pmem_id: u64,
    ) {
        if self.recorder.get().session.is_finished() {
            return;
        }
        let info = FreeInfo {
            device_id: self.device(device_id),
            mem_size,
            mem_ptr,
            pmem_id,
            stream: 0,
            ticks: 0,
        };
        f(&self.hook, &info);
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<CupyHookSink>()
}
