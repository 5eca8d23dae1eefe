//! The storages `track()` records, on either path (the dispatch mode's outputs, or the
//! native observer's through `native.rs`): each recorded once, under the stack of where it was
//! made and its category's label; a storage seen again under another category (a parameter,
//! its gradient, what an optimizer step keeps) relabelled; its free recorded by a weakref's
//! callback ([`Gone`]) or, under the native observer, by its deleter (`observer.cpp`).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Mutex, Weak};

use pyo3::exceptions::{PyNotImplementedError, PyRuntimeError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple, PyWeakrefReference};

use super::{lock, Seen, Storages, TorchState, CATEGORIES};

/// The callback of the weakrefs on recorded storages: a storage was collected, its free.
///
/// It holds the recording and the storages weakly. The storages hold the weakrefs, and a
/// weakref holds its callback: strong references here would be a cycle through Python objects
/// that the garbage collector cannot see, and every tensor recorded that outlives its
/// recording (a model's parameters) would keep the recording's file mapped (a terabyte of
/// address space each, so that a process making a few hundred recordings of one model ran out
/// of it).
#[pyclass(module = "poolsight._native", frozen)]
pub struct Gone {
    pub(super) session: Weak<poolsight_capi::Session>,
    pub(super) storages: Weak<Mutex<Storages>>,
}

#[pymethods]
impl Gone {
    fn __call__(&self, weakref: &Bound<'_, PyAny>) {
        let (Some(session), Some(storages)) = (self.session.upgrade(), self.storages.upgrade())
        else {
            return;
        };
        let entry = {
            let mut storages = lock(&storages);
            // Under the native observer the allocator may report the same free: it finds it
            // told.
            let key = storages.by_weakref.remove(&(weakref.as_ptr() as usize));
            key.and_then(|key| storages.forget(key))
        };
        if let Some(seen) = entry {
            session.observed_free(seen.device, seen.ptr, seen.bytes);
        }
    }
}

impl TorchState {
    pub(super) fn labelled(&self, base: u32, category: u8) -> u32 {
        if let Some(&stack) = lock(&self.storages).labelled.get(&(base, category)) {
            return stack;
        }
        let stack = self
            .session()
            .push_label(base, CATEGORIES[category as usize]);
        if stack != 0 {
            lock(&self.storages)
                .labelled
                .insert((base, category), stack);
        }
        stack
    }

    /// A block under `base` and its category's label.
    pub(super) fn observed(&self, bytes: u64, ptr: u64, base: u32, category: u8, device: u32) {
        let stack = self.labelled(base, category);
        self.session().observed(device, ptr, bytes, stack);
    }

    /// The trace's device of tensor `t`.
    pub(super) fn device(&self, py: Python<'_>, t: &Bound<'_, PyAny>) -> PyResult<u32> {
        let index: i64 = t.call_method0(intern!(py, "get_device"))?.extract()?;
        if let Some(&d) = lock(&self.storages).devices.get(&index) {
            return Ok(d);
        }
        let device = t.getattr(intern!(py, "device"))?;
        let device_type: String = device.getattr(intern!(py, "type"))?.extract()?;
        let device_index: Option<u32> = device.getattr(intern!(py, "index"))?.extract()?;
        Ok(self.trace_device(index, &device_type, device_index))
    }

    /// The trace's device of PyTorch's device `device_type`:`index` (`key`: its index, -1 for
    /// the CPU), defined when first seen, with an id no other device of the recording has.
    pub(super) fn trace_device(&self, key: i64, device_type: &str, index: Option<u32>) -> u32 {
        let mut storages = lock(&self.storages);
        if let Some(&d) = storages.devices.get(&key) {
            return d;
        }
        // Not one a pool of the same recording has (a host pool is device 0 too).
        let id = self.session().unused_device_id();
        storages.devices.insert(key, id);
        drop(storages);
        let mut info = poolsight::import::device::pytorch_device(id, device_type, index, true);
        if device_type == "cuda" {
            if let Some((prediction, capacity)) = crate::fake_cuda::active_prediction() {
                // A fake CUDA run's device: what it predicts for, its blocks rounded as the
                // caching allocator rounds them.
                info.capacity = capacity;
                info.allocation_unit = 512;
                info.prediction = Some(prediction);
            }
        }
        self.session().define_device_info(info);
        id
    }

    /// `t`'s storage and its key, or None for a tensor without one.
    pub(super) fn storage<'py>(
        py: Python<'py>,
        t: &Bound<'py, PyAny>,
    ) -> PyResult<Option<(Bound<'py, PyAny>, u64)>> {
        match t.call_method0(intern!(py, "untyped_storage")) {
            Ok(st) => {
                let key: u64 = st.getattr(intern!(py, "_cdata"))?.extract()?;
                Ok(Some((st, key)))
            }
            Err(e)
                if e.is_instance_of::<PyRuntimeError>(py)
                    || e.is_instance_of::<PyNotImplementedError>(py) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// A tensor off the GPU while a fake CUDA run is recorded: the prediction is of the GPU's
    /// memory, and the CPU's tensors are not recorded.
    fn not_predicted(py: Python<'_>, t: &Bound<'_, PyAny>) -> PyResult<bool> {
        if !crate::fake_cuda::is_active() {
            return Ok(false);
        }
        Ok(!t.getattr(intern!(py, "is_cuda"))?.extract::<bool>()?)
    }

    pub(super) fn is_seen(&self, key: u64) -> bool {
        lock(&self.storages).seen.contains_key(&key)
    }

    /// Storage `st`'s (key `key`) size and address, or None for one that holds no memory
    /// (a meta tensor's, an empty one's: address 0), which is not recorded. A fake CUDA
    /// tensor's storage (`fake_cuda`) holds none either: its block is the one the active fake
    /// GPU's allocator model served it.
    pub(super) fn block(
        py: Python<'_>,
        st: &Bound<'_, PyAny>,
        key: u64,
    ) -> PyResult<Option<(u64, u64)>> {
        if let Some((addr, size)) = crate::fake_cuda::address_of(key) {
            return Ok(Some((size, addr)));
        }
        let ptr: u64 = st.call_method0(intern!(py, "data_ptr"))?.extract()?;
        if ptr == 0 {
            return Ok(None);
        }
        let bytes: u64 = st.call_method0(intern!(py, "nbytes"))?.extract()?;
        Ok(Some((bytes, ptr)))
    }

    /// Records storage `st` (of tensor `t`; its `(bytes, ptr, key)` from `block` and
    /// `storage`) not seen before under `base` and its category; `outer` is where a
    /// relabelling puts it.
    pub(super) fn record_new(
        slf: &Bound<'_, Self>,
        t: &Bound<'_, PyAny>,
        st: &Bound<'_, PyAny>,
        (bytes, ptr, key): (u64, u64, u64),
        category: u8,
        base: u32,
        outer: u32,
    ) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let device = this.device(py, t)?;
        let weakref = PyWeakrefReference::new_with(st, this.gone.bind(py))?;
        let wkey = weakref.as_ptr() as usize;
        if this.native.load(Relaxed) {
            // Made before tracking began, as a rule (what operators make is recorded as their
            // output): the allocator may never report its free, the weakref will.
            let weakref = Some((wkey, weakref.into_any().unbind()));
            this.record_native(key, ptr, bytes, device, category, (base, outer), 0, weakref);
            return Ok(());
        }
        this.observed(bytes, ptr, base, category, device);
        this.recorded.fetch_add(1, Relaxed);
        let mut storages = lock(&this.storages);
        storages.by_weakref.insert(wkey, key);
        storages.seen.insert(
            key,
            Seen {
                category,
                bytes,
                ptr,
                device,
                base: outer,
                watch: 0,
                _weakref: Some(weakref.into_any().unbind()),
            },
        );
        Ok(())
    }

    /// `track`, the category parsed.
    pub(super) fn track_one(
        slf: &Bound<'_, Self>,
        t: &Bound<'_, PyAny>,
        category: u8,
        relabel: bool,
    ) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        if Self::not_predicted(py, t)? {
            return Ok(());
        }
        let Some((st, key)) = Self::storage(py, t)? else {
            return Ok(());
        };
        let relabelled = {
            let mut storages = lock(&this.storages);
            match storages.seen.get_mut(&key) {
                None => None,
                Some(seen) if !relabel || seen.category == category => return Ok(()),
                Some(seen) => {
                    seen.category = category;
                    Some((seen.bytes, seen.ptr, seen.device, seen.base))
                }
            }
        };
        match relabelled {
            // Moved from its old category to this one: one relabel, so that cumulative figures
            // count the block once, where it was made.
            Some((bytes, ptr, device, base)) => {
                let stack = this.labelled(base, category);
                this.session().relabel(device, ptr, bytes, stack);
                Ok(())
            }
            None => {
                let Some((bytes, ptr)) = Self::block(py, &st, key)? else {
                    return Ok(());
                };
                let in_backward = this.in_backward(py)?;
                let base = this.base(py, in_backward)?;
                Self::record_new(slf, t, &st, (bytes, ptr, key), category, base, base)
            }
        }
    }

    /// Records the storages of an operator's outputs not seen before, under `base` (None:
    /// where the program is); `outer` is the stack the operator's scope opened under, where a
    /// storage relabelled later goes.
    pub(super) fn outputs(
        slf: &Bound<'_, Self>,
        out: &Bound<'_, PyAny>,
        view: bool,
        in_backward: bool,
        mut base: Option<u32>,
        outer: Option<u32>,
    ) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let tensor = this.calls.tensor.bind(py);
        let mut category = None;
        let fake = crate::fake_cuda::is_active();
        let mut each = |t: &Bound<'_, PyAny>| -> PyResult<()> {
            if fake && Self::not_predicted(py, t)? {
                return Ok(());
            }
            let Some((st, key)) = Self::storage(py, t)? else {
                return Ok(());
            };
            if this.is_seen(key) {
                return Ok(());
            }
            let Some((bytes, ptr)) = Self::block(py, &st, key)? else {
                return Ok(());
            };
            let cat = match category {
                Some(c) => c,
                None => {
                    let c = this.category(view, in_backward);
                    category = Some(c);
                    c
                }
            };
            let b = match base {
                Some(b) => b,
                None => {
                    let b = this.base(py, in_backward)?;
                    base = Some(b);
                    b
                }
            };
            let block = (bytes, ptr, key);
            Self::record_new(slf, t, &st, block, cat, b, outer.unwrap_or(b))
        };
        if out.is_instance(tensor)? {
            return each(out);
        }
        let listed = if let Ok(tuple) = out.cast::<PyTuple>() {
            let items: Vec<_> = tuple.iter().collect();
            Some(items)
        } else if let Ok(list) = out.cast::<PyList>() {
            Some(list.iter().collect())
        } else {
            None
        };
        if let Some(items) = listed {
            let mut all = true;
            for item in &items {
                if !item.is_instance(tensor)? {
                    all = false;
                    break;
                }
            }
            if all {
                for item in &items {
                    each(item)?;
                }
                return Ok(());
            }
        }
        let tensors = this.calls.tensors.bind(py).call1((out,))?;
        for t in tensors.try_iter()? {
            each(&t?)?;
        }
        Ok(())
    }
}
