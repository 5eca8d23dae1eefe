"""CuPy integration.

- :class:`TraceHook` is a ``cupy.cuda.MemoryHook``: ``with TraceHook(rec):`` records CuPy's own
  memory-pool events (its six callbacks) into the trace, each allocation with its stack at the
  recording's level (the open scopes, or the Python frames as ``LineProfileHook`` takes them).
  ``poolsight lines`` then prints what ``LineProfileHook.print_report()`` prints, and
  ``poolsight functions`` what Chainer's ``CupyMemoryProfileHook`` prints.
- :func:`use_pool` makes poolsight's pool CuPy's allocator (``cupy.cuda.set_allocator``), for
  exact pool events (releases, out-of-memory included) without Python callbacks.

    import poolsight, poolsight.cupy

    with poolsight.record("run.pstrace", stacks="python") as rec, poolsight.cupy.TraceHook(rec):
        ...  # CuPy code
"""

from __future__ import annotations

import ctypes

import cupy

from . import Recording, _native, _recording, active

__all__ = ["TraceHook", "use_pool"]


def _stack_settings(rec: Recording | None, stacks: str | None, max_depth: int | None):
    level = stacks or (rec.stacks if rec is not None else "scopes")
    depth = max_depth if max_depth is not None else (rec.max_depth if rec is not None else 0)
    if level not in ("scopes", "python"):
        raise ValueError(f"stacks must be 'scopes' or 'python', not {level!r}")
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 0:
        raise ValueError(f"max_depth must be an int >= 0, not {depth!r}")
    return level == "python", depth


class TraceHook(cupy.cuda.MemoryHook):
    """A ``cupy.cuda.MemoryHook`` that writes CuPy's pool events into a poolsight trace.

    ``with TraceHook(rec):`` (``rec`` defaults to the recording open with
    :func:`poolsight.record`) registers it for the calling thread, as every CuPy memory hook.
    Each allocation gets its stack at ``stacks`` (default: the recording's): ``"scopes"``, the
    open poolsight scopes (cheap), or ``"python"``, the Python frames from the outermost in, as
    ``LineProfileHook`` takes them, with its ``max_depth``.

    What is written: ``malloc_postprocess``, ``alloc_postprocess`` and ``free_postprocess``,
    failures included (``mem_ptr`` 0), which carry everything the reports need; with
    ``pre_events=True`` also the three pre callbacks. CuPy calls the recording code directly
    (native methods bound as the callbacks), so a callback runs no Python code of ours.
    ``free_all_blocks`` has no callback in CuPy: use :func:`use_pool` to see releases.
    """

    name = "PoolsightTraceHook"

    def __init__(
        self,
        recorder: Recording | None = None,
        *,
        stacks: str | None = None,
        max_depth: int | None = None,
        pre_events: bool = False,
    ):
        rec = _recording(recorder)
        python_stacks, depth = _stack_settings(rec, stacks, max_depth)
        self.recording = rec
        self._sink = sink = _native.CupyHookSink(rec._native, python_stacks, depth, pre_events)
        # Instance attributes shadow MemoryHook's methods: CuPy's pool calls these.
        self.malloc_preprocess = sink.malloc_preprocess
        self.malloc_postprocess = sink.malloc_postprocess
        self.alloc_preprocess = sink.alloc_preprocess
        self.alloc_postprocess = sink.alloc_postprocess
        self.free_preprocess = sink.free_preprocess
        self.free_postprocess = sink.free_postprocess


# -- the allocator --------------------------------------------------------------------------------

_installed: _native.CupyAllocator | None = None


def _c_function(name: str) -> int:
    lib = ctypes.CDLL(_native.__file__)
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def use_pool(
    recorder: Recording | None = None,
    *,
    stacks: str | None = None,
    max_depth: int | None = None,
    limit: int | None = None,
) -> _native.CupyAllocator:
    """Makes poolsight's pool CuPy's allocator (``cupy.cuda.set_allocator`` with a
    ``CFunctionAllocator`` over C functions of this package's native module).

    Every CuPy allocation then goes through poolsight's CuPy-faithful pool over CUDA; with a
    recording (``recorder``, or the one open with :func:`poolsight.record`) the pool's events
    are recorded with their stacks at the recording's ``stacks`` level, releases and
    out-of-memory included. ``limit`` caps the bytes the pool holds on the current device.
    Returns the allocator (``.stats(device)``, ``.free_all_blocks(device)``,
    ``.set_limit(device, bytes)``). CuPy's memory hooks do not fire for it (they live in CuPy's
    own pool), and CuPy's allocator interface names no stream: all streams share one arena.
    Undo with ``cupy.cuda.set_allocator()`` (CuPy's default pool).
    """
    global _installed
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # CUDARuntimeError, or no driver at all
        raise RuntimeError(
            f"poolsight.cupy.use_pool needs CUDA, and CuPy finds no usable device here ({e})"
        ) from e
    if count == 0:
        raise RuntimeError("poolsight.cupy.use_pool needs CUDA, and CuPy finds no device here")
    rec = recorder if recorder is not None else active()
    python_stacks, depth = _stack_settings(rec, stacks, max_depth)
    allocator = _native.CupyAllocator(
        rec._native if rec is not None else None, python_stacks, depth
    )
    device = cupy.cuda.Device().id
    allocator.open(device)
    if limit is not None:
        allocator.set_limit(device, int(limit))
    c_alloc = cupy.cuda.memory.CFunctionAllocator(
        allocator.param,
        _c_function("poolsight_cupy_malloc"),
        _c_function("poolsight_cupy_free"),
        allocator,
    )
    cupy.cuda.set_allocator(c_alloc.malloc)
    _installed = allocator
    return allocator
