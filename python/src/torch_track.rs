//! The per-operator path of `poolsight.torch` (`track()` and `hook()`), in Rust: every ATen
//! operator of a recorded PyTorch program passes through `TorchState::dispatch`, the
//! recording's `TorchDispatchMode`'s `__torch_dispatch__`, so what it does per operator is
//! kept here, out of the interpreter: the operator's scope (forward, or backward under the
//! module whose forward made its autograd node), the storages of its outputs recorded once
//! with their category, and their frees through weakref callbacks.
//!
//! The rules are `python/poolsight/torch.py`'s (its docstrings say them); the Python side keeps
//! what runs once per module call or per optimizer step, and the rare cases (the user's line of
//! a call, `stacks="python"`, outputs that are neither a tensor nor a list of them), which this
//! calls back.
//!
//! No lock is held across a call into Python: a call into Python may run a weakref callback
//! (`gone`) that takes the same lock.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use pyo3::{PyTraverseError, PyVisit};

use poolsight_recorder::{Phase, ScopeKind};

use crate::autograd::Spans;
use crate::{Map, Recorder};

mod native;
mod sites;
mod storages;
use native::NativeTable;
use sites::Sites;
use storages::Gone;

/// `poolsight.torch.CATEGORIES` (the Python module takes them from here), in its order.
/// `workspace` is what PyTorch's libraries take for themselves through the caching allocator
/// (the cuBLAS workspace of each thread and stream): only a fake CUDA run, which models it,
/// records it.
const CATEGORIES: [&str; 8] = [
    "parameter",
    "buffer",
    "gradient",
    "activation",
    "optimizer_state",
    "temporary",
    "input",
    "workspace",
];
const GRADIENT: u8 = 2;
const ACTIVATION: u8 = 3;
const TEMPORARY: u8 = 5;
const INPUT: u8 = 6;

fn category_of(name: &str) -> PyResult<u8> {
    CATEGORIES
        .iter()
        .position(|c| *c == name)
        .map(|i| i as u8)
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "category must be one of {}, not {name:?}",
                CATEGORIES.join(", ")
            ))
        })
}

/// What an operator is, learnt once per operator (by `poolsight.torch._op_info`).
struct OpInfo {
    /// `aten::addmm`, as the profiler names it.
    name: String,
    /// Its outputs alias its inputs (a view): an output storage not seen before is data that
    /// existed before tracking began.
    view: bool,
    /// Gets a scope (the profiler's own operators do not).
    scoped: bool,
    /// Keeps the operator, whose address is the key, alive (None: the native observer's,
    /// keyed by its name's address, which lives as long as PyTorch).
    _func: Option<Py<PyAny>>,
    /// Its scope's stack under a parent stack, forward or backward (interned once each).
    stacks: Mutex<Map<(u32, bool), u32>>,
}

impl OpInfo {
    /// The stack of this operator's scope under `parent` in `phase`.
    fn stack(&self, session: &poolsight_capi::Session, parent: u32, phase: Phase) -> u32 {
        let key = (parent, phase == Phase::Backward);
        if let Some(&stack) = lock(&self.stacks).get(&key) {
            return stack;
        }
        let stack = session.scope_stack(parent, ScopeKind::Function, &self.name, phase, "", 0);
        if stack != 0 {
            lock(&self.stacks).insert(key, stack);
        }
        stack
    }
}

/// A storage recorded and not yet freed.
struct Seen {
    category: u8,
    bytes: u64,
    ptr: u64,
    device: u32,
    /// The stack a relabelling records it under (without its category).
    base: u32,
    /// The number the native observer gave it (0: not its): it tells by this number the free
    /// of a storage it watches, one whose free none of its deleters can tell (see `native.rs`).
    watch: u64,
    /// The weakref whose callback records its free (kept alive here); None for an operator's
    /// output under the native observer (its deleter tells the free, or it is watched).
    _weakref: Option<Py<PyAny>>,
}

/// Where the step is, for the category of what an operator makes (`_Tracker.category`).
#[derive(Default)]
struct Step {
    in_optimizer: u32,
    forward_seen: bool,
    backward_seen: bool,
}

#[derive(Default)]
struct Storages {
    /// By the storage's `_cdata` (its C++ address, unique while it lives).
    seen: Map<u64, Seen>,
    /// The `_cdata` of a storage by the address of the weakref that watches it.
    by_weakref: Map<usize, u64>,
    /// The key of a storage recorded under the native observer by its address (its deleter
    /// tells frees by address).
    by_ptr: Map<u64, u64>,
    /// PyTorch's device index (-1: CPU) -> the trace's device id.
    devices: Map<i64, u32>,
    /// (stack, category) -> the stack with the category's label frame.
    labelled: Map<(u32, u8), u32>,
}

impl Storages {
    /// Takes storage `key` out of what is seen, with its address (when that is still its):
    /// its free told, by whichever of the allocator, the observer's watch or a weakref tells
    /// it first.
    fn forget(&mut self, key: u64) -> Option<Seen> {
        let seen = self.seen.remove(&key)?;
        if self.by_ptr.get(&seen.ptr) == Some(&key) {
            self.by_ptr.remove(&seen.ptr);
        }
        Some(seen)
    }
}

/// Module forwards open on one thread (any module), and those run again inside backward
/// (activation checkpointing's recomputation), per `TorchState` (by its `id`). A thread holds
/// an entry only while one of them is open, so the list stays as short as the recordings
/// with a forward open on it.
#[derive(Default, Clone, Copy, PartialEq)]
struct Local {
    forward: u32,
    recompute: u32,
    /// Module calls and optimizer steps open (`OpenCalls`), for the native observer.
    calls: u32,
}

thread_local! {
    static LOCALS: RefCell<Vec<(u64, Local)>> = const { RefCell::new(Vec::new()) };
}

/// The next `TorchState::id`: never reused, unlike an address.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The Python objects the path calls, looked up once.
struct Calls {
    /// `torch._C._current_graph_task_id`: -1 outside backward.
    graph_task: Py<PyAny>,
    /// `torch._C._current_autograd_node`.
    current_node: Py<PyAny>,
    tensor: Py<PyAny>,
    /// `poolsight.torch._op_info(func) -> (name, view, scoped)`.
    op_info: Py<PyAny>,
    /// `poolsight.torch._tensors(out)`: the tensors of any output.
    tensors: Py<PyAny>,
}

/// One recording's PyTorch state that every operator reads: see the module's comment.
#[pyclass(module = "poolsight._native", frozen)]
pub struct TorchState {
    /// Its key in each thread's `LOCALS`.
    id: u64,
    recorder: Py<Recorder>,
    /// The Python `_State`, for the rare cases.
    state: Py<PyAny>,
    /// Its `OpenCalls` (a `threading.local`): module calls and optimizer steps open.
    open_calls: Py<PyAny>,
    spans: Py<Spans>,
    calls: Calls,
    /// The recording's `stacks` is "python", and its `max_depth`.
    python_stacks: bool,
    max_depth: u32,
    /// `hook(functions=True)` open (operator scopes).
    ops: AtomicU32,
    /// `user_line` users.
    user_lines: AtomicU32,
    /// `track()` open.
    tracking: AtomicBool,
    /// Optimizer steps open, and a module's forward ran inside one (a closure).
    steps_open: AtomicBool,
    step_forward: AtomicBool,
    /// A backward ran since the last forward pass began.
    backward_ran: AtomicBool,
    /// Storages recorded by `track()` so far.
    recorded: AtomicU64,
    /// The last number given to a storage the native observer watches.
    watches: AtomicU64,
    step: Mutex<Step>,
    /// Shared with `gone`, which records frees.
    storages: Arc<Mutex<Storages>>,
    op_infos: Mutex<Map<usize, Arc<OpInfo>>>,
    sites: Sites,
    /// The native observer (`poolsight._native_observer`) is what sees operators and frees.
    native: AtomicBool,
    /// Its operators, by the address of their name.
    native_ops: Mutex<Map<usize, Arc<OpInfo>>>,
    /// The table of functions handed to it, once made.
    table: Mutex<Option<Box<NativeTable>>>,
    /// Every weakref's callback. Not a method of this object: the weakrefs it keeps would
    /// keep it alive.
    gone: Py<Gone>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl TorchState {
    fn local(&self) -> Local {
        LOCALS.with(|l| {
            l.borrow()
                .iter()
                .find(|(k, _)| *k == self.id)
                .map(|(_, v)| *v)
                .unwrap_or_default()
        })
    }

    fn update_local(&self, f: impl FnOnce(&mut Local)) {
        LOCALS.with(|l| {
            let mut l = l.borrow_mut();
            let i = match l.iter().position(|(k, _)| *k == self.id) {
                Some(i) => i,
                None => {
                    l.push((self.id, Local::default()));
                    l.len() - 1
                }
            };
            f(&mut l[i].1);
            if l[i].1 == Local::default() {
                l.swap_remove(i);
            }
        });
    }

    fn session(&self) -> &poolsight_capi::Session {
        &self.recorder.get().session
    }

    fn in_backward(&self, py: Python<'_>) -> PyResult<bool> {
        let task: i64 = self.calls.graph_task.bind(py).call0()?.extract()?;
        Ok(task != -1)
    }

    fn calls_open(&self, py: Python<'_>) -> PyResult<bool> {
        let calls = self.open_calls.bind(py).getattr(intern!(py, "calls"))?;
        Ok(calls
            .cast::<PyList>()
            .map(|l| !l.is_empty())
            .unwrap_or(true))
    }

    fn op_info(&self, py: Python<'_>, func: &Bound<'_, PyAny>) -> PyResult<Arc<OpInfo>> {
        let key = func.as_ptr() as usize;
        if let Some(info) = lock(&self.op_infos).get(&key) {
            return Ok(info.clone());
        }
        let (name, view, scoped): (String, bool, bool) =
            self.calls.op_info.bind(py).call1((func,))?.extract()?;
        let info = Arc::new(OpInfo {
            name,
            view,
            scoped,
            _func: Some(func.clone().unbind()),
            stacks: Mutex::new(Map::default()),
        });
        lock(&self.op_infos).insert(key, info.clone());
        Ok(info)
    }

    /// `_State.user_parent(frame, parent)`: the stack a call made now opens under when it
    /// should begin with the user's line; the checks that need no frame are made here.
    fn user_parent(&self, py: Python<'_>, parent: u32) -> PyResult<u32> {
        if self.user_lines.load(Relaxed) == 0 {
            return Ok(parent);
        }
        if self.calls_open(py)? {
            if !self.step_forward.load(Relaxed) {
                return Ok(parent);
            }
            // Inside an optimizer's step that runs a forward (a closure): the rare case.
            return self
                .state
                .bind(py)
                .call_method1(intern!(py, "user_parent_here"), (parent,))?
                .extract();
        }
        self.user_line(py, parent)
    }

    /// `_State.backward_parent`: the stack of the module call whose forward made the autograd
    /// node running now.
    fn backward_parent(&self, py: Python<'_>) -> PyResult<Option<u32>> {
        self.backward_ran.store(true, Relaxed);
        let node = self.calls.current_node.bind(py).call0()?;
        if node.is_none() {
            return Ok(None);
        }
        let seq: u64 = node.call_method0(intern!(py, "_sequence_nr"))?.extract()?;
        Ok(self.spans.get().find(seq))
    }

    /// `_Tracker._base`: the stack an allocation made now hangs under (before its category).
    /// A `stacks="python"` stack starts at the innermost Python frame, the operator's caller
    /// or a hook of poolsight's (whose own frames a Python stack leaves out).
    fn base(&self, py: Python<'_>, in_backward: bool) -> PyResult<u32> {
        let session = self.session();
        if self.python_stacks {
            return self.recorder.get().python_stack(py, self.max_depth, 0);
        }
        let ops = self.ops.load(Relaxed) > 0;
        if in_backward {
            if !ops {
                if let Some(parent) = self.backward_parent(py)? {
                    return Ok(parent);
                }
                // A node no module made (the loss's, or any without module scopes): under the
                // line that called backward(), as its operator's scope would be.
                return self.user_parent(py, session.current_stack());
            }
            return Ok(session.current_stack());
        }
        if !ops {
            return self.user_parent(py, session.current_stack());
        }
        Ok(session.current_stack())
    }

    /// `_Tracker.category`: what a storage an operator makes now is, from where in the step
    /// it happens.
    fn category(&self, view: bool, in_backward: bool) -> u8 {
        let local = self.local();
        let mut step = lock(&self.step);
        if in_backward {
            step.backward_seen = true;
            self.backward_ran.store(true, Relaxed);
            return if local.recompute > 0 {
                ACTIVATION
            } else {
                TEMPORARY
            };
        }
        if step.in_optimizer > 0 {
            // A closure (Lightning runs training_step inside optimizer.step): its forward and
            // loss are activations, its backward above; what comes after is the update.
            if local.forward > 0 || (step.forward_seen && !step.backward_seen) {
                step.forward_seen = true;
                return ACTIVATION;
            }
            // What the step keeps is relabelled when it ends; the rest was temporary.
            return TEMPORARY;
        }
        if step.backward_seen {
            // The first storage after a backward: a new step (or micro-batch) begins.
            step.backward_seen = false;
            step.forward_seen = local.forward > 0;
        }
        if view {
            // A view's storage not seen before existed before tracking began: data.
            return INPUT;
        }
        if step.forward_seen || local.forward > 0 {
            step.forward_seen = true;
            return ACTIVATION;
        }
        INPUT
    }
}

#[pymethods]
impl TorchState {
    /// The recording finished: nothing more can be recorded, so the weakrefs on the storages
    /// still alive are let go (a model kept after its recording no longer carries them), with
    /// all that is known of storages.
    fn release(&self) {
        let known = std::mem::take(&mut *lock(&self.storages));
        drop(known);
    }

    /// What it keeps of Python's, for the garbage collector: the Python `_State` keeps this
    /// object and this keeps it.
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.recorder)?;
        visit.call(&self.state)?;
        visit.call(&self.open_calls)?;
        visit.call(&self.spans)?;
        visit.call(&self.calls.graph_task)?;
        visit.call(&self.calls.current_node)?;
        visit.call(&self.calls.tensor)?;
        visit.call(&self.calls.op_info)?;
        visit.call(&self.calls.tensors)?;
        visit.call(&self.gone)?;
        Ok(())
    }

    /// `state`: the Python `_State`; `open_calls`: its `OpenCalls`; `spans`: its `Spans`;
    /// `torch_c`: `torch._C`; `tensor`: `torch.Tensor`; `op_info`, `tensors`: helpers of
    /// `poolsight.torch`.
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        recorder: Py<Recorder>,
        state: Py<PyAny>,
        open_calls: Py<PyAny>,
        spans: Py<Spans>,
        torch_c: &Bound<'_, PyAny>,
        tensor: Py<PyAny>,
        op_info: Py<PyAny>,
        tensors: Py<PyAny>,
        python_stacks: bool,
        max_depth: u32,
    ) -> PyResult<Self> {
        let py = torch_c.py();
        let storages = Arc::new(Mutex::new(Storages::default()));
        let gone = Py::new(
            py,
            Gone {
                session: Arc::downgrade(&recorder.get().session),
                storages: Arc::downgrade(&storages),
            },
        )?;
        Ok(TorchState {
            id: NEXT_ID.fetch_add(1, Relaxed),
            recorder,
            state,
            open_calls,
            spans,
            calls: Calls {
                graph_task: torch_c
                    .getattr(intern!(py, "_current_graph_task_id"))?
                    .unbind(),
                current_node: torch_c
                    .getattr(intern!(py, "_current_autograd_node"))?
                    .unbind(),
                tensor,
                op_info,
                tensors,
            },
            python_stacks,
            max_depth,
            ops: AtomicU32::new(0),
            user_lines: AtomicU32::new(0),
            tracking: AtomicBool::new(false),
            steps_open: AtomicBool::new(false),
            step_forward: AtomicBool::new(false),
            backward_ran: AtomicBool::new(false),
            recorded: AtomicU64::new(0),
            watches: AtomicU64::new(0),
            step: Mutex::new(Step::default()),
            storages,
            op_infos: Mutex::new(Map::default()),
            sites: Sites::default(),
            native: AtomicBool::new(false),
            native_ops: Mutex::new(Map::default()),
            table: Mutex::new(None),
            gone,
        })
    }

    /// The recording's `__torch_dispatch__`: `func` run under its scope (with operator scopes
    /// on), its outputs' storages recorded (with `track()` on).
    #[pyo3(signature = (_mode, func, _types, args=None, kwargs=None))]
    fn dispatch<'py>(
        slf: &Bound<'py, Self>,
        _mode: &Bound<'py, PyAny>,
        func: &Bound<'py, PyAny>,
        _types: &Bound<'py, PyAny>,
        args: Option<&Bound<'py, PyTuple>>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let this = slf.get();
        let empty;
        let args = match args {
            Some(a) => a,
            None => {
                empty = PyTuple::empty(py);
                &empty
            }
        };
        if this.session().forked() {
            // A forked child (a DataLoader worker) inherits the mode; it records nothing.
            return func.call(args, kwargs);
        }
        let info = this.op_info(py, func)?;
        let tracking = this.tracking.load(Relaxed);
        if this.ops.load(Relaxed) == 0 || !info.scoped {
            let out = func.call(args, kwargs)?;
            if tracking {
                let in_backward = this.in_backward(py)?;
                Self::outputs(slf, &out, info.view, in_backward, None, None)?;
            }
            return Ok(out);
        }
        let session = this.session();
        let in_backward = this.in_backward(py)?;
        let (phase, parent) = if in_backward {
            // Activation checkpointing's recomputation: under the modules running again.
            let parent = if this.local().recompute > 0 {
                None
            } else {
                this.backward_parent(py)?
            };
            let parent = match parent {
                Some(p) => p,
                // A node no module made (the loss's): under the line that called backward().
                None => this.user_parent(py, session.current_stack())?,
            };
            (Phase::Backward, parent)
        } else {
            let stepping = this.steps_open.load(Relaxed) && this.step_forward.load(Relaxed);
            let parent = if this.calls_open(py)? && !stepping {
                // Inside a module call, or an optimizer's own step: under it.
                session.current_stack()
            } else {
                this.user_parent(py, session.current_stack())?
            };
            (Phase::Forward, parent)
        };
        let token = session.enter_stack(info.stack(session, parent, phase));
        let out = func.call(args, kwargs).and_then(|out| {
            // With track() on too, the outputs are recorded while the op's scope is open.
            if tracking {
                Self::outputs(
                    slf,
                    &out,
                    info.view,
                    in_backward,
                    Some(token.stack()),
                    Some(parent),
                )?;
            }
            Ok(out)
        });
        match out {
            Ok(out) => {
                session.exit(token).map_err(crate::err)?;
                Ok(out)
            }
            Err(e) => {
                // An op that raised is not a call of it (no row, no time).
                let _ = session.abort(token);
                Err(e)
            }
        }
    }

    /// Records `t`'s storage once under `category` (see `_Tracker.track_tensor`); `relabel`
    /// moves a storage seen under another category to this one.
    fn track(
        slf: &Bound<'_, Self>,
        t: &Bound<'_, PyAny>,
        category: &str,
        relabel: bool,
    ) -> PyResult<()> {
        Self::track_one(slf, t, category_of(category)?, relabel)
    }

    /// `track(t, category, relabel=True)` of each tensor of `tensors` (an iterable; what is
    /// not a tensor is passed over): the parameters, gradients and optimizer state the hooks
    /// see at every step, in one call.
    fn relabel_all(
        slf: &Bound<'_, Self>,
        tensors: &Bound<'_, PyAny>,
        category: &str,
    ) -> PyResult<()> {
        let category = category_of(category)?;
        let tensor = slf.get().calls.tensor.bind(slf.py()).clone();
        for t in tensors.try_iter()? {
            let t = t?;
            if t.is_instance(&tensor)? {
                Self::track_one(slf, &t, category, true)?;
            }
        }
        Ok(())
    }

    /// A parameter's post-accumulate-grad hook (`Tensor.register_post_accumulate_grad_hook`):
    /// its gradient is relabelled as such.
    fn gradient(slf: &Bound<'_, Self>, p: &Bound<'_, PyAny>) -> PyResult<()> {
        let grad = p.getattr(intern!(slf.py(), "grad"))?;
        if grad.is_none() {
            return Ok(());
        }
        Self::track_one(slf, &grad, GRADIENT, true)
    }

    /// A module's forward begins (any module): counted as a forward, or as a recomputation
    /// inside backward.
    fn forward_begins(&self, py: Python<'_>) -> PyResult<()> {
        if self.in_backward(py)? {
            self.update_local(|l| l.recompute += 1);
        } else {
            self.update_local(|l| l.forward += 1);
            if self.steps_open.load(Relaxed) {
                self.step_forward.store(true, Relaxed);
            }
        }
        Ok(())
    }

    fn forward_ends(&self, py: Python<'_>) -> PyResult<()> {
        if self.in_backward(py)? {
            self.update_local(|l| l.recompute = l.recompute.saturating_sub(1));
        } else {
            self.update_local(|l| l.forward = l.forward.saturating_sub(1));
        }
        Ok(())
    }

    /// A `track()` begins: the step starts afresh.
    fn tracker_begins(&self) {
        *lock(&self.step) = Step::default();
        self.tracking.store(true, Relaxed);
    }

    fn tracker_ends(&self) {
        self.tracking.store(false, Relaxed);
    }

    /// An optimizer's step begins (`track()`): what it makes is temporary unless it keeps it.
    fn optimizer_begins(&self) {
        let mut step = lock(&self.step);
        step.in_optimizer += 1;
        if step.in_optimizer == 1 {
            step.forward_seen = false;
            step.backward_seen = false;
        }
    }

    /// An optimizer's step ended: what comes next belongs to the next one.
    fn optimizer_ends(&self) {
        let mut step = lock(&self.step);
        step.in_optimizer = step.in_optimizer.saturating_sub(1);
        step.forward_seen = false;
        step.backward_seen = false;
    }

    /// The address of the table of functions the native observer calls
    /// (`poolsight_observer_install`), valid while this object lives.
    fn native_table(&self) -> usize {
        self.table_address()
    }

    /// The native observer sees operators and frees (set while it is installed).
    #[getter]
    fn get_native(&self) -> bool {
        self.native.load(Relaxed)
    }
    #[setter]
    fn set_native(&self, v: bool) {
        self.native.store(v, Relaxed)
    }

    /// The module calls and optimizer steps open on this thread (`len(OpenCalls.calls)`),
    /// said by the hooks after each change: the native observer reads it.
    fn calls_now(&self, n: u32) {
        self.update_local(|l| l.calls = n);
    }

    #[getter]
    fn recorded(&self) -> u64 {
        self.recorded.load(Relaxed)
    }

    #[getter]
    fn get_ops(&self) -> u32 {
        self.ops.load(Relaxed)
    }
    #[setter]
    fn set_ops(&self, v: u32) {
        self.ops.store(v, Relaxed)
    }
    #[getter]
    fn get_user_lines(&self) -> u32 {
        self.user_lines.load(Relaxed)
    }
    #[setter]
    fn set_user_lines(&self, v: u32) {
        self.user_lines.store(v, Relaxed)
    }
    #[getter]
    fn get_steps_open(&self) -> bool {
        self.steps_open.load(Relaxed)
    }
    #[setter]
    fn set_steps_open(&self, v: bool) {
        self.steps_open.store(v, Relaxed)
    }
    #[getter]
    fn get_step_forward(&self) -> bool {
        self.step_forward.load(Relaxed)
    }
    #[setter]
    fn set_step_forward(&self, v: bool) {
        self.step_forward.store(v, Relaxed)
    }
    #[getter]
    fn get_backward_ran(&self) -> bool {
        self.backward_ran.load(Relaxed)
    }
    #[setter]
    fn set_backward_ran(&self, v: bool) {
        self.backward_ran.store(v, Relaxed)
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<TorchState>()?;
    m.add("TORCH_CATEGORIES", CATEGORIES.to_vec())?;
    Ok(())
}
