"""PyTorch integration.

Three ways to record a PyTorch program, from the most exact to the least intrusive:

- :func:`use_pool` makes poolsight's CuPy-style caching pool PyTorch's CUDA allocator: every
  CUDA tensor's memory then goes through the pool and its hooks, so the trace holds the exact
  pool events (used, acquired from the device, released, out of memory).
- :func:`track` keeps PyTorch's own allocator and observes tensor storages on any device (CPU
  included): each new storage is recorded as an allocation with a category (parameter,
  buffer, gradient, activation, optimizer state, temporary) and freed when PyTorch frees it.
- :func:`hook` turns modules into link scopes and operators into function scopes (forward and
  backward), so the ``functions`` and ``timers`` reports have PyTorch's names.
"""

from __future__ import annotations

import contextlib
import os
import sys
import sysconfig
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from . import PoolsightError, Recording, _native, _recording, active
from ._calls import OpenCalls, raised_in

__all__ = [
    "CATEGORIES",
    "LIBRARY_DIRS",
    "empty_cache",
    "hook",
    "memory_stats",
    "set_limit",
    "track",
    "use_pool",
]

#: The categories :func:`track` gives allocations: PyTorch's ``MemTracker``'s, and ``input``
#: (what a step makes before its first module forward: the batch, sliced and moved; and data
#: that existed before tracking began, first seen through a view), which ``MemTracker`` counts
#: as activations.
CATEGORIES = (
    "parameter",
    "buffer",
    "gradient",
    "activation",
    "optimizer_state",
    "temporary",
    "input",
)

_KIND_FUNCTION, _KIND_LINK, _KIND_SCOPE = _native.FUNCTION, _native.LINK, _native.SCOPE
_PHASE_FORWARD, _PHASE_BACKWARD = _native.FORWARD, _native.BACKWARD


def _in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1


# -- the allocator --------------------------------------------------------------------------------


def _cuda_device_index(device: Any) -> int:
    if device is None:
        return 0
    d = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    if d.type != "cuda":
        raise ValueError(f"use_pool serves CUDA devices; {str(d)!r} is not one")
    return d.index or 0


def use_pool(
    device: Any = None,
    *,
    recorder: Recording | None = None,
    stacks: str | None = None,
    max_depth: int | None = None,
    limit: int | None = None,
) -> None:
    """Makes poolsight's pool PyTorch's CUDA allocator (``CUDAPluggableAllocator``).

    Call it before anything touches CUDA (PyTorch allows one allocator change, before its
    first CUDA allocation). With a recording (``recorder``, or the one open with
    :func:`poolsight.record`) every allocation is recorded with its stack at the recording's
    ``stacks`` level, into that recording for as long as the process runs (the pool stays
    PyTorch's allocator; once the recording is finished, its events count as its dropped
    events). ``limit`` caps the bytes the pool holds on ``device``.

    What changes: ``torch.cuda.memory_allocated()`` and friends no longer see the memory (they
    report PyTorch's own allocator); use :func:`memory_stats`. ``torch.cuda.empty_cache()``
    does not reach the pool; use :func:`empty_cache`.
    """
    index = _cuda_device_index(device)
    if not torch.cuda.is_available():
        raise RuntimeError(
            "poolsight.torch.use_pool needs CUDA, and torch.cuda.is_available() is False here; "
            "poolsight.torch.track() records on any device"
        )
    if index >= torch.cuda.device_count():
        raise ValueError(f"cuda:{index} does not exist ({torch.cuda.device_count()} devices)")
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "poolsight.torch.use_pool must run before CUDA is first used in this process "
            "(PyTorch cannot change its allocator afterwards): call it at the start"
        )
    rec = recorder if recorder is not None else active()
    level = stacks or (rec.stacks if rec is not None else "scopes")
    depth = max_depth if max_depth is not None else (rec.max_depth if rec is not None else 0)
    if level not in ("scopes", "python"):
        raise ValueError(f"stacks must be 'scopes' or 'python', not {level!r}")
    _native.torch_allocator_install(
        rec._native if rec is not None else None, level == "python", depth
    )
    allocator = torch.cuda.memory.CUDAPluggableAllocator(
        _native.__file__, "poolsight_torch_malloc", "poolsight_torch_free"
    )
    torch.cuda.memory.change_current_allocator(allocator)
    if limit is not None:
        _native.torch_allocator_set_limit(index, int(limit))


def memory_stats(device: Any = None) -> dict:
    """What ``torch.cuda.memory_stats`` would say for poolsight's pool on ``device``:
    allocated, reserved and cached bytes, the limit, live allocations, failed mallocs.
    Empty before :func:`use_pool` or before the device's first allocation."""
    return _native.torch_allocator_stats(_cuda_device_index(device)) or {}


def empty_cache(device: Any = None) -> int:
    """Returns the pool's cached blocks on ``device`` to CUDA; the bytes released."""
    return _native.torch_allocator_empty_cache(_cuda_device_index(device))


def set_limit(nbytes: int, device: Any = None) -> None:
    """Caps the bytes poolsight's pool may hold on ``device`` (0: no limit)."""
    _native.torch_allocator_set_limit(_cuda_device_index(device), int(nbytes))


# -- where a call comes from: the user's line ---------------------------------------------------

#: Folders whose code is a library's, not yours: an allocation's stack names the innermost line of
#: code outside them (the line of your code that called the model, the loss, ``backward()`` or
#: ``optimizer.step()``). The standard library's folders and every ``site-packages`` or
#: ``dist-packages`` folder are always libraries; add a folder here (before ``track()`` or
#: ``hook()``) for a library installed elsewhere, e.g. an editable install of a framework.
LIBRARY_DIRS: list[str] = []


def _library_roots() -> tuple[str, ...]:
    roots = set(LIBRARY_DIRS)
    paths = sysconfig.get_paths()
    for key in ("stdlib", "platstdlib"):
        if paths.get(key):
            roots.add(paths[key])
    roots.add(os.path.dirname(os.path.abspath(__file__)))  # poolsight itself
    return tuple(os.path.join(os.path.abspath(r), "") for r in roots if r)


_PACKAGE_DIRS = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")


def _short_path(file: str, cwd: str) -> str:
    """``file`` as a person reads it: relative to the working directory when under it, else
    from the package folder on (``torch/nn/modules/linear.py``), else as it is."""
    if file.startswith(cwd):
        return file[len(cwd) :]
    for marker in _PACKAGE_DIRS:
        i = file.rfind(marker)
        if i >= 0:
            return file[i + len(marker) :]
    return file


class _Sites:
    """The user's line of a call, as a frame under a stack: the innermost Python frame whose
    code is not a library's (see :data:`LIBRARY_DIRS`). Each code object is judged once."""

    def __init__(self, native: Any):
        self._native = native
        self._roots = _library_roots()
        self._cwd = os.path.join(os.getcwd(), "")
        # code -> (short file, function) for the user's code, None for a library's.
        self._codes: dict[Any, tuple[str, str] | None] = {}
        self._stacks: dict[tuple[int, Any, int], int] = {}

    def _judge(self, code: Any) -> tuple[str, str] | None:
        file = code.co_filename
        library = (
            file.startswith(self._roots)
            or any(m in file for m in _PACKAGE_DIRS)
            or file.startswith("<frozen")
        )
        verdict = None if library else (_short_path(file, self._cwd), code.co_name)
        self._codes[code] = verdict
        return verdict

    def user_frame(self, frame: Any) -> Any:
        """The innermost frame from ``frame`` out whose code is the user's (None: none is)."""
        codes = self._codes
        while frame is not None:
            code = frame.f_code
            site = codes.get(code, False)
            if site is False:
                site = self._judge(code)
            if site is not None:
                return frame
            frame = frame.f_back
        return None

    def stack(self, parent: int, frame: Any, skip: Any = None) -> int:
        """``parent`` plus the user's line of the call made from ``frame`` (``parent`` alone
        when every frame is a library's, or when the user's frame is ``skip``)."""
        frame = self.user_frame(frame)
        if frame is None or frame is skip:
            return parent
        code = frame.f_code
        key = (parent, code, frame.f_lineno)
        stack = self._stacks.get(key)
        if stack is None:
            site = self._codes[code]
            stack = self._native.frame_under(parent, site[0], frame.f_lineno, site[1])
            self._stacks[key] = stack
        return stack

    def link_site(self, module: torch.nn.Module) -> tuple[str, int]:
        """Where ``module``'s class defines ``forward``: its link frame's file and line."""
        code = getattr(type(module).forward, "__code__", None)
        if code is None:
            return "", 0
        return _short_path(code.co_filename, self._cwd), code.co_firstlineno


# -- one state per recording, shared by track() and hook() ---------------------------------------

# The number autograd gives the next node this thread makes.
_next_node = torch._C._autograd._get_sequence_nr
# -1 outside backward.
_graph_task = torch._C._current_graph_task_id


def _module_name(module: torch.nn.Module, path: str) -> str:
    """A module call's link name: the model's own class (``Net``), else the module's name in
    its parent and its class (``norm1: LayerNorm``, ``0: Linear`` in a Sequential), so that
    siblings of one class stay apart, as in ``MemTracker``'s ``Net.enc.norm1``."""
    cls = type(module).__name__
    if not path:
        return cls
    return f"{path.rsplit('.', 1)[-1]}: {cls}"


class _Local(threading.local):
    def __init__(self) -> None:
        # The first autograd node number of each hooked module call open, innermost last.
        self.starts: list[int] = []
        # Module forwards open on this thread (any module, hooked or not), and those run again
        # inside backward (activation checkpointing's recomputation).
        self.forward = 0
        self.recompute = 0


class _State:
    """What :func:`track` and :func:`hook` share for one recording, in either order and
    nesting: one pair of hooks per module (a module call is one link scope however many of
    them ask for it), one dispatch mode (operators are scoped and their outputs tracked in one
    pass), one set of process-wide module and optimizer hooks, and where calls come from."""

    def __init__(self, rec: Recording):
        self.rec = rec
        self.native = rec._native
        self.calls = OpenCalls()
        self.sites = _Sites(self.native)
        self.local = _Local()
        # id(module) -> [users, handles]
        self.modules: dict[int, list] = {}
        self.hooked: set[int] = set()
        self.mode: _Mode | None = None
        self.mode_users = 0
        self.ops = 0  # hook(functions=True) open
        self.user_lines = 0  # users that want the user's line
        self.tracker: _Tracker | None = None
        self.globals: list = []
        self.global_users = 0
        # Hooked module calls by the autograd nodes they made (see _native.Spans).
        self.spans = _native.Spans()
        self.backward_ran = False
        # id(token) of an open optimizer step -> (token, the user's frame that called it).
        self.steps: dict[int, tuple[Any, Any]] = {}
        # A module's forward ran inside the open optimizer step (a closure, as Lightning's).
        self.step_forward = False

    @staticmethod
    def of(rec: Recording) -> _State:
        if rec._torch is None:
            rec._torch = _State(rec)
        return rec._torch

    # -- module scopes --------------------------------------------------------------------------

    def acquire_modules(self, model: torch.nn.Module) -> list[int]:
        """Hooks every module of ``model`` not hooked yet; returns what to give ``release``."""
        taken = []
        try:
            for path, module in model.named_modules():
                key = id(module)
                entry = self.modules.get(key)
                if entry is None:
                    entry = self.modules[key] = [0, self._install(module, path)]
                entry[0] += 1
                taken.append(key)
        except BaseException:
            self.release_modules(taken)
            raise
        return taken

    def release_modules(self, taken: list[int]) -> None:
        for key in taken:
            entry = self.modules.get(key)
            if entry is None:
                continue
            entry[0] -= 1
            if entry[0] == 0:
                for h in entry[1]:
                    h.remove()
                del self.modules[key]

    def _install(self, module: torch.nn.Module, path: str) -> list:
        name = _module_name(module, path)
        file, line = self.sites.link_site(module)
        native, calls, local = self.native, self.calls, self.local
        spans = self.spans
        state = self

        # PyTorch calls both hooks from Module._call_impl: the frame that makes the call.
        def pre(module: torch.nn.Module, inputs: Any) -> None:
            frame = sys._getframe(1)
            calls.settle(native, frame)
            # In backward (a recomputation), the line that called backward().
            parent = state.user_parent(frame)
            calls.enter(native, frame, _KIND_LINK, name, 0, file, line, parent)
            if not _in_backward():
                if len(calls.calls) == 1 and state.backward_ran:
                    # A new forward pass after a backward: the old spans are done with.
                    state.backward_ran = False
                    spans.clear()
                local.starts.append(_next_node())

        def post(module: torch.nn.Module, inputs: Any, outputs: Any) -> None:
            frame = sys._getframe(1)
            raised = raised_in(frame)
            if not _in_backward() and local.starts:
                # The autograd nodes this call made belong to its stack, for their backward.
                spans.add(local.starts.pop(), _next_node(), native.scopes_stack())
            calls.exit(native, frame, raised)

        handles = [module.register_forward_pre_hook(pre)]
        try:
            handles.append(module.register_forward_hook(post, always_call=True))
        except BaseException:
            handles[0].remove()
            raise
        return handles

    def user_parent(self, frame: Any, parent: int | None = None) -> int | None:
        """The stack a call made from ``frame`` opens under when it should begin with the
        user's line (None: under the open scopes): when no hooked call is open, or only
        optimizer steps, called from another line (Lightning's closure: training_step)."""
        if not self.user_lines:
            return parent
        calls = self.calls.calls
        skip = None
        if calls:
            if not self.step_forward:
                # Inside a module call, or an optimizer's own step: its operators come from
                # the line that called the step.
                return parent
            step = self.steps.get(id(calls[-1][1]))
            if step is None or step[0] is not calls[-1][1]:
                return parent
            skip = step[1]
        base = self.native.scopes_stack() if parent is None else parent
        stack = self.sites.stack(base, frame, skip)
        return parent if stack == base else stack

    def backward_parent(self) -> int | None:
        """The stack of the module call whose forward made the autograd node running now."""
        self.backward_ran = True
        node = torch._C._current_autograd_node()
        if node is None:
            return None
        return self.spans.find(node._sequence_nr())

    # -- the dispatch mode ------------------------------------------------------------------------

    @contextlib.contextmanager
    def mode_if(self, needed: bool) -> Iterator[None]:
        """The recording's dispatch mode, entered by its first user and left by its last."""
        if not needed:
            yield
            return
        if self.mode is None:
            mode = _Mode(self)
            mode.__enter__()
            self.mode = mode
        self.mode_users += 1
        try:
            yield
        finally:
            self.mode_users -= 1
            if self.mode_users == 0 and self.mode is not None:
                mode, self.mode = self.mode, None
                mode.__exit__(None, None, None)

    # -- process-wide hooks: every module's forward, every optimizer's step ----------------------

    def enter_globals(self) -> None:
        if self.global_users == 0:
            from torch.nn.modules import module as nn_module
            from torch.optim import optimizer as optim

            local, state = self.local, self

            def forward_pre(module: Any, inputs: Any) -> None:
                if _in_backward():
                    local.recompute += 1
                else:
                    local.forward += 1
                    if state.steps:
                        state.step_forward = True
                tracker = state.tracker
                if tracker is not None:
                    tracker.saw_module(module)

            def forward_post(module: Any, inputs: Any, outputs: Any) -> None:
                if _in_backward():
                    local.recompute = max(0, local.recompute - 1)
                else:
                    local.forward = max(0, local.forward - 1)

            def step_pre(opt: Any, args: Any, kwargs: Any) -> None:
                state.optimizer_begins(opt, sys._getframe(1))

            def step_post(opt: Any, args: Any, kwargs: Any) -> None:
                state.optimizer_ends(opt, sys._getframe(1))

            handles = []
            try:
                handles.append(nn_module.register_module_forward_pre_hook(forward_pre))
                handles.append(
                    nn_module.register_module_forward_hook(forward_post, always_call=True)
                )
                handles.append(optim.register_optimizer_step_pre_hook(step_pre))
                handles.append(optim.register_optimizer_step_post_hook(step_post))
            except BaseException:
                for h in handles:
                    h.remove()
                raise
            self.globals = handles
        self.global_users += 1

    def exit_globals(self) -> None:
        self.global_users -= 1
        if self.global_users == 0:
            for h in self.globals:
                h.remove()
            self.globals = []

    def optimizer_begins(self, opt: Any, frame: Any) -> None:
        # The step is a scope of its own, under the user's line that called it, so that its
        # operators and state read as the optimizer's.
        native, calls = self.native, self.calls
        calls.settle(native, frame)
        if not calls.calls:
            self.steps.clear()
            self.step_forward = False
        parent = self.user_parent(frame)
        calls.enter(native, frame, _KIND_SCOPE, f"{type(opt).__name__}.step", 0, "", 0, parent)
        token = calls.calls[-1][1]
        self.steps[id(token)] = (token, self.sites.user_frame(frame))
        tracker = self.tracker
        if tracker is not None:
            tracker.optimizer_begins(opt)

    def optimizer_ends(self, opt: Any, frame: Any) -> None:
        tracker = self.tracker
        if tracker is not None:
            tracker.optimizer_ends(opt)
        calls = self.calls.calls
        if calls:
            self.steps.pop(id(calls[-1][1]), None)
        self.calls.exit(self.native, frame)


def _tensors(out: Any) -> list:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in out):
        return list(out)
    return [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]


class _OpInfo:
    __slots__ = ("name", "view", "scoped")

    def __init__(self, func: Any):
        schema = getattr(func, "_schema", None)
        # "aten::addmm": the operator as the profiler and error messages name it.
        self.name = schema.name if schema is not None else str(func)
        # An operator whose outputs alias its inputs (a view) makes no storage: an output's
        # storage not seen before existed before tracking began (a dataset tensor, sliced).
        self.view = schema is not None and any(r.alias_info is not None for r in schema.returns)
        # The profiler's own operators (record_function's enter/exit) are not the program's.
        self.scoped = not self.name.startswith("profiler::")


_OPS: dict[Any, _OpInfo] = {}


class _Mode(TorchDispatchMode):
    """A recording's one dispatch mode: every ATen operator as a function scope, forward or
    backward (with :func:`hook`), and the storages of its outputs (with :func:`track`)."""

    def __init__(self, state: _State):
        super().__init__()
        self._state = state
        self._native = state.native

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # The hot path of recording: every operator comes here. Keep it lean.
        info = _OPS.get(func)
        if info is None:
            info = _OPS[func] = _OpInfo(func)
        state = self._state
        tracker = state.tracker
        if not (state.ops and info.scoped):
            out = func(*args, **(kwargs or {}))
            if tracker is not None:
                tracker.outputs(out, info.view, None, None)
            return out
        native = self._native
        if _graph_task() != -1:
            phase = _PHASE_BACKWARD
            # Activation checkpointing's recomputation: under the modules running again.
            parent = None if state.local.recompute else state.backward_parent()
            if parent is None:
                # A node no module made (the loss's): under the line that called backward().
                parent = state.user_parent(sys._getframe(1), native.scopes_stack())
        else:
            phase = _PHASE_FORWARD
            if state.calls.calls and not (state.steps and state.step_forward):
                # Inside a module call, or an optimizer's own step: under it.
                parent = native.scopes_stack()
            else:
                parent = state.user_parent(sys._getframe(1), native.scopes_stack())
        token = native.enter_under(parent, _KIND_FUNCTION, info.name, phase, "", 0)
        try:
            out = func(*args, **(kwargs or {}))
            # With track() on too, the outputs are recorded while the op's scope is open.
            if tracker is not None:
                tracker.outputs(out, info.view, token.stack, parent)
        except BaseException:
            # An op that raised is not a call of it (no row, no time).
            native.abort(token)
            raise
        native.exit(token)
        return out


@contextlib.contextmanager
def hook(
    model: torch.nn.Module,
    recorder: Recording | None = None,
    *,
    links: bool = True,
    functions: bool = True,
    user_line: bool = True,
) -> Iterator[None]:
    """``with poolsight.torch.hook(model):`` records every module call of ``model`` as a link
    scope named by its class (``poolsight timers --links``), and every operator as a function
    scope named as PyTorch names it (``aten::addmm``), forward or backward
    (``poolsight functions``). Scopes nest: an allocation counts for every open scope. A
    backward operator nests under the module whose forward made it. ``user_line`` puts the line
    of your code that made the call (see :data:`LIBRARY_DIRS`) above the modules and operators.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"hook() needs a torch.nn.Module, not {type(model).__name__}")
    rec = _recording(recorder)
    state = _State.of(rec)
    if id(model) in state.hooked:
        raise PoolsightError(
            f"this {type(model).__name__} is already hooked for {rec.path}: "
            "hook() it once (its scopes would count every call twice)"
        )
    taken = state.acquire_modules(model) if links else []
    state.hooked.add(id(model))
    state.ops += bool(functions)
    state.user_lines += bool(user_line)
    try:
        state.enter_globals()
        try:
            # Operator scopes need the dispatch mode; module scopes alone do not.
            with state.mode_if(functions):
                yield
        finally:
            state.exit_globals()
    finally:
        state.ops -= bool(functions)
        state.user_lines -= bool(user_line)
        state.hooked.discard(id(model))
        state.release_modules(taken)


# -- the observer -------------------------------------------------------------------------------


class _Tracker:
    """Records tensor storages as allocations, each freed through a weakref finalizer, with a
    category: the approach of PyTorch's ``MemTracker``, written into a trace.

    The category of a storage made by an operator comes from where the step is (see
    :data:`CATEGORIES`): inside an optimizer's step, temporary (what the optimizer keeps in its
    state becomes optimizer state when the step ends); in backward, temporary
    (activation when a module's forward runs again there, activation checkpointing's
    recomputation); after the step's first module forward, activation (the loss included);
    before it, input. Parameters, buffers, gradients and optimizer state are relabelled when
    seen as such (a gradient is first a backward operator's output)."""

    def __init__(self, state: _State, model: torch.nn.Module | None, optimizers: list):
        self._state = state
        self._native = state.native
        self._rec = state.rec
        self._local = state.local
        # Storage (its C++ address, unique while it lives) -> [category, bytes, address,
        # device, stack to relabel under, the weakref that reports its free].
        self._seen: dict[int, list] = {}
        # id(module) -> a weakref to it: the modules whose parameters are known.
        self._modules_seen: dict[int, Any] = {}
        self._devices: dict[Any, int] = {}
        self._in_optimizer = 0
        # The step so far: a module forward ran (activations from then on), a backward ran
        # (the next storage outside backward begins a new step).
        self._forward_seen = False
        self._backward_seen = False
        self._handles: list = []
        #: Storages recorded so far.
        self.recorded = 0
        try:
            if model is not None:
                for module in model.modules():
                    self.saw_module(module)
            for opt in optimizers:
                self._optimizer_tensors(opt)
        except BaseException:
            self.remove()
            raise

    # Devices are numbered in the trace as they are first seen.
    def _device(self, t: torch.Tensor) -> int:
        index = t.get_device()  # -1 for CPU memory
        dev = self._devices.get(index)
        if dev is None:
            device = t.device
            dev = len(self._devices)
            self._devices[index] = dev
            kind = _native.DEVICE_CPU if device.type == "cpu" else _native.DEVICE_GPU
            self._native.define_device(dev, str(device), 0, 1, kind, True)
        return dev

    def _base(self) -> int:
        """The stack an allocation made now hangs under (before its category)."""
        state, native = self._state, self._native
        if self._rec.stacks == "python":
            return self._rec.stack(skip=3)
        if torch._C._current_graph_task_id() != -1:
            # Backward, without operator scopes (hook(functions=False)): under the module
            # whose forward made the node.
            if not state.ops:
                parent = state.backward_parent()
                if parent is not None:
                    return parent
            return native.scopes_stack()
        if not state.ops:
            return state.user_parent(sys._getframe(1), native.scopes_stack())
        return native.scopes_stack()

    def track_tensor(self, t: torch.Tensor, category: str, relabel: bool = False) -> None:
        """Records ``t``'s storage once, under ``category``. With ``relabel``, a storage seen
        before under another category moves to this one (PyTorch's ``MemTracker`` does the
        same for gradients, which are first seen as the output of a backward op): in the trace
        the block is freed from its old category and allocated under the new one at the same
        instant, with the same stack, so live bytes never double."""
        if category not in CATEGORIES:
            raise ValueError(f"category must be one of {', '.join(CATEGORIES)}, not {category!r}")
        self._track(t, category, relabel, None)

    def _track(
        self,
        t: torch.Tensor,
        category: str,
        relabel: bool,
        base: int | None,
        outer: int | None = None,
    ) -> None:
        if t.is_meta:
            return
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        key = st._cdata
        seen = self._seen.get(key)
        if seen is None:
            self._new(t, st, key, category, self._base() if base is None else base, outer)
            return
        if not relabel or seen[0] == category:
            return
        # Moved from its old category to this one at the same instant, same stack.
        nbytes, ptr, dev, base = seen[1], seen[2], seen[3], seen[4]
        native = self._native
        native.freed(nbytes, ptr, dev)
        native.observed_under(nbytes, ptr, base, category, dev)
        seen[0] = category

    def _new(
        self, t: torch.Tensor, st: Any, key: int, category: str, base: int, outer: int | None
    ) -> None:
        """Records a storage not seen before (``st`` of ``t``, whose ``_cdata`` is ``key``)
        under ``base`` and its category; ``outer`` is where a relabelling puts it."""
        nbytes = st.nbytes()
        ptr = st.data_ptr()
        dev = self._device(t)
        native = self._native
        native.observed_under(nbytes, ptr, base, category, dev)
        self.recorded += 1
        seen_map = self._seen

        def gone(_ref: Any, key: int = key) -> None:
            entry = seen_map.pop(key, None)
            if entry is not None:
                native.freed(entry[1], entry[2], entry[3])

        seen_map[key] = [
            category,
            nbytes,
            ptr,
            dev,
            base if outer is None else outer,
            weakref.ref(st, gone),
        ]

    def category(self, view: bool) -> str:
        """What a storage an operator makes now is, from where in the step it happens."""
        local = self._local
        if _graph_task() != -1:
            self._backward_seen = True
            self._state.backward_ran = True
            return "activation" if local.recompute else "temporary"
        if self._in_optimizer:
            # A closure (Lightning runs training_step inside optimizer.step): its forward and
            # loss are activations, its backward above; what comes after is the update.
            if local.forward or (self._forward_seen and not self._backward_seen):
                self._forward_seen = True
                return "activation"
            # What the step keeps is relabelled when it ends; the rest was temporary.
            return "temporary"
        if self._backward_seen:
            # The first storage after a backward: a new step (or micro-batch) begins.
            self._backward_seen = False
            self._forward_seen = local.forward > 0
        if view:
            # A view's storage not seen before existed before tracking began: data.
            return "input"
        if self._forward_seen or local.forward:
            self._forward_seen = True
            return "activation"
        return "input"

    def outputs(self, out: Any, view: bool, base: int | None, outer: int | None) -> None:
        """Records the storages of an operator's outputs not seen before, under ``base`` (None:
        where the program is). ``outer`` is the stack the operator's scope opened under (None:
        no operator scope), where a storage relabelled later goes: a relabelling is not the
        operator's allocation."""
        if isinstance(out, torch.Tensor):
            tensors: Any = (out,)
        else:
            tensors = _tensors(out)
        seen = self._seen
        category = None
        for t in tensors:
            try:
                st = t.untyped_storage()
            except (RuntimeError, NotImplementedError):
                continue
            key = st._cdata
            if key in seen or t.is_meta:
                continue
            if category is None:
                category = self.category(view)
                if base is None:
                    base = self._base()
            self._new(t, st, key, category, base, outer)

    # -- what the hooks tell ----------------------------------------------------------------------

    def saw_module(self, module: torch.nn.Module) -> None:
        """A module's forward begins: its own parameters and buffers are known from now on."""
        key = id(module)
        if key in self._modules_seen:
            return
        seen = self._modules_seen
        seen[key] = weakref.ref(module, lambda _r, key=key: seen.pop(key, None))
        for p in module.parameters(recurse=False):
            self._track(p, "parameter", True, None)
            if p.grad is not None:
                self._track(p.grad, "gradient", True, None)
            if p.requires_grad:
                self._handles.append(p.register_post_accumulate_grad_hook(self._gradient))
        for b in module.buffers(recurse=False):
            self._track(b, "buffer", True, None)
        # A module (and its parameters) first seen here: not a forward of this step's data.

    def _gradient(self, p: torch.Tensor) -> None:
        if p.grad is not None:
            self._track(p.grad, "gradient", True, None)

    def optimizer_begins(self, opt: Any) -> None:
        self._in_optimizer += 1
        if self._in_optimizer == 1:
            self._forward_seen = False
            self._backward_seen = False
        for group in opt.param_groups:
            for p in group["params"]:
                self._track(p, "parameter", True, None)
                if p.grad is not None:
                    self._track(p.grad, "gradient", True, None)

    def optimizer_ends(self, opt: Any) -> None:
        self._in_optimizer = max(0, self._in_optimizer - 1)
        self._optimizer_tensors(opt)
        # The step is over: what comes next belongs to the next one.
        self._forward_seen = False
        self._backward_seen = False

    def _optimizer_tensors(self, opt: Any) -> None:
        for state in opt.state.values():
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    self._track(v, "optimizer_state", True, None)

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


def _hooked(rec: Recording, model: torch.nn.Module) -> bool:
    """Whether :func:`hook` is active on ``model`` for ``rec``."""
    return rec._torch is not None and id(model) in rec._torch.hooked


def _tracking(rec: Recording) -> bool:
    """Whether a :func:`track` is active for ``rec``."""
    return rec._torch is not None and rec._torch.tracker is not None


@contextlib.contextmanager
def track(
    model: torch.nn.Module | None = None,
    optimizer: Any = None,
    recorder: Recording | None = None,
    *,
    scopes: bool = True,
    user_line: bool = True,
) -> Iterator[_Tracker]:
    """``with poolsight.torch.track(model, optimizer):`` records every tensor storage created
    meanwhile as an allocation with a category (see :data:`CATEGORIES`), on any device, keeping
    PyTorch's own allocator. Parameters, buffers and gradients of every module that runs, and
    the state of every optimizer that steps, are recognised as such (``model`` and
    ``optimizer`` need not be given; given, their tensors are recorded from the start). With
    ``scopes`` (the default) ``model``'s modules are link scopes too, so reports break memory
    down by module and category; ``user_line`` puts the line of your code that made the call
    above them. Yields the tracker (``tracker.track_tensor(t, category)`` records tensors made
    outside, e.g. a dataset loaded before)."""
    rec = _recording(recorder)
    if model is not None and not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module or None, not {type(model).__name__}")
    optimizers = (
        []
        if optimizer is None
        else (list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer])
    )
    for opt in optimizers:
        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError(
                "optimizer must be a torch.optim.Optimizer, a list of them, or None, "
                f"not {type(opt).__name__}"
            )
    state = _State.of(rec)
    if state.tracker is not None:
        raise PoolsightError("track() is already active for this recording")
    # After the checks: a refused call leaves no hooks on the model, and one that fails while
    # installing them takes back those it installed. Module scopes are shared with hook().
    taken = state.acquire_modules(model) if (scopes and model is not None) else []
    try:
        tracker = _Tracker(state, model, optimizers)
    except BaseException:
        state.release_modules(taken)
        raise
    state.tracker = tracker
    state.user_lines += bool(user_line)
    try:
        state.enter_globals()
        try:
            with state.mode_if(True):
                yield tracker
        finally:
            state.exit_globals()
    finally:
        state.user_lines -= bool(user_line)
        state.tracker = None
        tracker.remove()
        state.release_modules(taken)


# PyTorch's own memory files (snapshots, profiler traces) as traces: see _torch_files.
from ._torch_files import from_profile, import_file, record_history  # noqa: E402

__all__ += ["from_profile", "import_file", "record_history"]
