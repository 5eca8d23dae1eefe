"""``poolsight.torch.fake_cuda``: a CUDA training step run on any machine, GPU or not, with
fake CUDA tensors (no memory, no compute), its device memory predicted by the model of
PyTorch's caching allocator. See docs/predict.md.

The parts: ``router`` (which operators are fake, what the allocator is asked for them, the
cuBLAS workspaces), ``cuda_api`` (``torch.cuda`` answered from the prediction), ``engine``
(the one step of the autograd engine that needs a real GPU, got past), ``attention`` (the
attention kernel a GPU would pick), ``gpus`` (the GPUs known).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from .. import _native, active
from . import attention, cuda_api, engine, gpus
from .router import FakeCudaError, Router, user_line

__all__ = ["FakeCudaError", "FakeRun", "fake_cuda", "is_fake", "parse_bytes"]

_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

#: The fake run going on (one at a time), else None.
_current: FakeRun | None = None


def is_fake() -> bool:
    """Whether a fake CUDA run (:func:`fake_cuda`) is going on: a script can skip what needs
    real values (logging ``loss.item()``) with ``if not poolsight.torch.is_fake():``."""
    return _current is not None


def parse_bytes(value: Any, what: str = "capacity") -> int:
    """Bytes from an int or a size with a unit (``"40GiB"``, ``"39.5 GB"``, ``"512MiB"``)."""
    if isinstance(value, bool):
        raise TypeError(f"{what} is bytes (an int) or a size like '40GiB', not {value!r}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str):
        import re

        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?B|B)?\s*", value, re.IGNORECASE)
        if m is None:
            raise ValueError(f"{what} {value!r} is not a size (say 40GiB, 39.5GB or 42949672960)")
        units = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
        units.update({"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40})
        n = int(float(m.group(1)) * units[(m.group(2) or "").lower()])
    else:
        raise TypeError(f"{what} is bytes (an int) or a size like '40GiB', not {value!r}")
    if n <= 0:
        raise ValueError(f"{what} must be more than 0 bytes, not {value!r}")
    return n


def _gpu_for(gpu: Any, capacity: Any, context_bytes: Any) -> gpus.Gpu:
    spec = gpus.lookup(gpu) if gpu is not None else gpus.GPUS[gpus.DEFAULT]
    if context_bytes is not None:
        import dataclasses

        n = 0 if context_bytes == 0 else parse_bytes(context_bytes, "context_bytes")
        spec = dataclasses.replace(spec, context_bytes=n)
    if capacity is not None:
        spec = gpus.custom(parse_bytes(capacity), spec)
        if gpu is not None:
            import dataclasses

            spec = dataclasses.replace(spec, key=gpus.lookup(gpu).key)
    return spec


def _mib(n: int) -> str:
    return f"{n / 2**20:,.2f} MiB" if n < 2**30 else f"{n / 2**30:,.2f} GiB"


_MODE_FRAMES = tuple(
    os.path.join("torch", *p)
    for p in (("_ops.py",), ("_compile.py",), ("_dynamo", "eval_frame.py"))
) + (os.path.join("torch", "utils", "_python_dispatch.py"),)


class FakeRun:
    """One fake CUDA run: its GPU, the allocator model serving it, what failed first."""

    def __init__(
        self, gpu: gpus.Gpu, settings: str, oom: str, items: str, cpu_modules: str = "fake"
    ):
        self.gpu = gpu
        self.settings = settings
        self.oom = oom
        self.items = items
        self.cpu_modules = cpu_modules
        self.memory = _native.FakeGpu(settings, gpu.capacity)
        self.memory.set_prediction(
            gpu.key,
            gpu.model,
            gpu.total_memory,
            gpu.context_bytes,
            gpu.compute_capability,
            f"fake_cuda, torch {torch.__version__}",
        )
        self.history_stacks = False
        #: The first request the allocator could not serve (``oom="continue"``), else None:
        #: ``requested_bytes``, ``reserved_bytes``, ``allocated_bytes``, ``line``.
        self.first_failure: dict | None = None
        self.router = Router(self)
        self.api = cuda_api.Api(self)
        self._tracker: Any = None
        self.started = time.monotonic()

    # -- figures ---------------------------------------------------------------------------

    @property
    def peak_allocated_bytes(self) -> int:
        """The most bytes of blocks handed out at once (``max_memory_allocated``)."""
        return int(self.memory.stats()["allocated_bytes.all.peak"])

    @property
    def peak_reserved_bytes(self) -> int:
        """The most bytes held from the device at once (``max_memory_reserved``)."""
        return int(self.memory.stats()["reserved_bytes.all.peak"])

    @property
    def fits(self) -> bool:
        """Whether every request was served within the GPU's capacity."""
        return self.first_failure is None

    def __repr__(self) -> str:
        return (
            f"<fake_cuda run on {self.gpu.key}: peak allocated {_mib(self.peak_allocated_bytes)}, "
            f"reserved {_mib(self.peak_reserved_bytes)}, "
            f"{'fits' if self.fits else 'does not fit'} in {_mib(self.gpu.capacity)}>"
        )

    # -- what the router asks ---------------------------------------------------------------

    def frames(self) -> list[dict]:
        """The Python frames of the program here, innermost first, as a snapshot lists them."""
        out = []
        f = sys._getframe(1)
        while f is not None:
            name = f.f_code.co_filename
            if not name.startswith(_OWN_DIR):
                out.append({"filename": name, "line": f.f_lineno, "name": f.f_code.co_name})
            f = f.f_back
        # The dispatch modes' own way in (PyTorch's operator call into a Python mode, under
        # dynamo's guard): frames a GPU run's snapshot does not have.
        while out and out[0]["filename"].endswith(_MODE_FRAMES):
            out.pop(0)
        return out

    def out_of_memory(self, args: tuple, storage: Any, frames: Any) -> None:
        """A request the model could not serve: PyTorch's error (``oom="raise"``), or noted as
        the first failure and served past the capacity (``oom="continue"``)."""
        requested, _size, alloc_size, reserved, allocated = args
        if self.oom == "raise":
            total = self.gpu.total_memory
            free = max(self.gpu.capacity - reserved, 0)
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {_mib(alloc_size)}. GPU 0 has a total "
                f"capacity of {_mib(total)} of which {_mib(free)} is free. Of the allocated "
                f"memory {_mib(allocated)} is allocated by PyTorch, and "
                f"{_mib(reserved - allocated)} is reserved by PyTorch but unallocated. "
                f"(predicted by poolsight's fake_cuda for {self.gpu.key}, at {user_line()})"
            )
        if self.first_failure is None:
            self.first_failure = {
                "requested_bytes": requested,
                "reserved_bytes": reserved,
                "allocated_bytes": allocated,
                "line": user_line(),
            }
        self.memory.capacity = None
        self.memory.register(
            storage, storage._cdata, storage.nbytes(), cuda_api.current_stream_id(), frames
        )

    def tracked(self, t: torch.Tensor, category: str) -> None:
        """Records ``t`` under ``category`` when a recording tracks this run."""
        if self._tracker is not None:
            self._tracker.track_tensor(t, category)

    def snapshot(self) -> dict:
        """What ``torch.cuda.memory._snapshot()`` would return: the segments held, the
        history kept (``_record_memory_history``), the allocator's settings."""
        history = list(self.memory.history())
        frames_at: dict[int, Any] = {}
        for e in history:
            if e["action"] == "alloc":
                frames_at[e["addr"]] = e["frames"]
            elif e["action"] == "free_completed":
                frames_at.pop(e["addr"], None)
        segments = list(self.memory.segments())
        for seg in segments:
            for b in seg["blocks"]:
                if b["state"] != "inactive":
                    b["frames"] = frames_at.get(b["address"], [])
        conf = self.settings
        return {
            "segments": segments,
            "device_traces": [history],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": conf},
            "external_annotations": [],
        }


def _settings(settings: Any) -> str:
    if settings is None:
        return os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if not isinstance(settings, str):
        raise TypeError(f"settings is a PYTORCH_CUDA_ALLOC_CONF string, not {settings!r}")
    return settings


def _check_order() -> None:
    """``fake_cuda`` must be under every other dispatch mode (it is what makes tensors
    fake): entered first, before ``track()`` or ``hook()``."""
    rec = active()
    state = getattr(rec, "_torch", None) if rec is not None else None
    if state is not None and state.backend is not None:
        raise FakeCudaError(
            "fake_cuda() must begin before poolsight.torch.track() and hook(): enter it first "
            "(`with poolsight.record(path), poolsight.torch.fake_cuda(): ...`)"
        )
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    if _get_current_dispatch_mode_stack():
        raise FakeCudaError(
            "fake_cuda() must begin before any other TorchDispatchMode (it makes the tensors "
            "that mode sees): enter it first"
        )


def _no_gpu_context() -> None:
    """Older fake modes (torch 2.10) make one real CUDA tensor the first time a fake one is
    made on a device, when ``torch.cuda.is_available()``, which says True while ``fake_cuda``
    runs (and for the whole session under ``pytest --poolsight-fake-cuda``): asked once per
    device, with the real answer, before it does (the answer is cached), it makes none."""
    from torch._subclasses import fake_tensor

    init = getattr(fake_tensor, "init_gpu_context", None)
    count = getattr(torch._C, "_cuda_getDeviceCount", None)
    if init is None or (count is not None and count() > 0):
        return
    said = torch.cuda.is_available
    torch.cuda.is_available = lambda: False
    try:
        for name in ("cuda", "cuda:0"):
            init(torch.device(name))
    except Exception:  # noqa: BLE001 - a torch whose helper differs: nothing to prepare
        pass
    finally:
        torch.cuda.is_available = said


@contextlib.contextmanager
def _foreach_takes_fake_tensors() -> Iterator[None]:
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.optim import optimizer
    from torch.utils import _foreach_utils

    lists = [getattr(m, "_foreach_supported_types", None) for m in (optimizer, _foreach_utils)]
    lists = [x for x in lists if isinstance(x, list) and FakeTensor not in x]
    for x in lists:
        x.append(FakeTensor)
    try:
        yield
    finally:
        for x in lists:
            if FakeTensor in x:
                x.remove(FakeTensor)


@contextlib.contextmanager
def fake_cuda(
    gpu: str | None = None,
    capacity: int | str | None = None,
    *,
    settings: str | None = None,
    oom: str = "raise",
    items: str = "error",
    context_bytes: int | str | None = None,
    cpu_modules: str = "fake",
) -> Iterator[FakeRun]:
    """Runs the code inside on fake CUDA tensors: no GPU is needed, no memory is taken, nothing
    is computed, and the CUDA caching allocator's behaviour is predicted for ``gpu`` (a name of
    :data:`poolsight.torch.GPUS`, default ``H100-80GB``) or for ``capacity`` usable bytes.

    - ``settings``: the allocator's ``PYTORCH_CUDA_ALLOC_CONF`` (default: the environment's).
    - ``oom``: ``"raise"`` (a request that does not fit raises ``torch.OutOfMemoryError``, as
      on the GPU) or ``"continue"`` (it is noted as ``run.first_failure`` and served anyway,
      so the whole run's needs are known).
    - ``items``: what a value asked of a fake tensor by your code is (``loss.item()``):
      ``"error"`` (a :class:`FakeCudaError` naming the line) or ``"zero"``.
    - ``context_bytes``: the CUDA context's bytes outside the allocator (default: the table's
      estimate for the GPU).
    - ``cpu_modules``: ``"fake"`` (a module built on the CPU inside the run has fake
      parameters and buffers: its initialisers compute nothing and take no host memory, and
      ``.to("cuda")`` makes them fake CUDA tensors as on a GPU) or ``"real"`` (built and
      initialised for real, as without ``fake_cuda``: for a model that stays on the CPU and
      must compute there).

    Yields the :class:`FakeRun` (``peak_allocated_bytes``, ``peak_reserved_bytes``, ``fits``).
    Inside a ``poolsight.record``, the run is recorded as ``track()`` records (the trace's
    device says it is a prediction, and for which GPU).
    """
    global _current
    if oom not in ("raise", "continue"):
        raise ValueError(f"oom must be 'raise' or 'continue', not {oom!r}")
    if items not in ("error", "zero"):
        raise ValueError(f"items must be 'error' or 'zero', not {items!r}")
    if cpu_modules not in ("fake", "real"):
        raise ValueError(f"cpu_modules must be 'fake' or 'real', not {cpu_modules!r}")
    spec = _gpu_for(gpu, capacity, context_bytes)
    conf = _settings(settings)
    if _current is not None:
        raise FakeCudaError("fake_cuda() is already active (one fake run at a time)")
    _check_order()
    run = FakeRun(spec, conf, oom, items, cpu_modules)
    patch = None
    if engine.needed():
        try:
            patch = engine.patch()
        except engine.Unavailable as e:
            raise FakeCudaError(
                f"fake_cuda cannot run a backward pass with this PyTorch ({torch.__version__}) on "
                f"a machine without a GPU: {e}"
            ) from None
    with contextlib.ExitStack() as stack:
        # PyTorch warns when its own code reads a fake storage's (null) data pointer (an RNN's
        # weights checked for being contiguous in memory): nothing is wrong with the program.
        stack.enter_context(warnings.catch_warnings())
        warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
        if patch is not None:
            patch.apply()
            stack.callback(patch.undo)
        # The fake CUDA device guard PyTorch's fake mode uses (streams and events that do
        # nothing), and `torch.tensor(..., device="cuda")` made on the CPU first, then moved.
        torch._C._ensureCUDADeviceGuardSet()
        lift = torch._C._only_lift_cpu_tensors()
        torch._C._set_only_lift_cpu_tensors(True)
        stack.callback(torch._C._set_only_lift_cpu_tensors, lift)
        stack.enter_context(torch.autograd.set_multithreading_enabled(False))
        # `model.cuda()` keeps the Parameter objects (an optimizer made before holds them), as
        # on a GPU, where the parameters' data is set in place.
        swap = torch.__future__.get_swap_module_params_on_conversion()
        torch.__future__.set_swap_module_params_on_conversion(True)
        stack.callback(torch.__future__.set_swap_module_params_on_conversion, swap)
        _no_gpu_context()
        patches = cuda_api.Patches(run.api)
        patches.apply()
        stack.callback(patches.undo)
        # Optimizers take their foreach (multi-tensor) path for CUDA parameters, as on a GPU:
        # they check the parameters' type, and a fake parameter is a FakeTensor.
        stack.enter_context(_foreach_takes_fake_tensors())
        stack.enter_context(attention.choosing(run))
        stack.enter_context(run.router)
        run.memory.activate(True)
        stack.callback(run.memory.activate, False)
        _current = run

        def _done() -> None:
            global _current
            _current = None

        stack.callback(_done)
        rec = active()
        if rec is not None and not rec.closed:
            from .. import torch as pst

            tracker = stack.enter_context(pst.track(recorder=rec, backend="python"))
            tracker._implicit = True
            run._tracker = tracker
        # cuBLAS keeps its workspaces for the process; a fake run gives them back when it ends
        # (recorded, while the tracker still runs), so that they read as no leak of the code.
        stack.callback(run.router.workspaces.clear)
        yield run
