"""What poolsight.cupy.TraceHook costs per CuPy malloc+free.

    python python/benchmarks/cupy_hooks.py [--n N]

1. CPU only (runs anywhere, CuPy not needed): the callbacks CuPy makes for one malloc+free from
   its cache (malloc_pre, malloc_post, free_pre, free_post), called directly with CuPy's
   keyword arguments, on TraceHook's callbacks (the native sink, scope stacks and Python
   stacks) vs empty Python methods (what an empty ``MemoryHook`` subclass costs).
2. With CuPy and a GPU: ``pool.malloc(1000)`` + free through CuPy's pool with no hook, an empty
   ``MemoryHook`` subclass, and TraceHook, side by side.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import poolsight
from poolsight import _native


def _per_call_ns(fn, n: int, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        fn(n)
        times.append((time.perf_counter_ns() - t0) / n)
    return statistics.median(times)


class _Empty:
    def malloc_preprocess(self, **kwargs):
        pass

    def malloc_postprocess(self, **kwargs):
        pass

    def free_preprocess(self, **kwargs):
        pass

    def free_postprocess(self, **kwargs):
        pass


def _callbacks_loop(hook):
    mpre, mpost = hook.malloc_preprocess, hook.malloc_postprocess
    fpre, fpost = hook.free_preprocess, hook.free_postprocess

    def loop(n):
        for _ in range(n):
            mpre(device_id=0, size=1000, mem_size=1024)
            mpost(device_id=0, size=1000, mem_size=1024, mem_ptr=0x7F0000001000, pmem_id=1234)
            fpre(device_id=0, mem_size=1024, mem_ptr=0x7F0000001000, pmem_id=1234)
            fpost(device_id=0, mem_size=1024, mem_ptr=0x7F0000001000, pmem_id=1234)

    return loop


def cpu(n: int) -> None:
    print(f"CPU: CuPy's four callbacks of one cached malloc+free, called directly (n={n})")
    base = _per_call_ns(lambda k: [None for _ in range(k)], n)
    empty = _per_call_ns(_callbacks_loop(_Empty()), n) - base
    rows = [("empty MemoryHook methods (Python)", empty)]
    with tempfile.TemporaryDirectory() as d:
        for stacks in ("scopes", "python"):
            with poolsight.record(os.path.join(d, f"{stacks}.pstrace"), stacks=stacks) as rec:
                sink = _native.CupyHookSink(rec._native, stacks == "python", 0, False)
                t = _per_call_ns(_callbacks_loop(sink), n) - base
            rows.append((f"TraceHook, stacks={stacks!r}", t))
    for name, t in rows:
        print(f"  {name:<36} {t:8.0f} ns per malloc+free  ({t - empty:+6.0f} ns vs empty)")


def gpu(n: int) -> None:
    try:
        import cupy
    except ImportError:
        print("GPU: skipped, CuPy is not installed (the GPU figures need CuPy and a CUDA device)")
        return
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        count, why = 0, str(e)
    else:
        why = "no device"
    if count == 0:
        print(f"GPU: skipped, this benchmark needs a CUDA device ({why})")
        return
    import poolsight.cupy

    pool = cupy.get_default_memory_pool()
    pool.free_all_blocks()
    pool.malloc(1000)  # warm the cache: every malloc below is a cache hit

    def loop(k):
        for _ in range(k):
            p = pool.malloc(1000)
            del p

    class EmptyHook(cupy.cuda.MemoryHook):
        name = "EmptyHook"

    print(f"GPU: CuPy pool.malloc(1000) + free from the cache (n={n})")
    none = _per_call_ns(loop, n)
    with EmptyHook():
        empty = _per_call_ns(loop, n)
    rows = [("no hook", none), ("empty MemoryHook subclass", empty)]
    with tempfile.TemporaryDirectory() as d:
        for stacks in ("scopes", "python"):
            with poolsight.record(os.path.join(d, f"{stacks}.pstrace"), stacks=stacks) as rec:
                with poolsight.cupy.TraceHook(rec):
                    rows.append((f"TraceHook, stacks={stacks!r}", _per_call_ns(loop, n)))
    for name, t in rows:
        print(f"  {name:<36} {t:8.0f} ns per malloc+free  ({t - none:+6.0f} ns vs no hook)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000)
    args = ap.parse_args()
    print(f"Python {sys.version.split()[0]}, poolsight {poolsight.__version__}")
    cpu(args.n)
    gpu(args.n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
