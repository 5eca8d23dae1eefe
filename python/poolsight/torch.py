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
import threading
import types
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from . import PoolsightError, Recording, _native, _recording
from ._calls import OpenCalls, raised_in
from ._torch_pool import empty_cache, memory_stats, set_limit, use_pool
from ._torch_sites import _Sites

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
#: as activations. (The native module, which gives them, keeps the one list.)
CATEGORIES: tuple[str, ...] = tuple(_native.TORCH_CATEGORIES)

_KIND_LINK, _KIND_SCOPE = _native.LINK, _native.SCOPE


def _in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1


# -- where a call comes from: the user's line ---------------------------------------------------

#: Folders whose code is a library's, not yours: an allocation's stack names the innermost line of
#: code outside them (the line of your code that called the model, the loss, ``backward()`` or
#: ``optimizer.step()``). The standard library's folders and every ``site-packages`` or
#: ``dist-packages`` folder are always libraries; add a folder here (before ``track()`` or
#: ``hook()``) for a library installed elsewhere, e.g. an editable install of a framework.
LIBRARY_DIRS: list[str] = []


# -- one state per recording, shared by track() and hook() ---------------------------------------

# The number autograd gives the next node this thread makes.
_next_node = torch._C._autograd._get_sequence_nr


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


class _State:
    """What :func:`track` and :func:`hook` share for one recording, in either order and
    nesting: one pair of hooks per module (a module call is one link scope however many of
    them ask for it), one dispatch mode (operators are scoped and their outputs tracked in one
    pass), one set of process-wide module and optimizer hooks, and where calls come from.

    What every operator reads is kept in the native ``hot`` (``_native.TorchState``), whose
    ``dispatch`` is the mode's ``__torch_dispatch__``: the users of operator scopes
    (``hot.ops``) and of the user's line (``hot.user_lines``), where the step is
    (``hot.steps_open``, ``hot.step_forward``: a module's forward ran inside the open optimizer
    step, a closure as Lightning's; ``hot.backward_ran``: a backward ran since the last forward
    pass began), module forwards open per thread, and the storages ``track()`` saw."""

    def __init__(self, rec: Recording):
        self.rec = rec
        self.native = rec._native
        self.calls = OpenCalls()
        self.sites = _Sites(self.native, LIBRARY_DIRS)
        self.local = _Local()
        # id(module) -> [users, handles]
        self.modules: dict[int, list] = {}
        self.hooked: set[int] = set()
        self.mode: _Mode | None = None
        self.mode_users = 0
        # What sees operators while mode_users > 0: "python" (the dispatch mode) or "native"
        # (the native observer, its library in self.observer).
        self.backend: str | None = None
        self.observer: Any = None
        self._profiler_hooks: Any = None
        self.tracker: _Tracker | None = None
        self.globals: list = []
        self.global_users = 0
        # Hooked module calls by the autograd nodes they made (see _native.Spans).
        self.spans = _native.Spans()
        # id(token) of an open optimizer step -> (token, the user's frame that called it).
        self.steps: dict[int, tuple[Any, Any]] = {}
        self.hot = _native.TorchState(
            self.native,
            self,
            self.calls,
            self.spans,
            torch._C,
            torch.Tensor,
            _op_info,
            _tensors,
            rec.stacks == "python",
            rec.max_depth or 0,
        )

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
        spans, hot = self.spans, self.hot
        state = self

        # PyTorch calls both hooks from Module._call_impl: the frame that makes the call.
        def pre(module: torch.nn.Module, inputs: Any) -> None:
            frame = sys._getframe(1)
            calls.settle(native, frame)
            # In backward (a recomputation), the line that called backward().
            parent = state.user_parent(frame)
            calls.open(native, frame, _KIND_LINK, name, 0, file, line, parent)
            hot.calls_now(len(calls.calls))
            if not _in_backward():
                if len(calls.calls) == 1 and hot.backward_ran:
                    # A new forward pass after a backward: the old spans are done with.
                    hot.backward_ran = False
                    spans.clear()
                local.starts.append(_next_node())

        def post(module: torch.nn.Module, inputs: Any, outputs: Any) -> None:
            frame = sys._getframe(1)
            raised = raised_in(frame)
            if not _in_backward() and local.starts:
                # The autograd nodes this call made belong to its stack, for their backward.
                spans.add(local.starts.pop(), _next_node(), native.scopes_stack())
            calls.exit(native, frame, raised)
            hot.calls_now(len(calls.calls))

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
        if not self.hot.user_lines:
            return parent
        calls = self.calls.calls
        skip = None
        if calls:
            if not self.hot.step_forward:
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

    def user_parent_here(self, parent: int) -> int:
        """``user_parent`` of the call being made now (the native path asks)."""
        return self.user_parent(sys._getframe(1), parent)

    # -- the dispatch mode ------------------------------------------------------------------------

    @contextlib.contextmanager
    def mode_if(self, needed: bool, backend: str = "auto", who: str = "track()") -> Iterator[None]:
        """What sees every operator (the native observer or the dispatch mode, see
        :func:`track`'s ``backend``), started by its first user and stopped by its last; later
        users share it."""
        if not needed:
            yield
            return
        if self.mode_users == 0:
            self._start_observer(backend, who)
        elif backend != "auto" and backend != self.backend:
            raise PoolsightError(
                f"{who} asked for backend={backend!r}, but the {self.backend} backend already "
                "observes this recording's operators (one backend per recording at a time)"
            )
        self.mode_users += 1
        try:
            yield
        finally:
            self.mode_users -= 1
            if self.mode_users == 0:
                self._stop_observer()

    def _start_observer(self, backend: str, who: str) -> None:
        wanted = _AUTO if backend == "auto" else backend
        if wanted == "native":
            why = self._start_native()
            if why is None:
                self.backend = "native"
                return
            if backend == "native":
                raise PoolsightError(f"{who} cannot use the native backend: {why}")
            _say_fallback(why)
        mode = _Mode(self)
        mode.__enter__()
        self.mode, self.backend = mode, "python"

    def _start_native(self) -> str | None:
        """Starts the native observer on this thread; None, or why it cannot be."""
        if self.rec.stacks == "python":
            return "stacks='python' needs the Python backend"
        from ._fake import is_fake

        if is_fake():
            return "fake_cuda is active (fake tensors take no memory for PyTorch to report)"
        if torch.autograd.profiler._is_profiler_enabled:
            return "a torch.profiler is running (it holds the thread's one profiler state)"
        from . import _native_observer

        try:
            lib = _native_observer.load()
        except _native_observer.Unavailable as e:
            return str(e)
        status = lib.poolsight_observer_install(self.hot.native_table())
        if status != 0:
            return (
                "another recording's native observer is running"
                if status == 1
                else "the cached library does not match this poolsight"
            )
        self.hot.native = True
        if lib.poolsight_observer_enter() != 0:
            self.hot.native = False
            lib.poolsight_observer_remove()
            return "a torch.profiler is running (it holds the thread's one profiler state)"
        self.observer = lib
        self._profiler_steps_aside(lib)
        return None

    def _profiler_steps_aside(self, lib: Any) -> None:
        """A profiler started while the native observer runs: PyTorch refuses to start one
        over another profiler state, so the observer's steps aside on the profiler's thread
        until it stops (PyTorch calls these two around enabling and disabling it)."""
        from torch.autograd import profiler

        start, stop = profiler._run_on_profiler_start, profiler._run_on_profiler_stop

        def on_start() -> None:
            lib.poolsight_observer_pause()
            start()

        def on_stop() -> None:
            stop()
            lib.poolsight_observer_resume()

        profiler._run_on_profiler_start, profiler._run_on_profiler_stop = on_start, on_stop
        self._profiler_hooks = (on_start, on_stop, start, stop)

    def _profiler_back(self) -> None:
        from torch.autograd import profiler

        hooks, self._profiler_hooks = self._profiler_hooks, None
        if hooks is None:
            return
        on_start, on_stop, start, stop = hooks
        if profiler._run_on_profiler_start is on_start:
            profiler._run_on_profiler_start = start
        if profiler._run_on_profiler_stop is on_stop:
            profiler._run_on_profiler_stop = stop

    def _stop_observer(self) -> None:
        if self.backend == "native":
            lib, self.observer = self.observer, None
            self._profiler_back()
            lib.poolsight_observer_exit()
            lib.poolsight_observer_remove()
            self.hot.native = False
        elif self.mode is not None:
            mode, self.mode = self.mode, None
            mode.__exit__(None, None, None)
        self.backend = None

    # -- process-wide hooks: every module's forward, every optimizer's step ----------------------

    def enter_globals(self) -> None:
        if self.global_users == 0:
            from torch.nn.modules import module as nn_module
            from torch.optim import optimizer as optim

            state = self
            begins, ends = self.hot.forward_begins, self.hot.forward_ends

            def forward_pre(module: Any, inputs: Any) -> None:
                # A forward (or a recomputation inside backward) on this thread.
                begins()
                tracker = state.tracker
                if tracker is not None:
                    tracker.saw_module(module)

            def forward_post(module: Any, inputs: Any, outputs: Any) -> None:
                ends()

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
            self.hot.step_forward = False
        parent = self.user_parent(frame)
        calls.open(native, frame, _KIND_SCOPE, f"{type(opt).__name__}.step", 0, "", 0, parent)
        token = calls.calls[-1][1]
        self.hot.calls_now(len(calls.calls))
        self.steps[id(token)] = (token, self.sites.user_frame(frame))
        self.hot.steps_open = True
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
        self.hot.steps_open = bool(self.steps)
        self.calls.exit(self.native, frame)
        self.hot.calls_now(len(self.calls.calls))


def _tensors(out: Any) -> list:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in out):
        return list(out)
    return [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]


def _op_info(func: Any) -> tuple[str, bool, bool]:
    """What the native path needs of an operator, once: its name (``aten::addmm``, as the
    profiler and error messages name it); whether its outputs alias its inputs (a view makes no
    storage: an output's storage not seen before existed before tracking began, a dataset
    tensor sliced); whether it gets a scope (the profiler's own operators, record_function's
    enter and exit, are not the program's)."""
    schema = getattr(func, "_schema", None)
    name = schema.name if schema is not None else str(func)
    view = schema is not None and any(r.alias_info is not None for r in schema.returns)
    return name, view, not name.startswith("profiler::")


class _Mode(TorchDispatchMode):
    """A recording's one dispatch mode: every ATen operator as a function scope, forward or
    backward (with :func:`hook`), and the storages of its outputs (with :func:`track`). Its
    ``__torch_dispatch__`` is native (``_native.TorchState.dispatch``): every operator comes
    through it."""

    def __init__(self, state: _State):
        super().__init__()
        self._state = state
        # PyTorch calls the mode's bound method: the native one, bound to the mode.
        self.__torch_dispatch__ = types.MethodType(state.hot.dispatch, self)


@contextlib.contextmanager
def hook(
    model: torch.nn.Module,
    recorder: Recording | None = None,
    *,
    links: bool = True,
    functions: bool = True,
    user_line: bool = True,
    backend: str = "auto",
) -> Iterator[None]:
    """``with poolsight.torch.hook(model):`` records every module call of ``model`` as a link
    scope named by its class (``poolsight timers --links``), and every operator as a function
    scope named as PyTorch names it (``aten::addmm``), forward or backward
    (``poolsight functions``). Scopes nest: an allocation counts for every open scope. A
    backward operator nests under the module whose forward made it. ``user_line`` puts the line
    of your code that made the call (see :data:`LIBRARY_DIRS`) above the modules and operators.
    ``backend`` says what sees the operators, as for :func:`track` (which it shares with a
    :func:`track` of the same recording).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"hook() needs a torch.nn.Module, not {type(model).__name__}")
    _check_backend(backend)
    rec = _recording(recorder)
    state = _State.of(rec)
    if id(model) in state.hooked:
        raise PoolsightError(
            f"this {type(model).__name__} is already hooked for {rec.path}: "
            "hook() it once (its scopes would count every call twice)"
        )
    taken = state.acquire_modules(model) if links else []
    state.hooked.add(id(model))
    state.hot.ops += bool(functions)
    state.hot.user_lines += bool(user_line)
    try:
        state.enter_globals()
        try:
            # Operator scopes need the dispatch mode; module scopes alone do not.
            with state.mode_if(functions, backend, "hook()"):
                yield
        finally:
            state.exit_globals()
    finally:
        state.hot.ops -= bool(functions)
        state.hot.user_lines -= bool(user_line)
        state.hooked.discard(id(model))
        state.release_modules(taken)


# -- the observer -------------------------------------------------------------------------------

#: What ``backend`` may be in :func:`track` and :func:`hook`.
_BACKENDS = ("auto", "native", "python")

#: What ``backend="auto"`` picks first.
_AUTO = "native"

_said: set[str] = set()


def _check_backend(backend: Any) -> None:
    if not isinstance(backend, str) or backend not in _BACKENDS:
        raise ValueError(
            f"backend must be one of {', '.join(map(repr, _BACKENDS))}, not {backend!r}"
        )


def _say_fallback(why: str) -> None:
    """The one line saying ``auto`` fell back to the Python backend, and why (once per reason
    in a process)."""
    if why in _said:
        return
    _said.add(why)
    print(f"poolsight: track() observes with the Python backend: {why}", file=sys.stderr)


class _Tracker:
    """Records tensor storages as allocations, each freed through a weakref finalizer, with a
    category: the approach of PyTorch's ``MemTracker``, written into a trace.

    The category of a storage made by an operator comes from where the step is (see
    :data:`CATEGORIES`): inside an optimizer's step, temporary (what the optimizer keeps in its
    state becomes optimizer state when the step ends); in backward, temporary
    (activation when a module's forward runs again there, activation checkpointing's
    recomputation); after the step's first module forward, activation (the loss included);
    before it, input. Parameters, buffers, gradients and optimizer state are relabelled when
    seen as such (a gradient is first a backward operator's output).

    The storages, their categories and the step's state are kept natively (in the recording's
    ``_native.TorchState``, with the operators' outputs); this class says what the hooks saw."""

    def __init__(self, state: _State, model: torch.nn.Module | None, optimizers: list):
        self._state = state
        self._hot = state.hot
        # id(module) -> a weakref to it: the modules whose parameters are known.
        self._modules_seen: dict[int, Any] = {}
        self._handles: list = []
        self._first = self._hot.recorded
        self._last: int | None = None
        self._hot.tracker_begins()
        try:
            if model is not None:
                for module in model.modules():
                    self.saw_module(module)
            for opt in optimizers:
                self._optimizer_tensors(opt)
        except BaseException:
            self._hot.tracker_ends()
            self.remove()
            raise

    @property
    def recorded(self) -> int:
        """Storages this ``track()`` recorded (so far, while it is open)."""
        last = self._hot.recorded if self._last is None else self._last
        return last - self._first

    def track_tensor(self, t: torch.Tensor, category: str, relabel: bool = False) -> None:
        """Records ``t``'s storage once, under ``category``. With ``relabel``, a storage seen
        before under another category moves to this one (PyTorch's ``MemTracker`` does the
        same for gradients, which are first seen as the output of a backward op): in the trace
        the block is freed from its old category and allocated under the new one at the same
        instant, with the same stack, so live bytes never double."""
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"track_tensor() needs a torch.Tensor, not {type(t).__name__}")
        self._hot.track(t, category, bool(relabel))

    # -- what the hooks tell ----------------------------------------------------------------------

    def saw_module(self, module: torch.nn.Module) -> None:
        """A module's forward begins: its own parameters and buffers are known from now on."""
        key = id(module)
        if key in self._modules_seen:
            return
        seen = self._modules_seen
        seen[key] = weakref.ref(module, lambda _r, key=key: seen.pop(key, None))
        params = list(module.parameters(recurse=False))
        self._parameters(params)
        # Each gradient relabelled as it is accumulated (natively).
        gradient = self._hot.gradient
        for p in params:
            if p.requires_grad:
                self._handles.append(p.register_post_accumulate_grad_hook(gradient))
        self._hot.relabel_all(module.buffers(recurse=False), "buffer")

    def _parameters(self, params: list) -> None:
        # Relabelled (natively, in one call each): a parameter and its gradient seen as such.
        self._hot.relabel_all(params, "parameter")
        self._hot.relabel_all([p.grad for p in params], "gradient")

    def optimizer_begins(self, opt: Any) -> None:
        self._hot.optimizer_begins()
        self._parameters([p for group in opt.param_groups for p in group["params"]])

    def optimizer_ends(self, opt: Any) -> None:
        self._hot.optimizer_ends()
        # What the step keeps is optimizer state; the rest it made was temporary.
        self._optimizer_tensors(opt)

    def _optimizer_tensors(self, opt: Any) -> None:
        self._hot.relabel_all(
            [v for state in opt.state.values() for v in state.values()], "optimizer_state"
        )

    def remove(self) -> None:
        if self._last is None:
            self._last = self._hot.recorded
        for h in self._handles:
            h.remove()
        self._handles.clear()


@contextlib.contextmanager
def _joined(
    state: _State, tracker: _Tracker, model: Any, optimizers: list, scopes: bool
) -> Iterator[_Tracker]:
    """A ``track()`` inside one already going on (``fake_cuda``'s): its model and optimizers
    added to what the tracker knows, the model's modules scopes while it lasts."""
    taken = state.acquire_modules(model) if (scopes and model is not None) else []
    try:
        if model is not None:
            for module in model.modules():
                tracker.saw_module(module)
        for opt in optimizers:
            tracker._optimizer_tensors(opt)
        yield tracker
    finally:
        state.release_modules(taken)


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
    backend: str = "auto",
) -> Iterator[_Tracker]:
    """``with poolsight.torch.track(model, optimizer):`` records every tensor storage created
    meanwhile as an allocation with a category (see :data:`CATEGORIES`), on any device, keeping
    PyTorch's own allocator. Parameters, buffers and gradients of every module that runs, and
    the state of every optimizer that steps, are recognised as such (``model`` and
    ``optimizer`` need not be given; given, their tensors are recorded from the start). With
    ``scopes`` (the default) ``model``'s modules are link scopes too, so reports break memory
    down by module and category; ``user_line`` puts the line of your code that made the call
    above them. Yields the tracker (``tracker.track_tensor(t, category)`` records tensors made
    outside, e.g. a dataset loaded before).

    ``backend`` says what sees every operator: ``"native"``, PyTorch's own C++ callbacks
    (``RecordFunction`` for operators; for frees, a deleter of its own in front of each recorded
    storage's), compiled against the installed PyTorch on first use and cached (see
    docs/python.md); ``"python"``, a ``TorchDispatchMode``; ``"auto"`` (the default), the
    native one where it can be had, else the Python one with one line on stderr saying why (no
    compiler, a failed build, a profiler running, ``stacks="python"``). ``"native"`` raises
    where it cannot be had."""
    _check_backend(backend)
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
    if state.tracker is not None and getattr(state.tracker, "_implicit", False):
        # fake_cuda tracks a recording from its start: this joins it, with the model's
        # modules as scopes and its tensors (and the optimizers') known from now on.
        with _joined(state, state.tracker, model, optimizers, scopes) as tracker:
            yield tracker
        return
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
    state.hot.user_lines += bool(user_line)
    try:
        state.enter_globals()
        try:
            with state.mode_if(True, backend, "track()"):
                yield tracker
        finally:
            state.exit_globals()
    finally:
        state.hot.user_lines -= bool(user_line)
        state.tracker = None
        state.hot.tracker_ends()
        tracker.remove()
        state.release_modules(taken)


# PyTorch's own memory files (snapshots, profiler traces) as traces: see _torch_files.
from ._torch_files import from_profile, import_file, record_history  # noqa: E402

__all__ += ["from_profile", "import_file", "record_history"]

# A CUDA run predicted on any machine: see _fake (docs/predict.md).
from ._fake import FakeCudaError, FakeRun, fake_cuda, is_fake  # noqa: E402
from ._fake.gpus import GPUS  # noqa: E402
from .predict import Search, largest_batch  # noqa: E402

__all__ += ["GPUS", "FakeCudaError", "FakeRun", "Search", "fake_cuda", "is_fake", "largest_batch"]
