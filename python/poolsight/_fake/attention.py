"""The attention kernel ``scaled_dot_product_attention`` would run on the GPU predicted for.

On a GPU, ``F.scaled_dot_product_attention`` asks ``select_sdp_backend``
(``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``) for the first of its kernels, in
priority order, whose constraints the inputs meet: cuDNN's, FlashAttention-2, the
memory-efficient kernel, or the math composite. The kernels keep different tensors for
backward (the math composite keeps the B x H x L x S attention weights; the fused kernels a
B x H x L log-sum-exp), so a prediction must pick the one the GPU would. On fake tensors
PyTorch's own choice asks the device's properties, which there is no device to answer, and
falls to the math composite: ``fake_cuda`` makes the choice here instead, for the GPU's
compute capability, from the constraints below (read from PyTorch's source, restated), then
calls the chosen kernel as the composite does.

What is checked, per kernel (dense 4-D inputs; anything else runs the math composite):

- every kernel: enabled (``torch.backends.cuda.*_sdp_enabled()``, ``sdpa_kernel``), batch
  sizes equal, key and value heads equal, query heads equal to them or, with ``enable_gqa``,
  a multiple, no empty sequence;
- cuDNN: sm_80 to sm_121, fp16 (or bf16 on sm_80 and later), not in deterministic mode,
  dropout a multiple of 1/16, batch and heads at most 65535, head dims multiples of 8 and at
  most 128 (256 on sm_90 and sm_10x with cuDNN after 9.22; 192/128 with cuDNN 9.11 or later
  there), backward with head dims of 128 or less (or 192/128, 256/256) where 256 is allowed,
  a key sequence longer than 1, last dimension contiguous;
- FlashAttention: sm_80 to sm_121, fp16/bf16, no ``attn_mask``, equal head dims of 256 or
  less, no causal mask on a non-square score matrix, training with head dims in (192, 224] (or
  (224, 256] with dropout) not on sm_86/89/120/121, last dimension contiguous;
- memory-efficient: sm_50 to sm_121, fp16/fp32 (and bf16 on sm_80 and later), query and key
  head dims equal, head dims a multiple of the GEMM alignment (8 for 16-bit types with tensor
  cores, 4 for fp32 on sm_80 and later, else 1), storage offsets aligned to it on sm_80 and
  later, last dimension contiguous.

The priority order is PyTorch's (``torch._C._get_sdp_priority_order()``); on sm_90 and sm_10x
with cuDNN later than 9.15 PyTorch puts cuDNN first unless ``TORCH_CUDNN_SDPA_DEPRIORITIZED``
is set, and so does this. Scratch memory the kernels take inside (FlashAttention's backward
accumulators) is not modelled: see docs/predict.md.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor
from torch.overrides import TorchFunctionMode

aten = torch.ops.aten

MATH, FLASH, EFFICIENT, CUDNN = 0, 1, 2, 3
NAMES = {MATH: "math", FLASH: "flash", EFFICIENT: "efficient", CUDNN: "cudnn"}


def _in(major: int, minor: int, low: tuple[int, int], high: tuple[int, int]) -> bool:
    return low <= (major, minor) <= high


def _common(q: Any, k: Any, v: Any, gqa: bool, strict_stride: bool) -> bool:
    if not (q.dim() == k.dim() == v.dim() == 4):
        return False
    if not (q.shape[0] == k.shape[0] == v.shape[0]):
        return False
    if k.shape[1] != v.shape[1]:
        return False
    if q.shape[1] != k.shape[1] and not (gqa and k.shape[1] > 0 and q.shape[1] % k.shape[1] == 0):
        return False
    if q.shape[2] == 0 or k.shape[2] == 0:
        return False
    for t in (q, k, v):
        if t.stride(-1) != 1 and not (not strict_stride and t.shape[-1] == 1):
            return False
    return True


def _requires_grad(q: Any, k: Any, v: Any) -> bool:
    return torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)


def _half(t: Any) -> bool:
    return t.dtype in (torch.float16, torch.bfloat16)


def _low_precision(major: int, q: Any, k: Any, v: Any) -> bool:
    allowed = (torch.float16, torch.bfloat16) if major >= 8 else (torch.float16,)
    return q.dtype in allowed and k.dtype == q.dtype and v.dtype == q.dtype


def can_use_flash(gpu: Any, q, k, v, mask, dropout: float, causal: bool, gqa: bool) -> bool:
    major, minor = gpu.major, gpu.minor
    if not torch.backends.cuda.flash_sdp_enabled() or mask is not None:
        return False
    if not _common(q, k, v, gqa, strict_stride=False):
        return False
    d = q.shape[-1]
    if not (d == k.shape[-1] == v.shape[-1] and d <= 256):
        return False
    if not _in(major, minor, (8, 0), (12, 1)):
        return False
    if _requires_grad(q, k, v) and (
        _in(major, minor, (8, 6), (8, 9)) or _in(major, minor, (12, 0), (12, 1))
    ):
        if not (d <= 192 or (dropout == 0.0 and d > 224)):
            return False
    if causal and q.shape[-2] != k.shape[-2]:
        return False
    return _low_precision(major, q, k, v)


def _gemm_alignment(major: int, q: Any) -> int:
    half = _half(q)
    tensor_cores = major >= 8 or (major >= 7 and half)
    align = 4 if major >= 8 else 1
    if tensor_cores:
        align = max(align, 128 // (16 if half else 32))
    return align


def can_use_efficient(gpu: Any, q, k, v, mask, dropout: float, causal: bool, gqa: bool) -> bool:
    major, minor = gpu.major, gpu.minor
    if not torch.backends.cuda.mem_efficient_sdp_enabled():
        return False
    if not _in(major, minor, (5, 0), (12, 1)):
        return False
    if not _common(q, k, v, gqa, strict_stride=True):
        return False
    align = _gemm_alignment(major, q)
    dq, dk, dv = q.shape[-1], k.shape[-1], v.shape[-1]
    if not (dq == dk and dq % align == 0 and dq > 0 and dv % align == 0 and dv > 0):
        return False
    if major >= 8:
        for t in (q, k, v):
            if t.numel() and (t.storage_offset() * t.element_size()) % (align * t.element_size()):
                return False
    allowed = (
        (torch.float16, torch.float32, torch.bfloat16)
        if major >= 8
        else (torch.float16, torch.float32)
    )
    return q.dtype in allowed and k.dtype == q.dtype and v.dtype == q.dtype


def _cudnn_version() -> int:
    try:
        return int(torch.backends.cudnn.version() or 0)
    except Exception:  # noqa: BLE001 - no cuDNN in this build
        return 0


def can_use_cudnn(gpu: Any, q, k, v, mask, dropout: float, causal: bool, gqa: bool) -> bool:
    major, minor = gpu.major, gpu.minor
    version = _cudnn_version()
    if version < 90000 or not torch.backends.cuda.cudnn_sdp_enabled():
        return False
    if dropout > 0.0 and 91100 < version < 91400:
        return False
    if (
        torch.are_deterministic_algorithms_enabled()
        and not torch.is_deterministic_algorithms_warn_only_enabled()
    ):
        return False
    if not _low_precision(major, q, k, v):
        return False
    if mask is not None and mask.dim() > 4:
        return False
    if not _in(major, minor, (8, 0), (12, 1)):
        return False
    if dropout * 16.0 != math.floor(dropout * 16.0):
        return False
    if not _common(q, k, v, True, strict_stride=False):
        return False
    b, h, s_q, d_qk = q.shape
    s_k, d_v = k.shape[2], v.shape[3]
    if b > 65535 or h > 65535:
        return False
    hopper_or_blackwell = (major == 9 and minor == 0) or major == 10
    sm107_old = major == 10 and minor == 7 and version <= 92500
    d256 = hopper_or_blackwell and not sm107_old and version > 92200
    limit = 128
    if d256:
        limit = 256
    elif hopper_or_blackwell and version >= 91100 and d_qk == 192 and d_v == 128:
        limit = 192
    if d_qk > limit or d_v > limit or d_qk % 8 or d_v % 8:
        return False
    if s_k == 1 or (dropout != 0.0 and s_q == 1):
        return False
    if d256 and _requires_grad(q, k, v):
        if not ((d_qk <= 128 and d_v <= 128) or (d_qk, d_v) in ((192, 128), (256, 256))):
            return False
    return True


def priority(gpu: Any) -> list[int]:
    """The kernels in the order PyTorch tries them on ``gpu``."""
    order = list(torch._C._get_sdp_priority_order())
    default = [FLASH, EFFICIENT, MATH, CUDNN]
    prefer_cudnn = (
        os.environ.get("TORCH_CUDNN_SDPA_DEPRIORITIZED", "").lower()
        not in ("1", "true", "on", "yes")
        and _cudnn_version() > 91500
        and gpu.major in (9, 10)
    )
    cuda = torch.version.cuda or "0"
    if prefer_cudnn and int(cuda.split(".")[0]) < 13:
        prefer_cudnn = gpu.minor in (0, 3)
    if order[:4] == default and prefer_cudnn:
        order = [CUDNN, FLASH, EFFICIENT, MATH] + order[4:]
    return order


def choose(gpu: Any, q, k, v, mask, dropout: float, causal: bool, gqa: bool) -> int:
    """The kernel a GPU like ``gpu`` runs for these inputs."""
    checks = {FLASH: can_use_flash, EFFICIENT: can_use_efficient, CUDNN: can_use_cudnn}
    for backend in priority(gpu):
        if backend == MATH:
            if torch.backends.cuda.math_sdp_enabled():
                return MATH
            continue
        check = checks.get(backend)
        if check is not None and check(gpu, q, k, v, mask, dropout, causal, gqa):
            return backend
    return MATH


def _additive(mask: Any, dtype: torch.dtype) -> Any:
    """A boolean mask as the additive one the fused kernels take (``convert_boolean_attn_mask``)."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros_like(mask, dtype=dtype).masked_fill_(mask.logical_not(), float("-inf"))


def _pad_last(t: Any, multiple: int) -> Any:
    rem = t.shape[-1] % multiple
    return t if rem == 0 else F.pad(t, (0, multiple - rem))


def _efficient_mask(mask: Any, q: Any, k: Any) -> Any:
    """``preprocess_mask``: the last dimension padded to a multiple of 16, expanded to
    (batch, heads, L, S)."""
    if mask is None:
        return None
    padded = mask
    rem = mask.shape[-1] % 16
    if rem:
        padded = F.pad(mask, (0, 16 - rem))[..., : mask.shape[-1]]
    return padded.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])


def run(backend: int, q, k, v, mask, dropout: float, causal: bool, scale: Any, gqa: bool) -> Any:
    """What the composite does once ``backend`` is chosen."""
    logsumexp = _requires_grad(q, k, v)
    if backend == FLASH:
        d = q.shape[-1]
        og_scale = scale if scale is not None else 1.0 / math.sqrt(d)
        out = aten._scaled_dot_product_flash_attention(
            _pad_last(q, 8),
            _pad_last(k, 8),
            _pad_last(v, 8),
            dropout,
            causal,
            False,
            scale=og_scale,
        )[0]
        return out if out.shape[-1] == d else out[..., :d]
    if q.shape[1] != k.shape[1]:
        # Grouped-query attention through a kernel without it: the key and value heads
        # repeated, as the composite repeats them.
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    if backend == EFFICIENT:
        bias = _efficient_mask(_additive(mask, q.dtype), q, k)
        return aten._scaled_dot_product_efficient_attention(
            q, k, v, bias, logsumexp, dropout, causal, scale=scale
        )[0]
    bias = _additive(mask, q.dtype)
    return aten._scaled_dot_product_cudnn_attention(
        q, k, v, bias, logsumexp, dropout, causal, False, scale=scale
    )[0]


#: The recurrent layers' functions (``nn.LSTM``, ``nn.GRU``, ``nn.RNN`` call them).
_RNNS = (torch.lstm, torch.gru, torch.rnn_tanh, torch.rnn_relu)


class _Choosing(TorchFunctionMode):
    def __init__(self, fake_run: Any):
        super().__init__()
        self.gpu = fake_run.gpu
        #: How many calls each kernel got.
        self.counts = dict.fromkeys(NAMES.values(), 0)

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None):
        kwargs = kwargs or {}
        if func in _RNNS and args and isinstance(args[0], FakeTensor):
            # cuDNN's fused RNN kernels would be asked for the device; its reserve space only
            # cuDNN can size. The RNN runs PyTorch's own cells instead (see docs/predict.md).
            with torch.backends.cudnn.flags(enabled=False):
                return func(*args, **kwargs)
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        names = (
            "query",
            "key",
            "value",
            "attn_mask",
            "dropout_p",
            "is_causal",
            "scale",
            "enable_gqa",
        )
        defaults = (None, None, None, None, 0.0, False, None, False)
        given = dict(zip(names, defaults))
        given.update(zip(names, args))
        given.update(kwargs)
        q, k, v = given["query"], given["key"], given["value"]
        if not (isinstance(q, FakeTensor) and q.fake_device.type == "cuda"):
            return func(*args, **kwargs)
        mask, dropout = given["attn_mask"], float(given["dropout_p"])
        causal, scale, gqa = bool(given["is_causal"]), given["scale"], bool(given["enable_gqa"])
        backend = choose(self.gpu, q, k, v, mask, dropout, causal, gqa)
        self.counts[NAMES[backend]] += 1
        if backend == MATH:
            return func(*args, **kwargs)
        return run(backend, q, k, v, mask, dropout, causal, scale, gqa)


@contextlib.contextmanager
def choosing(fake_run: Any) -> Iterator[_Choosing]:
    """While active, ``F.scaled_dot_product_attention`` on fake CUDA tensors runs the kernel
    the predicted GPU would pick (``fake_run.attention`` counts them)."""
    mode = _Choosing(fake_run)
    fake_run.attention = mode.counts
    with mode:
        yield mode
