"""``poolsight.torch.use_pool()``: poolsight's pool as PyTorch's CUDA allocator, and the
figures of that pool (re-exported by ``poolsight.torch``)."""

from __future__ import annotations

from typing import Any

import torch

from . import Recording, _native, active


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
