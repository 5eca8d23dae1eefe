//! The device memory of `poolsight.torch.fake_cuda`: every storage of a fake CUDA tensor is
//! served, as it is made, by the model of PyTorch's caching allocator
//! (`poolsight_alloc_models::pytorch::Allocator`, the one `whatif` replays runs through), and
//! given back to it when the storage is collected (a weakref's callback). So the fake run has
//! the addresses, block sizes, reserved bytes, segments and out-of-memory failures the real
//! allocator would have had, and `torch.cuda.memory_allocated()`, `memory_reserved()`,
//! `mem_get_info()` and `_dump_snapshot()` answer from it.
//!
//! While a `FakeGpu` is active, `track()` finds the address and block size of a fake storage
//! (whose own data pointer is null) here, by the storage's key ([`address_of`]).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyWeakrefReference};

use poolsight_alloc_models::pytorch::{Allocator, SegmentOp, Settings};
use poolsight_recorder::Prediction;

use crate::{Map, PoolsightError};

create_exception!(
    _native,
    FakeOutOfMemory,
    PoolsightError,
    "A fake CUDA request the caching allocator model could not serve: args are (requested, \
     rounded size, the device allocation it needed, reserved bytes, allocated bytes)."
);

/// A block handed to a fake storage.
struct Live {
    id: u64,
    addr: u64,
    size: u64,
    stream: u32,
    /// Keeps the weakref whose callback frees it.
    _weakref: Py<PyAny>,
}

struct Inner {
    alloc: Allocator,
    /// By the storage's key (`UntypedStorage._cdata`).
    live: Map<u64, Live>,
    /// The key of a storage by the address of its weakref.
    by_weakref: Map<usize, u64>,
    /// Bytes asked by each allocation id (a snapshot's `requested_size`).
    requested: Map<u64, u64>,
    /// Requests the model could not serve.
    ooms: u64,
    /// What a trace's CUDA device of this run says it predicted.
    prediction: Option<Prediction>,
    /// `torch.cuda.memory._record_memory_history`'s entries, while it is on.
    history: Option<History>,
    /// The segment operations of the allocator's log already turned into history entries.
    segments_seen: usize,
    started: Instant,
}

/// One entry of a snapshot's `device_traces`.
struct Entry {
    action: &'static str,
    addr: u64,
    size: u64,
    stream: u32,
    time_us: u64,
    /// The allocation's Python frames (a list of dicts), as the caller made them.
    frames: Option<Py<PyAny>>,
}

struct History {
    max_entries: usize,
    entries: VecDeque<Entry>,
}

impl Inner {
    /// Appends an entry (the oldest go when `max_entries` are kept), when history is on.
    fn note(
        &mut self,
        action: &'static str,
        addr: u64,
        size: u64,
        stream: u32,
        frames: Option<Py<PyAny>>,
    ) {
        let time_us = self.started.elapsed().as_micros() as u64;
        let Some(h) = &mut self.history else { return };
        if h.entries.len() >= h.max_entries {
            h.entries.pop_front();
        }
        h.entries.push_back(Entry {
            action,
            addr,
            size,
            stream,
            time_us,
            frames,
        });
    }

    /// The allocator's device-memory operations since the last call, as history entries.
    fn note_segments(&mut self) {
        let log: Vec<_> = self.alloc.segment_log()[self.segments_seen..].to_vec();
        self.segments_seen += log.len();
        for e in log {
            let action = match e.op {
                SegmentOp::Alloc => "segment_alloc",
                SegmentOp::Free => "segment_free",
                SegmentOp::Map => "segment_map",
                SegmentOp::Unmap => "segment_unmap",
            };
            self.note(action, e.addr, e.size, e.stream, None);
        }
    }
}

fn lock(m: &Mutex<Inner>) -> std::sync::MutexGuard<'_, Inner> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The active fake GPU (one at a time), for [`address_of`].
static ACTIVE: Mutex<Option<Weak<Mutex<Inner>>>> = Mutex::new(None);

/// Whether a fake GPU is active: `track()` then records CUDA tensors only (what the GPU
/// predicted for would hold), not the CPU's.
pub fn is_active() -> bool {
    let active = ACTIVE.lock().unwrap_or_else(|e| e.into_inner());
    active.as_ref().is_some_and(|w| w.strong_count() > 0)
}

/// The address and block size of the fake storage `key` on the active fake GPU.
pub fn address_of(key: u64) -> Option<(u64, u64)> {
    let active = ACTIVE.lock().unwrap_or_else(|e| e.into_inner());
    let inner = active.as_ref()?.upgrade()?;
    let inner = lock(&inner);
    inner.live.get(&key).map(|l| (l.addr, l.size))
}

/// What the active fake GPU predicts for, and the bytes its allocator may hold: what a trace's
/// CUDA device defined while it is active says.
pub fn active_prediction() -> Option<(Prediction, u64)> {
    let active = ACTIVE.lock().unwrap_or_else(|e| e.into_inner());
    let inner = active.as_ref()?.upgrade()?;
    let inner = lock(&inner);
    let p = inner.prediction.clone()?;
    let capacity = p.total_bytes.saturating_sub(p.context_bytes);
    Some((p, capacity))
}

/// The callback of the weakrefs on fake storages: the storage was collected, its block goes
/// back to the model. Holds the GPU weakly (the storages hold the weakrefs).
#[pyclass(module = "poolsight._native", frozen)]
struct FakeGone {
    inner: Weak<Mutex<Inner>>,
}

#[pymethods]
impl FakeGone {
    fn __call__(&self, weakref: &Bound<'_, PyAny>) {
        let Some(inner) = self.inner.upgrade() else {
            return;
        };
        let live = {
            let mut inner = lock(&inner);
            let key = inner.by_weakref.remove(&(weakref.as_ptr() as usize));
            let live = key.and_then(|k| inner.live.remove(&k));
            if let Some(l) = &live {
                inner.alloc.free(l.id);
                // A snapshot's trace entries say the bytes asked, as PyTorch's do.
                let asked = inner.requested.remove(&l.id).unwrap_or(l.size);
                inner.note("free_requested", l.addr, asked, l.stream, None);
                inner.note("free_completed", l.addr, asked, l.stream, None);
                inner.note_segments();
            }
            live
        };
        // The weakref itself is dropped here, outside the lock.
        drop(live);
    }
}

/// One fake CUDA device's memory, served by the caching allocator model.
#[pyclass(module = "poolsight._native", frozen)]
pub struct FakeGpu {
    inner: Arc<Mutex<Inner>>,
    gone: Py<FakeGone>,
}

#[pymethods]
impl FakeGpu {
    /// `settings`: a `PYTORCH_CUDA_ALLOC_CONF` string; `capacity`: the bytes the allocator may
    /// hold (None: without limit).
    #[new]
    #[pyo3(signature = (settings, capacity))]
    fn new(py: Python<'_>, settings: &str, capacity: Option<u64>) -> PyResult<Self> {
        let settings = Settings::parse(settings)
            .map_err(|e| PyValueError::new_err(format!("PYTORCH_CUDA_ALLOC_CONF: {e}")))?;
        let inner = Arc::new(Mutex::new(Inner {
            alloc: Allocator::new(settings, capacity).with_log(),
            live: Map::default(),
            by_weakref: Map::default(),
            requested: Map::default(),
            ooms: 0,
            prediction: None,
            history: None,
            segments_seen: 0,
            started: Instant::now(),
        }));
        let gone = Py::new(
            py,
            FakeGone {
                inner: Arc::downgrade(&inner),
            },
        )?;
        Ok(FakeGpu { inner, gone })
    }

    /// Makes this the GPU whose storages `track()` finds ([`address_of`]); `False` makes no
    /// GPU active (when this one is).
    fn activate(&self, on: bool) {
        let mut active = ACTIVE.lock().unwrap_or_else(|e| e.into_inner());
        if on {
            *active = Some(Arc::downgrade(&self.inner));
        } else if active
            .as_ref()
            .is_some_and(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(&self.inner)))
        {
            *active = None;
        }
    }

    /// Serves storage `storage` (key `key`, `nbytes` asked, on `stream`) once: its block's
    /// `(address, size)`, or None for an empty storage (the allocator hands out no block for 0
    /// bytes). Raises `FakeOutOfMemory` when the model cannot serve it.
    #[pyo3(signature = (storage, key, nbytes, stream, frames=None))]
    fn register(
        &self,
        storage: &Bound<'_, PyAny>,
        key: u64,
        nbytes: u64,
        stream: u32,
        frames: Option<Py<PyAny>>,
    ) -> PyResult<Option<(u64, u64)>> {
        if nbytes == 0 {
            return Ok(None);
        }
        {
            let inner = lock(&self.inner);
            if let Some(l) = inner.live.get(&key) {
                return Ok(Some((l.addr, l.size)));
            }
        }
        // Made before the model is asked: making a weakref may fail (then nothing is taken).
        let weakref = PyWeakrefReference::new_with(storage, self.gone.bind(storage.py()))?;
        let wkey = weakref.as_ptr() as usize;
        let mut inner = lock(&self.inner);
        match inner.alloc.malloc(nbytes, stream) {
            Ok(h) => {
                inner.note_segments();
                inner.note("alloc", h.addr, nbytes, stream, frames);
                inner.requested.insert(h.id, nbytes);
                inner.by_weakref.insert(wkey, key);
                inner.live.insert(
                    key,
                    Live {
                        id: h.id,
                        addr: h.addr,
                        size: h.size,
                        stream,
                        _weakref: weakref.into_any().unbind(),
                    },
                );
                Ok(Some((h.addr, h.size)))
            }
            Err(oom) => {
                inner.ooms += 1;
                inner.note_segments();
                // An "oom" entry keeps the device's free bytes where others keep the address.
                let free = inner
                    .alloc
                    .capacity()
                    .map(|c| c.saturating_sub(oom.reserved))
                    .unwrap_or(0);
                inner.note("oom", free, oom.requested, stream, frames);
                Err(FakeOutOfMemory::new_err((
                    oom.requested,
                    oom.size,
                    oom.alloc_size,
                    oom.reserved,
                    oom.allocated,
                )))
            }
        }
    }

    /// The block of storage `key`: `(address, size, stream)`, or None.
    fn block_of(&self, key: u64) -> Option<(u64, u64, u32)> {
        lock(&self.inner)
            .live
            .get(&key)
            .map(|l| (l.addr, l.size, l.stream))
    }

    /// The allocator's figures, named as `torch.cuda.memory_stats()` names them.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let inner = lock(&self.inner);
        let s = inner.alloc.stats();
        let d = PyDict::new(py);
        d.set_item("allocated_bytes.all.current", s.allocated)?;
        d.set_item("allocated_bytes.all.peak", s.peak_allocated)?;
        d.set_item("reserved_bytes.all.current", s.reserved)?;
        d.set_item("reserved_bytes.all.peak", s.peak_reserved)?;
        d.set_item("inactive_split_bytes.all.current", s.inactive_split)?;
        d.set_item("segment.all.current", s.segments)?;
        d.set_item("num_device_alloc", s.device_allocs)?;
        d.set_item("num_device_free", s.device_frees)?;
        d.set_item("num_ooms", inner.ooms)?;
        d.set_item("allocation.all.current", inner.live.len())?;
        let requested: u64 = inner.requested.values().sum();
        d.set_item("requested_bytes.all.current", requested)?;
        Ok(d)
    }

    /// `torch.cuda.reset_peak_memory_stats()`.
    fn reset_peaks(&self) {
        lock(&self.inner).alloc.reset_peaks();
    }

    /// `torch.cuda.empty_cache()`: cached blocks go back to the (fake) device.
    fn empty_cache(&self) {
        let mut inner = lock(&self.inner);
        inner.alloc.empty_cache();
        inner.note_segments();
    }

    /// `torch.cuda.memory._record_memory_history`: keeps the last `max_entries` allocations,
    /// frees and segment operations from now on (`None`: stops, and forgets them).
    fn record_history(&self, max_entries: Option<usize>) {
        let mut inner = lock(&self.inner);
        inner.history = max_entries.map(|max_entries| History {
            max_entries: max_entries.max(1),
            entries: VecDeque::new(),
        });
        inner.segments_seen = inner.alloc.segment_log().len();
    }

    /// Whether history is being recorded.
    #[getter]
    fn history_on(&self) -> bool {
        lock(&self.inner).history.is_some()
    }

    /// The history kept, as a snapshot's `device_traces[0]` lists it.
    fn history<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let inner = lock(&self.inner);
        let out = PyList::empty(py);
        let Some(h) = &inner.history else {
            return Ok(out);
        };
        for e in &h.entries {
            let d = PyDict::new(py);
            d.set_item("action", e.action)?;
            if e.action == "oom" {
                d.set_item("addr", 0)?;
                d.set_item("device_free", e.addr)?;
            } else {
                d.set_item("addr", e.addr)?;
            }
            d.set_item("size", e.size)?;
            d.set_item("stream", e.stream)?;
            d.set_item("time_us", e.time_us)?;
            match &e.frames {
                Some(f) => d.set_item("frames", f.bind(py))?,
                None => d.set_item("frames", PyList::empty(py))?,
            }
            out.append(d)?;
        }
        Ok(out)
    }

    /// The bytes the allocator may hold from now on (None: without limit).
    #[getter]
    fn capacity(&self) -> Option<u64> {
        lock(&self.inner).alloc.capacity()
    }

    #[setter]
    fn set_capacity(&self, capacity: Option<u64>) {
        lock(&self.inner).alloc.set_capacity(capacity);
    }

    /// The segments held, as `torch.cuda.memory._snapshot()["segments"]` lists them (without
    /// frames: the caller adds those it knows, by block address).
    fn segments<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let inner = lock(&self.inner);
        let out = PyList::empty(py);
        for seg in inner.alloc.segments() {
            let blocks = PyList::empty(py);
            let (mut allocated, mut active, mut requested_total) = (0u64, 0u64, 0u64);
            for b in &seg.blocks {
                let state = if b.allocated {
                    "active_allocated"
                } else if b.pending {
                    "active_pending_free"
                } else {
                    "inactive"
                };
                let requested = if b.allocated || b.pending {
                    inner.requested.get(&b.id).copied().unwrap_or(b.size)
                } else {
                    0
                };
                if b.allocated {
                    allocated += b.size;
                    requested_total += requested;
                }
                if b.allocated || b.pending {
                    active += b.size;
                }
                let d = PyDict::new(py);
                d.set_item("address", b.addr)?;
                d.set_item("size", b.size)?;
                d.set_item("requested_size", requested)?;
                d.set_item("state", state)?;
                blocks.append(d)?;
            }
            let d = PyDict::new(py);
            d.set_item("device", 0)?;
            d.set_item("address", seg.addr)?;
            d.set_item("total_size", seg.size)?;
            d.set_item("allocated_size", allocated)?;
            d.set_item("active_size", active)?;
            d.set_item("requested_size", requested_total)?;
            d.set_item("stream", seg.stream)?;
            d.set_item("segment_type", if seg.small { "small" } else { "large" })?;
            d.set_item("segment_pool_id", (0, 0))?;
            d.set_item("is_expandable", seg.expandable)?;
            d.set_item("blocks", blocks)?;
            out.append(d)?;
        }
        Ok(out)
    }

    /// Says what this GPU predicts for (the trace's device says it): the GPU's table name,
    /// model name, total bytes, the CUDA context's bytes, compute capability (major * 10 +
    /// minor) and what made the prediction.
    fn set_prediction(
        &self,
        gpu: String,
        model: String,
        total_bytes: u64,
        context_bytes: u64,
        compute_capability: u32,
        made_by: String,
    ) {
        lock(&self.inner).prediction = Some(Prediction {
            gpu,
            model,
            total_bytes,
            context_bytes,
            compute_capability,
            made_by,
        });
    }

    /// The allocator's settings, as `PYTORCH_CUDA_ALLOC_CONF` pairs.
    fn settings(&self) -> Vec<(String, String)> {
        lock(&self.inner).alloc.settings().pairs()
    }
}

impl Drop for FakeGpu {
    fn drop(&mut self) {
        let mut active = ACTIVE.lock().unwrap_or_else(|e| e.into_inner());
        if active
            .as_ref()
            .is_some_and(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(&self.inner)))
        {
            *active = None;
        }
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<FakeGpu>()?;
    m.add("FakeOutOfMemory", m.py().get_type::<FakeOutOfMemory>())?;
    Ok(())
}
