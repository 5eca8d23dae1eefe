"""What recording costs from Python, side by side in one run (medians of several repeats):

- a scope (`with rec.scope(...)`) vs an empty `with` block (the floor of any context manager);
- a decorated function call vs a plain call;
- a pool malloc+free from Python with scopes stacks and with Python stacks.

    python python/benchmarks/overhead.py [--n 200000]
"""

import argparse
import os
import statistics
import tempfile
import time

import poolsight


class Empty:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def per_call(fn, n, repeats=7):
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn(n)
        samples.append((time.perf_counter_ns() - t0) / n)
    return statistics.median(samples)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000)
    n = ap.parse_args().n
    rows = []
    with tempfile.TemporaryDirectory() as d:
        with poolsight.record(os.path.join(d, "bench.pstrace")) as rec:
            empty = Empty()
            scope = rec.scope("step")

            def with_empty(k):
                for _ in range(k):
                    with empty:
                        pass

            def with_scope(k):
                for _ in range(k):
                    with scope:
                        pass

            def plain(x):
                return x

            decorated = rec.function("f")(plain)

            def call_plain(k):
                for i in range(k):
                    plain(i)

            def call_decorated(k):
                for i in range(k):
                    decorated(i)

            rows.append(("empty `with` block", per_call(with_empty, n)))
            rows.append(("`with rec.scope(...)`", per_call(with_scope, n)))
            rows.append(("plain function call", per_call(call_plain, n)))
            rows.append(("`@rec.function` call", per_call(call_decorated, n)))

            pool = poolsight.Pool(rec, stacks="scopes")
            pystack = poolsight.Pool(rec, stacks="python")

            def alloc(p):
                def run(k):
                    for _ in range(k):
                        p.free(p.malloc(4096))

                return run

            rows.append(("Pool malloc+free, scopes stacks", per_call(alloc(pool), n // 4)))
            rows.append(("Pool malloc+free, Python stacks", per_call(alloc(pystack), n // 4)))
    width = max(len(r[0]) for r in rows)
    print(f"{'what':<{width}}  ns/call")
    for name, ns in rows:
        print(f"{name:<{width}}  {ns:7.1f}")
    print(
        f"scope overhead over an empty `with`: {rows[1][1] - rows[0][1]:.1f} ns; "
        f"decorator over a plain call: {rows[3][1] - rows[2][1]:.1f} ns"
    )


if __name__ == "__main__":
    main()
