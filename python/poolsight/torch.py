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
import sys
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

from . import PoolsightError, Recording, _native, _recording, active
from ._calls import OpenCalls, raised_in

__all__ = [
    "CATEGORIES",
    "empty_cache",
    "hook",
    "memory_stats",
    "set_limit",
    "track",
    "use_pool",
]

#: The categories :func:`track` gives allocations, as PyTorch's ``MemTracker`` names them.
CATEGORIES = ("parameter", "buffer", "gradient", "activation", "optimizer_state", "temporary")

_KIND_FUNCTION, _KIND_LINK = _native.FUNCTION, _native.LINK
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


# -- scopes: modules as links, operators as functions -----------------------------------------


class _ModuleScopes:
    """Link scopes for modules, one per module call, named by its class: one set per recording,
    shared by :func:`track` and :func:`hook`, so that a module has one pair of hooks however
    many of them ask for it (an allocation is never attributed to the same module twice).

    A call that raises is not a call: PyTorch runs the ``always_call`` post hook from its
    ``except`` block, and the scope is closed as aborted (see ``poolsight._calls``)."""

    def __init__(self, rec: Recording):
        self._native = rec._native
        self._calls = OpenCalls()
        # id(module) -> [users, handles]
        self._modules: dict[int, list] = {}

    @staticmethod
    def of(rec: Recording) -> _ModuleScopes:
        if rec._module_scopes is None:
            rec._module_scopes = _ModuleScopes(rec)
        return rec._module_scopes

    def acquire(self, model: torch.nn.Module) -> list[int]:
        """Hooks every module of ``model`` not hooked yet; returns what to give ``release``."""
        taken = []
        try:
            for module in model.modules():
                key = id(module)
                entry = self._modules.get(key)
                if entry is None:
                    entry = self._modules[key] = [0, self._install(module)]
                entry[0] += 1
                taken.append(key)
        except BaseException:
            self.release(taken)
            raise
        return taken

    def release(self, taken: list[int]) -> None:
        for key in taken:
            entry = self._modules.get(key)
            if entry is None:
                continue
            entry[0] -= 1
            if entry[0] == 0:
                for h in entry[1]:
                    h.remove()
                del self._modules[key]

    def _install(self, module: torch.nn.Module) -> list:
        name = type(module).__name__
        code = getattr(type(module).forward, "__code__", None)
        file = code.co_filename if code else ""
        line = code.co_firstlineno if code else 0
        native, calls = self._native, self._calls

        # PyTorch calls both hooks from Module._call_impl: the frame that makes the call.
        def pre(module: torch.nn.Module, _inputs: Any) -> None:
            calls.enter(native, sys._getframe(1), _KIND_LINK, name, 0, file, line)

        def post(module: torch.nn.Module, _inputs: Any, _outputs: Any) -> None:
            frame = sys._getframe(1)
            calls.exit(native, frame, raised_in(frame))

        handles = [module.register_forward_pre_hook(pre)]
        try:
            handles.append(module.register_forward_hook(post, always_call=True))
        except BaseException:
            handles[0].remove()
            raise
        return handles


class _OpScopes(TorchDispatchMode):
    """Every ATen operator call as a function scope, forward or backward."""

    def __init__(self, rec: Recording):
        super().__init__()
        self._native = rec._native

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        phase = _PHASE_BACKWARD if _in_backward() else _PHASE_FORWARD
        native = self._native
        token = native.enter(_KIND_FUNCTION, _op_name(func), phase, "", 0)
        try:
            out = func(*args, **(kwargs or {}))
            # With track() on too, the outputs are recorded while the op's scope is open,
            # whichever of the two modes was entered first.
            tracker = _trackers.get(id(native))
            if tracker is not None:
                tracker.track_outputs(out)
        except BaseException:
            # An op that raised is not a call of it (no row, no time).
            native.abort(token)
            raise
        native.exit(token)
        return out


def _dispatch_modes() -> list:
    """The dispatch modes active on this thread, outermost first."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return list(_get_current_dispatch_mode_stack())


def _op_name(func: Any) -> str:
    # "aten::addmm": the operator as the profiler and error messages name it.
    schema = getattr(func, "_schema", None)
    return schema.name if schema is not None else str(func)


@contextlib.contextmanager
def hook(
    model: torch.nn.Module,
    recorder: Recording | None = None,
    *,
    links: bool = True,
    functions: bool = True,
) -> Iterator[None]:
    """``with poolsight.torch.hook(model):`` records every module call of ``model`` as a link
    scope named by its class (``poolsight timers --links``), and every operator as a function
    scope named as PyTorch names it (``aten::addmm``), forward or backward
    (``poolsight functions``). Scopes nest: an allocation counts for every open scope."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"hook() needs a torch.nn.Module, not {type(model).__name__}")
    rec = _recording(recorder)
    hooked = rec._hooked_models
    if id(model) in hooked:
        raise PoolsightError(
            f"this {type(model).__name__} is already hooked for {rec.path}: "
            "hook() it once (its scopes would count every call twice)"
        )
    scopes = _ModuleScopes.of(rec)
    taken = scopes.acquire(model) if links else []
    hooked.add(id(model))
    # One dispatch mode for the operators per recording, however many models are hooked.
    ops = functions and not any(
        isinstance(m, _OpScopes) and m._native is rec._native for m in _dispatch_modes()
    )
    try:
        with contextlib.ExitStack() as stack:
            if ops:
                stack.enter_context(_OpScopes(rec))
            yield
    finally:
        hooked.discard(id(model))
        scopes.release(taken)


# -- the observer -------------------------------------------------------------------------------

# Memory event kinds, as the trace format numbers them.
_MALLOC_POST, _ALLOC_POST = _native.MALLOC_POST, _native.ALLOC_POST

# The tracker active for each recording (by its native recorder's id).
_trackers: dict = {}


class _Tracker(TorchDispatchMode):
    """Records tensor storages as allocations, each freed through a weakref finalizer, with a
    category: the approach of PyTorch's ``MemTracker``, written into a trace."""

    def __init__(self, rec: Recording, model: torch.nn.Module | None, optimizers: list):
        super().__init__()
        self._rec = rec
        self._native = rec._native
        self._seen = WeakIdKeyDictionary()
        self._devices: dict[str, int] = {}
        self._category_stacks: dict[tuple[int, str], int] = {}
        self._in_optimizer = False
        self._forward_depth = 0
        self._handles: list = []
        try:
            if model is not None:
                self._watch_model(model)
            for opt in optimizers:
                self._watch_optimizer(opt)
        except BaseException:
            self.remove()
            raise

    # Devices are numbered in the trace as they are first seen.
    def _device(self, t: torch.Tensor) -> int:
        key = str(t.device)
        dev = self._devices.get(key)
        if dev is None:
            dev = len(self._devices)
            self._devices[key] = dev
            self._native.define_device(dev, key, 0, 1)
        return dev

    def _stack(self, category: str) -> int:
        base = self._rec.stack(skip=2)
        key = (base, category)
        stack = self._category_stacks.get(key)
        if stack is None:
            stack = self._native.category_stack(base, category)
            self._category_stacks[key] = stack
        return stack

    def track_tensor(self, t: torch.Tensor, category: str, relabel: bool = False) -> None:
        """Records ``t``'s storage once, under ``category``. With ``relabel``, a storage seen
        before under another category moves to this one (PyTorch's ``MemTracker`` does the
        same for gradients, which are first seen as the output of a backward op): in the trace
        the block is freed from its old category and allocated under the new one at the same
        instant, so live bytes never double."""
        if not isinstance(t, torch.Tensor) or t.is_meta:
            return
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        seen = self._seen.get(st)
        if seen is not None and (not relabel or seen[0] == category):
            return
        nbytes = st.nbytes()
        ptr = st.data_ptr()
        dev = self._device(t)
        if seen is not None:
            seen[1].detach()
            self._native.freed(seen[2], ptr, dev)
        stack = self._stack(category)
        self._native.mem(_MALLOC_POST, nbytes, ptr, stack, dev)
        self._native.mem(_ALLOC_POST, nbytes, ptr, stack, dev)
        finalizer = weakref.finalize(st, self._native.freed, nbytes, ptr, dev)
        self._seen[st] = (category, finalizer, nbytes)

    def category(self) -> str:
        """What an allocation made now is, from where in the step it happens."""
        if self._in_optimizer:
            return "optimizer_state"
        if self._forward_depth > 0 and not _in_backward():
            return "activation"
        return "temporary"

    def track_outputs(self, out: Any) -> None:
        category = self.category()
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.track_tensor(t, category)

    def _watch_model(self, model: torch.nn.Module) -> None:
        for p in model.parameters():
            self.track_tensor(p, "parameter")
            self._handles.append(
                p.register_post_accumulate_grad_hook(
                    lambda p: self.track_tensor(p.grad, "gradient", relabel=True)
                )
            )
        for b in model.buffers():
            self.track_tensor(b, "buffer")
        self._handles.append(model.register_forward_pre_hook(self._enter_forward))
        self._handles.append(model.register_forward_hook(self._exit_forward, always_call=True))

    def _enter_forward(self, *_: Any) -> None:
        self._forward_depth += 1

    def _exit_forward(self, *_: Any) -> None:
        self._forward_depth = max(0, self._forward_depth - 1)

    def _watch_optimizer(self, opt: torch.optim.Optimizer) -> None:
        def pre(*_: Any) -> None:
            self._in_optimizer = True

        def post(*_: Any) -> None:
            self._in_optimizer = False
            for state in opt.state.values():
                for v in state.values():
                    self.track_tensor(v, "optimizer_state", relabel=True)

        self._handles.append(opt.register_step_pre_hook(pre))
        self._handles.append(opt.register_step_post_hook(post))

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.track_outputs(out)
        return out


@contextlib.contextmanager
def track(
    model: torch.nn.Module | None = None,
    optimizer: Any = None,
    recorder: Recording | None = None,
    *,
    scopes: bool = True,
) -> Iterator[_Tracker]:
    """``with poolsight.torch.track(model, optimizer):`` records every tensor storage created
    meanwhile (and ``model``'s parameters, buffers and gradients, and ``optimizer``'s state) as
    an allocation with a category, on any device, keeping PyTorch's own allocator. With
    ``scopes`` (the default) the model's modules are link scopes too, so reports break memory
    down by module and category. Yields the tracker (``tracker.track_tensor(t, category)``
    records tensors made outside, e.g. a batch loaded before)."""
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
    key = id(rec._native)
    if key in _trackers:
        raise PoolsightError("track() is already active for this recording")
    # After the checks: a refused call leaves no hooks on the model, and one that fails while
    # installing them takes back those it installed. Module scopes are shared with hook().
    modules = _ModuleScopes.of(rec)
    taken = modules.acquire(model) if (scopes and model is not None) else []
    try:
        tracker = _Tracker(rec, model, optimizers)
    except BaseException:
        modules.release(taken)
        raise
    _trackers[key] = tracker
    try:
        with tracker:
            yield tracker
    finally:
        del _trackers[key]
        tracker.remove()
        modules.release(taken)


# PyTorch's own memory files (snapshots, profiler traces) as traces: see _torch_files.
from ._torch_files import from_profile, import_file, record_history  # noqa: E402

__all__ += ["from_profile", "import_file", "record_history"]
