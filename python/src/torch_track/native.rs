//! The native observer's side of `TorchState`: the functions `poolsight._native_observer`
//! (C++, compiled against the installed PyTorch) calls for every operator the dispatch mode
//! would see and every free its deleters tell, without the interpreter. The rules are
//! `dispatch`'s and `outputs`' (the parent module's); what differs is where the facts come
//! from: the operator's name and whether it is a view from PyTorch's dispatcher, whether it
//! runs in backward and the autograd node running from autograd's thread-local state, the
//! module calls open from `calls_now` (the Python hooks say it at each call). Python is called
//! only for what it alone knows, as `dispatch` does: the user's line of an operator called
//! outside every module call.

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

use pyo3::intern;
use pyo3::prelude::*;

use poolsight_recorder::{Phase, ScopeToken};

use super::{lock, Map, OpInfo, Seen, TorchState};

/// The table's layout, as `observer.cpp` reads it (`Table`).
pub(super) const TABLE_VERSION: u32 = 4;

#[repr(C)]
pub(super) struct NativeTable {
    version: u32,
    /// The `TorchState` (its address; it outlives the table's use: see `native_table`).
    ctx: usize,
    op_begin: extern "C" fn(*const c_void, *const c_char, u32, u32, i64) -> u32,
    op_end: extern "C" fn(*const c_void, u32, *mut NativeOutput, usize, u32),
    freed: extern "C" fn(*const c_void, u64),
    unwatched: extern "C" fn(*const c_void, u64, u64),
}

/// One output storage of an operator (`Output` in `observer.cpp`).
#[repr(C)]
pub(super) struct NativeOutput {
    /// The `StorageImpl`'s address: the key `UntypedStorage._cdata` gives on the Python side.
    key: u64,
    ptr: u64,
    bytes: u64,
    device_type: i32,
    device_index: i32,
    /// Set here (1) for a storage recorded: the observer then puts its deleter in front of the
    /// allocator's, which tells the free (`freed`, on whichever thread lets the storage go).
    recorded: u32,
    /// Set here for a storage recorded: the number the observer gives back to `unwatched`
    /// when the storage is gone, if it watches it (when it cannot put its deleter in front).
    watch: u64,
}

/// c10's `DeviceType::CPU` and `CUDA`.
const CPU: i32 = 0;
const CUDA: i32 = 1;

/// An operator open on this thread, between `op_begin` and `op_end`.
struct OpenOp {
    /// Its scope (None: operator scopes are off, or not this operator's).
    token: Option<ScopeToken>,
    /// The stack its scope opened under, where a storage relabelled later goes.
    parent: Option<u32>,
    in_backward: bool,
    node: i64,
    view: bool,
}

thread_local! {
    static OPEN: RefCell<Vec<OpenOp>> = const { RefCell::new(Vec::new()) };
}

impl TorchState {
    /// The table for `observer.cpp`, made once; its address stays valid as long as this
    /// object lives (the Python `_State` removes the observer before letting it go).
    pub(super) fn table_address(&self) -> usize {
        let mut table = lock(&self.table);
        let t = table.get_or_insert_with(|| {
            Box::new(NativeTable {
                version: TABLE_VERSION,
                ctx: self as *const TorchState as usize,
                op_begin,
                op_end,
                freed,
                unwatched,
            })
        });
        &**t as *const NativeTable as usize
    }

    fn native_op(&self, name: *const c_char, view: bool) -> Arc<OpInfo> {
        let key = name as usize;
        if let Some(info) = lock(&self.native_ops).get(&key) {
            return info.clone();
        }
        // SAFETY: the name of a dispatcher operator, a C string that lives as long as
        // PyTorch's dispatcher.
        let name = unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned();
        let scoped = !name.starts_with("profiler::");
        let info = Arc::new(OpInfo {
            name,
            view,
            scoped,
            _func: None,
            stacks: Mutex::new(Map::default()),
        });
        lock(&self.native_ops).insert(key, info.clone());
        info
    }

    /// `user_parent` without a Python call where none is needed.
    fn native_user_parent(&self, parent: u32) -> u32 {
        if self.user_lines.load(Relaxed) == 0 {
            return parent;
        }
        if self.local().calls > 0 {
            if !self.step_forward.load(Relaxed) {
                return parent;
            }
            return Python::attach(|py| {
                self.state
                    .bind(py)
                    .call_method1(intern!(py, "user_parent_here"), (parent,))?
                    .extract::<u32>()
            })
            .unwrap_or(parent);
        }
        Python::attach(|py| self.user_line(py, parent)).unwrap_or(parent)
    }

    /// `backward_parent`, the node's sequence number given.
    fn native_backward_parent(&self, node: i64) -> Option<u32> {
        self.backward_ran.store(true, Relaxed);
        if node < 0 {
            return None;
        }
        self.spans.get().find(node as u64)
    }

    /// `base` of the native path.
    fn native_base(&self, in_backward: bool, node: i64) -> u32 {
        let session = self.session();
        let ops = self.ops.load(Relaxed) > 0;
        if in_backward {
            if !ops {
                if let Some(parent) = self.native_backward_parent(node) {
                    return parent;
                }
            }
            return session.current_stack();
        }
        if !ops {
            return self.native_user_parent(session.current_stack());
        }
        session.current_stack()
    }

    /// The trace's device of c10's (type, index), as `device` numbers them.
    fn native_device(&self, device_type: i32, index: i32) -> u32 {
        let key = if device_type == CPU { -1 } else { index as i64 };
        if let Some(&d) = lock(&self.storages).devices.get(&key) {
            return d;
        }
        let name = match device_type {
            CPU => "cpu".to_string(),
            CUDA => "cuda".to_string(),
            12 => "xpu".to_string(),
            13 => "mps".to_string(),
            t => format!("device{t}"),
        };
        self.trace_device(key, &name, u32::try_from(index).ok())
    }

    /// Records a storage not seen before, its free to come from the allocator's report, from
    /// `watch` (nonzero: the observer watches it) or from `weakref`'s callback.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn record_native(
        &self,
        key: u64,
        ptr: u64,
        bytes: u64,
        device: u32,
        category: u8,
        (base, outer): (u32, u32),
        watch: u64,
        weakref: Option<(usize, Py<PyAny>)>,
    ) {
        // A block at this address recorded before, whose free nothing told (not expected:
        // every block is watched or told by a deleter), is gone now.
        let stale = {
            let mut storages = lock(&self.storages);
            match storages.by_ptr.insert(ptr, key) {
                Some(old) if old != key => storages.seen.remove(&old),
                _ => None,
            }
        };
        if let Some(old) = stale {
            self.session().observed_free(old.device, old.ptr, old.bytes);
        }
        self.observed(bytes, ptr, base, category, device);
        self.recorded.fetch_add(1, Relaxed);
        let mut storages = lock(&self.storages);
        let weakref = weakref.map(|(address, w)| {
            storages.by_weakref.insert(address, key);
            w
        });
        storages.seen.insert(
            key,
            Seen {
                category,
                bytes,
                ptr,
                device,
                base: outer,
                watch,
                _weakref: weakref,
            },
        );
    }

    fn native_outputs(&self, outputs: &mut [NativeOutput], op: &OpenOp, base: Option<u32>) {
        let mut category = None;
        let mut base = base;
        for out in outputs {
            if out.ptr == 0 || self.is_seen(out.key) {
                continue;
            }
            let cat = *category.get_or_insert_with(|| self.category(op.view, op.in_backward));
            let b = *base.get_or_insert_with(|| self.native_base(op.in_backward, op.node));
            let device = self.native_device(out.device_type, out.device_index);
            out.watch = self.watches.fetch_add(1, Relaxed) + 1;
            out.recorded = 1;
            self.record_native(
                out.key,
                out.ptr,
                out.bytes,
                device,
                cat,
                (b, op.parent.unwrap_or(b)),
                out.watch,
                None,
            );
        }
    }

    fn native_begin(&self, name: *const c_char, view: bool, in_backward: bool, node: i64) -> u32 {
        let info = self.native_op(name, view);
        let tracking = self.tracking.load(Relaxed);
        let ops = self.ops.load(Relaxed) > 0;
        let scoped = ops && info.scoped;
        if !tracking && !scoped {
            return 0;
        }
        let mut op = OpenOp {
            token: None,
            parent: None,
            in_backward,
            node,
            view,
        };
        if scoped {
            let session = self.session();
            let (phase, parent) = if in_backward {
                // Activation checkpointing's recomputation: under the modules running again.
                let parent = if self.local().recompute > 0 {
                    None
                } else {
                    self.native_backward_parent(node)
                };
                let parent =
                    parent.unwrap_or_else(|| self.native_user_parent(session.current_stack()));
                (Phase::Backward, parent)
            } else {
                let stepping = self.steps_open.load(Relaxed) && self.step_forward.load(Relaxed);
                let parent = if self.local().calls > 0 && !stepping {
                    session.current_stack()
                } else {
                    self.native_user_parent(session.current_stack())
                };
                (Phase::Forward, parent)
            };
            op.token = Some(session.enter_stack(info.stack(session, parent, phase)));
            op.parent = Some(parent);
        }
        OPEN.with(|open| {
            let mut open = open.borrow_mut();
            open.push(op);
            open.len() as u32
        })
    }

    fn native_end(&self, handle: u32, outputs: &mut [NativeOutput], raised: bool) {
        let Some(op) = OPEN.with(|open| {
            let mut open = open.borrow_mut();
            let at = handle as usize;
            if at == 0 || at > open.len() {
                return None;
            }
            // Operators opened after this one and never ended (not expected): aborted.
            while open.len() > at {
                if let Some(token) = open.pop().and_then(|o| o.token) {
                    let _ = self.session().abort(token);
                }
            }
            open.pop()
        }) else {
            return;
        };
        if raised {
            // An op that raised is not a call of it (no row, no time).
            if let Some(token) = op.token {
                let _ = self.session().abort(token);
            }
            return;
        }
        if self.tracking.load(Relaxed) {
            self.native_outputs(outputs, &op, op.token.as_ref().map(ScopeToken::stack));
        }
        if let Some(token) = op.token {
            let _ = self.session().exit(token);
        }
    }

    /// A free told by the observer's deleter.
    fn native_freed(&self, ptr: u64) {
        let entry = {
            let mut storages = lock(&self.storages);
            match storages.by_ptr.remove(&ptr) {
                Some(key) if storages.seen.get(&key).is_some_and(|s| s.ptr == ptr) => {
                    storages.seen.remove(&key)
                }
                _ => None,
            }
        };
        if let Some(seen) = entry {
            self.session()
                .observed_free(seen.device, seen.ptr, seen.bytes);
        }
    }

    /// A storage watched since `native_outputs` asked (`watch`) is gone, unless the
    /// allocator's report or a weakref told its free first.
    fn native_unwatched(&self, key: u64, watch: u64) {
        let entry = {
            let mut storages = lock(&self.storages);
            if storages.seen.get(&key).is_some_and(|s| s.watch == watch) {
                storages.forget(key)
            } else {
                None
            }
        };
        if let Some(seen) = entry {
            self.session()
                .observed_free(seen.device, seen.ptr, seen.bytes);
        }
    }
}

/// The `TorchState` a table was made for.
///
/// SAFETY (callers): `ctx` is the `ctx` of a table made by `table_address`, whose object the
/// Python side keeps alive while the observer can call.
unsafe fn state<'a>(ctx: *const c_void) -> &'a TorchState {
    unsafe { &*(ctx as *const TorchState) }
}

extern "C" fn op_begin(
    ctx: *const c_void,
    name: *const c_char,
    view: u32,
    in_backward: u32,
    node: i64,
) -> u32 {
    // SAFETY: see `state`.
    let this = unsafe { state(ctx) };
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        this.native_begin(name, view != 0, in_backward != 0, node)
    }))
    .unwrap_or(0)
}

extern "C" fn op_end(
    ctx: *const c_void,
    handle: u32,
    outputs: *mut NativeOutput,
    n: usize,
    raised: u32,
) {
    // SAFETY: see `state`; `outputs` holds `n` outputs, this call's alone, for its length.
    let this = unsafe { state(ctx) };
    let outputs = if n == 0 || outputs.is_null() {
        &mut [][..]
    } else {
        unsafe { std::slice::from_raw_parts_mut(outputs, n) }
    };
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        this.native_end(handle, outputs, raised != 0)
    }));
}

extern "C" fn freed(ctx: *const c_void, ptr: u64) {
    // SAFETY: see `state`.
    let this = unsafe { state(ctx) };
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| this.native_freed(ptr)));
}

extern "C" fn unwatched(ctx: *const c_void, key: u64, watch: u64) {
    // SAFETY: see `state`.
    let this = unsafe { state(ctx) };
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        this.native_unwatched(key, watch)
    }));
}
