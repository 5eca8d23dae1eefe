"""Which operators run on fake tensors, and what the caching allocator is asked for them.

``fake_cuda`` puts one ``TorchDispatchMode`` under everything else: an operator on a fake
tensor, or one asked to make a tensor on ``cuda``, runs under PyTorch's ``FakeTensorMode``
(its meta kernels: shapes, dtypes, strides, aliasing, no data); every other operator runs for
real, so the data pipeline, CPU tensors, the optimizer's CPU step counters and anything a
script keeps on the CPU behave as they always do. Each new storage of a fake CUDA tensor is
then served by the allocator model (``_native.FakeGpu``), and before an operator that runs
through cuBLAS, the workspace cuBLAS would be given for its thread and stream.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
    UnsupportedOperatorException,
)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .. import PoolsightError, _native
from . import cuda_api

aten = torch.ops.aten


class FakeCudaError(PoolsightError):
    """What a fake CUDA run cannot do (an operator with no fake kernel, a value asked of a
    fake tensor, an output shape that depends on data): the message names the operator and
    the line of the program that asked."""


class _FakeMode(FakeTensorMode):
    """PyTorch's fake mode, told there is no GPU to initialise (``torch.cuda.is_available``
    says True while ``fake_cuda`` runs, for the program's sake, not for this)."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        # The converter remembers every fake tensor it wraps around a fresh meta tensor, by a
        # weak reference to the fake tensor; a tensor with a weak reference cannot be swapped
        # (torch.utils.swap_tensors), so no fake parameter could be moved into its module
        # (`model.cuda()`, `model.to(dtype)`). Those are never looked up again: not kept.
        converter = self.fake_tensor_converter
        remember = converter.set_tensor_memo

        def set_tensor_memo(t: torch.Tensor, v: Any) -> None:
            if t.device.type != "meta":
                remember(t, v)

        converter.set_tensor_memo = set_tensor_memo

    @property
    def avoid_device_init(self) -> bool:  # type: ignore[override]
        return True


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_LIBRARY_MARKERS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)


def _frames_outside(skip_torch: bool) -> list:
    """The Python frames of the program, innermost first, without poolsight's own (and
    without PyTorch's when ``skip_torch``)."""
    out = []
    f = sys._getframe(1)
    while f is not None:
        name = f.f_code.co_filename
        if not name.startswith(_OWN_DIR) and not (skip_torch and name.startswith(_TORCH_DIR)):
            out.append(f)
        f = f.f_back
    return out


def user_line() -> str:
    """The innermost line of the program outside PyTorch, poolsight and installed libraries
    (else the innermost outside PyTorch and poolsight): ``train.py:42 (in step)``."""
    frames = _frames_outside(skip_torch=True)
    for f in frames:
        name = f.f_code.co_filename
        if not any(m in name for m in _LIBRARY_MARKERS) and not name.startswith("<frozen"):
            return f"{name}:{f.f_lineno} (in {f.f_code.co_name})"
    if frames:
        f = frames[0]
        return f"{f.f_code.co_filename}:{f.f_lineno} (in {f.f_code.co_name})"
    return "an unknown line"


def _asked_by_torch() -> bool:
    """Whether the innermost frame outside poolsight and PyTorch's dispatch machinery is
    PyTorch's own code (``GradScaler``'s found-inf check, ``trunc_normal_``'s rejection loop),
    not the program's."""
    machinery = (
        os.path.join(_TORCH_DIR, "_ops.py"),
        os.path.join(_TORCH_DIR, "_tensor.py"),
        os.path.join(_TORCH_DIR, "_compile.py"),
        os.path.join(_TORCH_DIR, "utils", ""),
        os.path.join(_TORCH_DIR, "_subclasses", ""),
        os.path.join(_TORCH_DIR, "_dynamo", ""),
        os.path.join(_TORCH_DIR, "overrides.py"),
    )
    for f in _frames_outside(skip_torch=False):
        name = f.f_code.co_filename
        if name.startswith(machinery):
            continue
        return name.startswith(_TORCH_DIR)
    return False


#: Operators whose CUDA kernels run through cuBLAS, which gives each (handle, stream) a
#: workspace from the caching allocator the first time (``CublasHandlePool.cpp``).
_CUBLAS = {
    "mm",
    "addmm",
    "addmm_",
    "bmm",
    "baddbmm",
    "baddbmm_",
    "addbmm",
    "addbmm_",
    "addmv",
    "addmv_",
    "mv",
    "dot",
    "vdot",
    "_addmm_activation",
    "_scaled_mm",
    "_int_mm",
}

#: Operators that always run through cuBLASLt, which keeps a workspace of its own.
_CUBLASLT = {"_addmm_activation", "_scaled_mm"}


def _uses_cublaslt(name: str, args: tuple, kwargs: dict) -> bool:
    """Whether an operator takes cuBLASLt's path: ``_addmm_activation``, ``_scaled_mm``, and
    ``addmm`` with a 1-D bias added once (``beta == 1``) to a 2-D product in a floating dtype,
    both sides larger than 1, as ``addmm_out_cuda_impl`` decides (``Blas.cpp``)."""
    if name in _CUBLASLT:
        return True
    if name != "addmm" or len(args) < 3:
        return False
    bias, mat1, mat2 = args[0], args[1], args[2]
    beta = kwargs.get("beta", args[3] if len(args) > 3 else 1)
    if not all(isinstance(t, torch.Tensor) for t in (bias, mat1, mat2)):
        return False
    return (
        beta == 1
        and bias.dim() == 1
        and mat1.dim() == 2
        and mat2.dim() == 2
        and bias.shape[0] == mat2.shape[1]
        and bias.is_contiguous()
        and mat1.dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16)
        and mat1.shape[0] > 1
        and mat1.shape[1] > 1
        and mat2.shape[0] > 1
        and mat2.shape[1] > 1
    )


def cublas_workspace_bytes(major: int, minor: int) -> int:
    """``getChosenWorkspaceSize``: ``CUBLAS_WORKSPACE_CONFIG`` (``:SIZE_KiB:COUNT`` pairs,
    summed), else 32 MiB on sm_90 and 8 MiB + 128 KiB elsewhere."""
    default = 4096 * 8 * 1024 if (major, minor) == (9, 0) else 4096 * 1024 * 2 + 16 * 1024 * 8
    conf = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if not conf:
        return default
    import re

    pairs = re.findall(r":([0-9]+):([0-9]+)", conf)
    if not pairs:
        return default
    return sum(int(size) * 1024 * int(count) for size, count in pairs)


def cublaslt_workspace_bytes() -> int | None:
    """The cuBLASLt workspace of each (handle, stream): ``CUBLASLT_WORKSPACE_SIZE`` KiB
    (default 1024), or None when ``TORCH_CUBLASLT_UNIFIED_WORKSPACE`` makes it share cuBLAS's."""
    if os.environ.get("TORCH_CUBLASLT_UNIFIED_WORKSPACE", "").lower() in ("1", "true", "on", "yes"):
        return None
    try:
        kib = int(os.environ.get("CUBLASLT_WORKSPACE_SIZE", "1024"))
    except ValueError:
        kib = 1024
    return kib * 1024


def is_non_overlapping_and_dense(t: torch.Tensor) -> bool:
    """Whether ``t``'s elements fill its storage span once each, in some order of its
    dimensions (what ``_to_copy``'s ``preserve_format`` keeps the strides of)."""
    dims = sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz != 1)
    expected = 1
    for st, sz in dims:
        if st != expected:
            return False
        expected *= sz
    return True


def _in_module_init() -> bool:
    """Whether a ``torch.nn.Module``'s ``__init__`` is running (a model being built)."""
    f = sys._getframe(2)
    module = torch.nn.Module
    while f is not None:
        if f.f_code.co_name == "__init__" and isinstance(f.f_locals.get("self"), module):
            return True
        f = f.f_back
    return False


def _device_is_cuda(d: Any) -> bool:
    if d is None:
        return False
    if isinstance(d, torch.device):
        return d.type == "cuda"
    if isinstance(d, str):
        return d.startswith("cuda")
    return False


class Router(TorchDispatchMode):
    """The dispatch mode of one fake run (see the module's comment)."""

    def __init__(self, run: Any):
        super().__init__()
        self.run = run
        self.fake = _FakeMode(allow_non_fake_inputs=True)
        # The position of each operator's `device` argument (-1: none).
        self._device_at: dict[Any, int] = {}
        # Whether a module built on the CPU gets fake parameters (fake_cuda(cpu_modules=)).
        self._fake_cpu_modules = getattr(run, "cpu_modules", "fake") == "fake"
        self._factory: dict[Any, bool] = {}
        # The autograd node running now, and the storages made while it runs.
        self._node: Any = None
        self._made_in_node: set = set()
        # (thread, stream) -> the cuBLAS workspace tensor, and cuBLASLt's.
        self.workspaces: dict[tuple, torch.Tensor] = {}
        self._register = run.memory.register

    # -- which operators are fake --------------------------------------------------------------

    def _device_position(self, func: Any) -> int:
        at = self._device_at.get(func)
        if at is None:
            at = -1
            schema = getattr(func, "_schema", None)
            if schema is not None:
                for i, a in enumerate(schema.arguments):
                    if a.name == "device" and not a.kwarg_only:
                        at = i
                        break
            self._device_at[func] = at
        return at

    def _is_fake(self, func: Any, args: tuple, kwargs: dict) -> bool:
        if _device_is_cuda(kwargs.get("device")):
            return True
        at = self._device_position(func)
        if 0 <= at < len(args) and _device_is_cuda(args[at]):
            return True
        if self._fake_cpu_modules and self._cpu_factory(func, args, at) and _in_module_init():
            # A tensor made on the CPU while a module is built (`nn.Linear(...)` before
            # `.to("cuda")`): fake, so that a 2.7B-parameter model built on the CPU takes
            # neither its 10 GiB of host memory nor minutes of initialisers.
            return True
        for a in args:
            if isinstance(a, FakeTensor):
                return True
            if isinstance(a, (list, tuple)):
                for b in a:
                    if isinstance(b, FakeTensor):
                        return True
        return any(isinstance(v, FakeTensor) for v in tree_leaves(kwargs))

    def _cpu_factory(self, func: Any, args: tuple, at: int) -> bool:
        """Whether an operator makes a new tensor from nothing (it takes a device, and no
        tensor argument): ``empty``, ``zeros``, ``randn``, ``arange``..."""
        known = self._factory.get(func)
        if known is None:
            schema = getattr(func, "_schema", None)
            known = (
                schema is not None
                and any(a.name == "device" for a in schema.arguments)
                and not any(str(a.type).startswith("Tensor") for a in schema.arguments)
            )
            self._factory[func] = known
        return known

    # -- the operator --------------------------------------------------------------------------

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None):
        kwargs = kwargs or {}
        if not self._is_fake(func, args, kwargs):
            return func(*args, **kwargs)
        if func is aten._local_scalar_dense.default:
            return self._scalar(args[0])
        if func is aten.record_stream.default:
            return None
        if func is aten._to_copy.default and not isinstance(args[0], FakeTensor):
            out = self._moved(args[0], kwargs)
            self._serve(out)
            return out
        backward = torch._C._current_graph_task_id() != -1
        if backward:
            node = torch._C._current_autograd_node()
            if node is not self._node:
                self._node, self._made_in_node = node, set()
            if func is aten.add.Tensor:
                summed = self._accumulated_in_place(args, kwargs)
                if summed is not None:
                    return summed
            elif func is aten.new_empty_strided.default and self._stolen(node, args, kwargs):
                return args[0]
        name = func._schema.name.split("::", 1)[-1]
        if name in _CUBLAS:
            self._workspace(name, args, kwargs)
        try:
            out = self.fake.__torch_dispatch__(func, types, args, kwargs)
        except UnsupportedOperatorException:
            raise FakeCudaError(
                f"fake_cuda: the operator {func} has no fake (meta) kernel, so it cannot run "
                f"on fake CUDA tensors; it was called at {user_line()}. A custom operator "
                "needs one (torch.library.register_fake); an extension that is not an "
                "operator cannot be predicted"
            ) from None
        except DynamicOutputShapeException:
            raise FakeCudaError(
                f"fake_cuda: the output shape of {func} depends on the values of a fake CUDA "
                f"tensor, which a fake run does not have; it was called at {user_line()}"
            ) from None
        except DataDependentOutputException:
            raise FakeCudaError(
                f"fake_cuda: {func} needs the values of a fake CUDA tensor, which a fake run "
                f"does not have; it was called at {user_line()}"
            ) from None
        self._serve(out)
        if backward:
            for t in tree_leaves(out):
                if isinstance(t, FakeTensor):
                    self._made_in_node.add(t.untyped_storage()._cdata)
        return out

    def _accumulated_in_place(self, args: tuple, kwargs: dict) -> Any:
        """The autograd engine adding a second gradient into a node's input buffer, in
        place as on a GPU, or None when the engine would add out of place.

        The engine sums in place (``old.add_(new)``, no new block) when it holds the only
        reference to the buffered gradient; it never does so for a tensor subclass, and fake
        tensors are one, so without this every such sum (the softmax's two gradient paths, a
        tensor used twice) would take a block the GPU run does not. The buffered gradient is
        one made by an earlier node (not by the node running now), dense, of the sum's shape
        and dtype, and referenced only by the engine: no more uses than the new gradient
        has (which the engine holds once, as it holds the buffered one), and its storage
        used by no other tensor."""
        if len(args) != 2 or kwargs.get("alpha", 1) != 1 or torch.is_grad_enabled():
            return None
        old, new = args
        if not (isinstance(old, FakeTensor) and isinstance(new, torch.Tensor)) or old is new:
            return None
        if old.shape != new.shape or old.dtype != new.dtype or old.device != new.device:
            return None
        st = old.untyped_storage()
        if st._cdata in self._made_in_node or not is_non_overlapping_and_dense(old):
            return None
        # The new gradient is held as the buffered one is (by the engine, and by every
        # dispatch mode on the way here); the buffered one's storage by it and `st` alone.
        if old._use_count() > new._use_count() or torch._C._storage_Use_Count(st._cdata) != 2:
            return None
        self.fake.__torch_dispatch__(aten.add_.Tensor, (), (old, new), {})
        return old

    def _stolen(self, node: Any, args: tuple, kwargs: dict) -> bool:
        """Whether ``AccumulateGrad`` would take a parameter's first gradient as it is (a
        GPU run does, when nothing else holds it) rather than copy it: for a tensor subclass
        it always copies (``new_empty_strided`` + ``copy_``), so without this every
        parameter would take a block of its size in its first backward that the GPU run
        does not. Taken as it is when the copy would be of its own sizes, strides and dtype
        and its storage is used by no other tensor."""
        if type(node).__name__ != "AccumulateGrad" or len(args) < 3:
            return False
        grad = args[0]
        if not isinstance(grad, FakeTensor) or torch.is_grad_enabled():
            return False
        dtype = kwargs.get("dtype") or grad.dtype
        if list(args[1]) != list(grad.shape) or list(args[2]) != list(grad.stride()):
            return False
        if dtype != grad.dtype or not is_non_overlapping_and_dense(grad):
            return False
        return torch._C._storage_Use_Count(grad.untyped_storage()._cdata) == 2

    def _moved(self, t: torch.Tensor, kwargs: dict) -> FakeTensor:
        """``t`` (a real tensor) copied to the fake device: an empty fake tensor of its size,
        dtype and (for a dense tensor) strides, as ``_to_copy`` makes it. Made without handing
        ``t`` to the fake mode, which would keep a weak reference to it (and a parameter with
        one cannot be swapped into its module: ``model.cuda()``)."""
        dtype = kwargs.get("dtype") or t.dtype
        memory_format = kwargs.get("memory_format") or torch.preserve_format
        if memory_format is torch.preserve_format and is_non_overlapping_and_dense(t):
            stride = t.stride()
        else:
            fmt = (
                torch.contiguous_format if memory_format is torch.preserve_format else memory_format
            )
            stride = torch.empty(t.shape, device="meta").contiguous(memory_format=fmt).stride()
        return self.fake.__torch_dispatch__(
            aten.empty_strided.default,
            (),
            (list(t.shape), list(stride)),
            {"dtype": dtype, "device": torch.device("cuda", 0), "layout": t.layout},
        )

    def _serve(self, out: Any) -> None:
        """Serves the new CUDA storages of an operator's outputs from the allocator model."""
        if isinstance(out, FakeTensor):
            self._serve_one(out)
            return
        for t in tree_leaves(out):
            if isinstance(t, FakeTensor):
                self._serve_one(t)

    def _serve_one(self, t: FakeTensor) -> None:
        if t.fake_device.type != "cuda":
            return
        st = t.untyped_storage()
        frames = self.run.frames() if self.run.history_stacks else None
        try:
            self._register(st, st._cdata, st.nbytes(), cuda_api.current_stream_id(), frames)
        except _native.FakeOutOfMemory as e:
            self.run.out_of_memory(e.args, st, frames)

    def _workspace(self, name: str, args: tuple, kwargs: dict) -> None:
        """The cuBLAS (and cuBLASLt) workspace of the thread and stream running a matrix
        multiply, the first time: the autograd engine's device thread has its own cuBLAS
        handle on a GPU, so backward gets a workspace of its own."""
        thread = "autograd" if torch._C._current_graph_task_id() != -1 else threading.get_ident()
        stream = cuda_api.current_stream_id()
        key = (thread, stream, "cublas")
        if key not in self.workspaces:
            gpu = self.run.gpu
            self._make_workspace(key, cublas_workspace_bytes(gpu.major, gpu.minor))
        if _uses_cublaslt(name, args, kwargs):
            lt = cublaslt_workspace_bytes()
            key = (thread, stream, "cublaslt")
            if lt is not None and key not in self.workspaces:
                self._make_workspace(key, lt)

    def _make_workspace(self, key: tuple, nbytes: int) -> None:
        t = self.fake.__torch_dispatch__(
            aten.empty.memory_format,
            (),
            ([nbytes],),
            {"dtype": torch.uint8, "device": torch.device("cuda", 0)},
        )
        self.workspaces[key] = t
        self._serve_one(t)
        self.run.tracked(t, "workspace")

    def _scalar(self, t: torch.Tensor) -> Any:
        """A value asked of a fake tensor (``.item()``, ``bool()``, ``if t:``): 0 (False) when
        PyTorch's own code asks (``GradScaler``'s found-inf check sees no inf, ``trunc_normal_``
        redraws nothing), or with ``items="zero"``; else a clear error."""
        if self.run.items == "zero" or _asked_by_torch():
            if t.dtype == torch.bool:
                return False
            return 0.0 if t.dtype.is_floating_point or t.dtype.is_complex else 0
        raise FakeCudaError(
            f"fake_cuda: {user_line()} asks for the value of a fake CUDA tensor "
            "(aten._local_scalar_dense: .item(), float(), bool(), `if tensor:`, print); a fake "
            "run has shapes and no values. Keep the value on the CPU, skip the line when "
            "poolsight.torch.is_fake() is True, or read every such value as 0 with "
            "fake_cuda(items='zero') (poolsight predict --items zero)"
        )
