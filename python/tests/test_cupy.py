"""poolsight.cupy.

Two kinds of tests here:

- **Event-mapping tests, no CuPy needed**: they drive ``_native.CupyHookSink`` (the object whose
  methods ``TraceHook`` hands to CuPy as its callbacks) with the callback sequences CuPy's
  ``SingleDeviceMemoryPool`` makes, with CuPy's keyword arguments, and check the trace and the
  reports. They test poolsight's side of the contract, not CuPy.
- **CuPy tests**: with CuPy and a CUDA device only (skipped with the reason otherwise): CuPy's
  ``LineProfileHook`` and our ``TraceHook`` on the same program in one process print the same
  tree; ``use_pool`` records.
"""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys

import pytest

import poolsight
from poolsight import _native

# -- event mapping, without CuPy --------------------------------------------------------------


def _round(size: int) -> int:
    return (size + 511) // 512 * 512


class CupyLikePool:
    """Calls a hook's callbacks in the order and with the kwargs of CuPy's
    ``SingleDeviceMemoryPool.malloc``/``free`` (``_try_malloc``: three device-allocation
    attempts before the error). All callbacks of one request are called from the line marked
    CALL, so they share one Python stack, as CuPy's (Cython, no Python frames) do."""

    def __init__(self, hook):
        self.hook = hook

    def run(self, events):
        for name, kw in events:
            getattr(self.hook, name)(**kw)  # CALL

    @staticmethod
    def malloc(size, ptr, *, miss=False, failed_attempts=0):
        mem_size = _round(size)
        ev = [("malloc_preprocess", dict(device_id=0, size=size, mem_size=mem_size))]
        for _ in range(failed_attempts):
            ev.append(("alloc_preprocess", dict(device_id=0, mem_size=mem_size)))
            ev.append(("alloc_postprocess", dict(device_id=0, mem_size=mem_size, mem_ptr=0)))
        if miss:
            ev.append(("alloc_preprocess", dict(device_id=0, mem_size=mem_size)))
            ev.append(("alloc_postprocess", dict(device_id=0, mem_size=mem_size, mem_ptr=ptr)))
        # A zero-byte malloc gets ptr 0 and a pmem id; a failed one ptr 0 and pmem 0.
        pmem = 0 if failed_attempts else ptr + 7
        post = dict(device_id=0, size=size, mem_size=mem_size, mem_ptr=ptr, pmem_id=pmem)
        ev.append(("malloc_postprocess", post))
        return ev

    @staticmethod
    def free(ptr, mem_size):
        kw = dict(device_id=0, mem_size=mem_size, mem_ptr=ptr, pmem_id=ptr + 7)
        return [("free_preprocess", kw), ("free_postprocess", kw)]


CALL_LINE = next(
    i + 1 for i, line in enumerate(open(__file__).read().splitlines()) if line.endswith("# CALL")
)


def _cli(*args) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "poolsight", *args], capture_output=True, text=True, check=True
    )
    return out.stdout


def test_mapping_sink_lines_report_is_line_profile_hooks_tree(tmp_path):
    """(No CuPy.) CuPy's own LineProfileHook test: malloc(1000) reused from the cache, plus
    malloc(2000) from the device, prints ``_root (3.00KB, 2.00KB)``; a failed request and its
    three failed attempts count too, as LineProfileHook counts at its pre hooks."""
    path = tmp_path / "t.pstrace"
    with poolsight.record(path, stacks="python") as rec:
        pool = CupyLikePool(_native.CupyHookSink(rec._native, True, 0, False))
        pool.run(pool.malloc(1000, 0x1000, miss=True))
        pool.run(pool.free(0x1000, 1024))
        first = sys._getframe().f_lineno + 1
        pool.run(pool.malloc(1000, 0x1000))
        pool.run(pool.malloc(2000, 0x2000, miss=True))
        pool.run(pool.malloc(0, 0))
        pool.run(pool.malloc(4096, 0, failed_attempts=3))
    me, fn = __file__, "test_mapping_sink_lines_report_is_line_profile_hooks_tree"
    # A pool's trace reads with every frame as recorded, by default: LineProfileHook's tree.
    out = _cli("lines", str(path))
    lines = out.splitlines()
    # Warm-up (first malloc, 1 KiB from the device) + 1 KiB + 2 KiB + 0 + 4 KiB failed;
    # acquired: 1 KiB + 2 KiB + 3 failed attempts of 4 KiB.
    assert lines[0] == "_root (8.00KB, 15.00KB)"
    expected_tail = [
        f"  {me}:{first}:{fn} (1.00KB, 0.00B)",
        f"    {me}:{CALL_LINE}:run (1.00KB, 0.00B)",
        f"  {me}:{first + 1}:{fn} (2.00KB, 2.00KB)",
        f"    {me}:{CALL_LINE}:run (2.00KB, 2.00KB)",
        f"  {me}:{first + 2}:{fn} (0.00B, 0.00B)",
        f"    {me}:{CALL_LINE}:run (0.00B, 0.00B)",
        f"  {me}:{first + 3}:{fn} (4.00KB, 12.00KB)",
        f"    {me}:{CALL_LINE}:run (4.00KB, 12.00KB)",
    ]
    assert [line.lstrip() for line in lines[-8:]] == [line.lstrip() for line in expected_tail]
    # The tree's own outer frames (pytest's) precede; the indentation is one level per frame.
    depth = (len(lines[-8]) - len(lines[-8].lstrip())) // 2
    assert [(len(x) - len(x.lstrip())) // 2 - depth for x in lines[-8:]] == [0, 1] * 4

    info = json.loads(_cli("info", str(path), "--format", "json"))
    # Post events only by default: 5 malloc_post, 2 + 3 alloc_post, 1 free_post.
    assert info["events"] == {"malloc_post": 5, "alloc_post": 5, "free_post": 1}


def test_mapping_sink_pre_events_and_pool_figures(tmp_path):
    """(No CuPy.) ``pre_events=True`` writes all six callbacks; the pool's figures count only
    what succeeded (a failed request holds nothing)."""
    path = tmp_path / "t.pstrace"
    with poolsight.record(path) as rec:
        pool = CupyLikePool(_native.CupyHookSink(rec._native, False, 0, True))
        pool.run(pool.malloc(3000, 0x1000, miss=True))
        pool.run(pool.malloc(5000, 0, failed_attempts=3))
        pool.run(pool.free(0x1000, 3072))
    info = json.loads(_cli("info", str(path), "--format", "json"))
    assert info["events"] == {
        "malloc_pre": 2,
        "malloc_post": 2,
        "alloc_pre": 4,
        "alloc_post": 4,
        "free_pre": 1,
        "free_post": 1,
    }
    assert info["devices"][0]["allocation_unit"] == 512
    report = _cli("report", str(path))
    assert "peak live 3.00KB" in report


def test_mapping_sink_after_finish_writes_nothing_and_never_raises(tmp_path):
    """(No CuPy.) CuPy frees arrays whenever they are collected, also after the recording
    ended: those callbacks must neither raise nor count as dropped events (the memory of an
    array that outlives a recording is freed after it as a matter of course); a malloc after
    finish is dropped and counted, also without raising; a sink made for a finished recording
    is refused where it is made."""
    path = tmp_path / "t.pstrace"
    rec = poolsight.record(path)
    sink = _native.CupyHookSink(rec._native, False, 0, True)
    sink.malloc_postprocess(device_id=0, size=100, mem_size=512, mem_ptr=0x1000, pmem_id=1)
    rec.finish()
    sink.free_preprocess(device_id=0, mem_size=512, mem_ptr=0x1000, pmem_id=1)
    sink.free_postprocess(device_id=0, mem_size=512, mem_ptr=0x1000, pmem_id=1)
    assert rec.dropped_events == 0
    sink.malloc_postprocess(device_id=0, size=100, mem_size=512, mem_ptr=0x2000, pmem_id=2)
    assert rec.dropped_events == 1
    info = json.loads(_cli("info", str(path), "--format", "json"))
    assert info["events"] == {"malloc_post": 1}
    with pytest.raises(poolsight.PoolsightError, match="finished"):
        _native.CupyHookSink(rec._native, False, 0, False)


def test_mapping_sink_functions_report_under_scopes(tmp_path):
    """(No CuPy.) With scope stacks, allocations count for every open function scope, as
    Chainer's CupyMemoryProfileHook counts them (nested calls in every enclosing call)."""
    path = tmp_path / "t.pstrace"
    with poolsight.record(path) as rec:
        pool = CupyLikePool(_native.CupyHookSink(rec._native, False, 0, False))
        with rec.function("LinearFunction"):
            pool.run(pool.malloc(1000, 0x1000, miss=True))
            with rec.function("ReLU"):
                pool.run(pool.malloc(1000, 0x2000, miss=True))
                pool.run(pool.malloc(9000, 0, failed_attempts=3))
        pool.run(pool.free(0x1000, 1024))
        with rec.function("ReLU", "backward"):
            pool.run(pool.malloc(1000, 0x1000))
    rows = json.loads(_cli("functions", str(path), "--format", "json"))["functions"]
    got = {r["name"]: (r["used_bytes"], r["acquired_bytes"], r["occurrence"]) for r in rows}
    assert got == {
        "ReLU": (1024 + 9216 + 1024, 1024 + 3 * 9216, 2),
        "LinearFunction": (1024 + 1024 + 9216, 1024 + 1024 + 3 * 9216, 1),
    }
    assert [r["name"] for r in rows] == ["ReLU", "LinearFunction"], "first return order"


# -- CuPy, on a CUDA device --------------------------------------------------------------------


def _cupy_with_device():
    if importlib.util.find_spec("cupy") is None:
        print("\nCuPy tests skipped: CuPy is not installed", file=sys.stderr)
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # no driver, no device
        count, why = 0, str(e)
    else:
        why = "no device"
    if count == 0:
        print(f"\nCuPy tests skipped: no CUDA device ({why})", file=sys.stderr)
        pytest.skip(f"CuPy has no CUDA device here ({why})")
    return cupy


def _program(cupy):
    # CuPy's LineProfileHook test, plus an array computation.
    pool = cupy.get_default_memory_pool()
    p = pool.malloc(1000)
    del p
    p1 = pool.malloc(1000)
    p2 = pool.malloc(2000)
    a = cupy.arange(10000, dtype=cupy.float32)
    b = (a * 2).sum()
    del p1, p2, a, b


def test_cupy_trace_hook_prints_line_profile_hooks_tree(tmp_path):
    cupy = _cupy_with_device()
    from cupy.cuda import memory_hooks

    import poolsight.cupy

    assert isinstance(poolsight.cupy.TraceHook, type)
    assert issubclass(poolsight.cupy.TraceHook, cupy.cuda.MemoryHook)
    cupy.get_default_memory_pool().free_all_blocks()
    path = tmp_path / "cupy.pstrace"
    line_hook = memory_hooks.LineProfileHook()
    with poolsight.record(path, stacks="python") as rec:
        with line_hook, poolsight.cupy.TraceHook(rec):
            _program(cupy)
    theirs = io.StringIO()
    line_hook.print_report(file=theirs)
    ours = _cli("lines", str(path))
    print("LineProfileHook.print_report():\n" + theirs.getvalue())
    print("poolsight lines:\n" + ours)
    assert ours == theirs.getvalue()

    # max_depth as LineProfileHook's.
    line_hook = memory_hooks.LineProfileHook(max_depth=3)
    path3 = tmp_path / "cupy3.pstrace"
    with poolsight.record(path3, stacks="python", max_depth=3) as rec:
        with line_hook, poolsight.cupy.TraceHook(rec):
            _program(cupy)
    theirs = io.StringIO()
    line_hook.print_report(file=theirs)
    assert _cli("lines", str(path3)) == theirs.getvalue()


def test_cupy_use_pool_records(tmp_path):
    cupy = _cupy_with_device()
    import poolsight.cupy

    path = tmp_path / "pool.pstrace"
    try:
        with poolsight.record(path) as rec:
            allocator = poolsight.cupy.use_pool(rec)
            with rec.function("work"):
                a = cupy.arange(1 << 20, dtype=cupy.float32)
                assert float((a * 2).sum()) == float(2 * (((1 << 20) - 1) * (1 << 20) // 2))
                del a
            stats = allocator.stats(cupy.cuda.Device().id)
            assert stats["total_bytes"] >= 4 << 20
    finally:
        cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)
    rows = json.loads(_cli("functions", str(path), "--format", "json"))["functions"]
    assert rows[0]["name"] == "work" and rows[0]["used_bytes"] >= 4 << 20
