"""Reading a PyTorch memory snapshot: poolsight against PyTorch's own ``_memory_viz``.

Writes a snapshot in the layout of ``torch.cuda.memory._snapshot()`` (``--entries`` trace
entries with ``--depth`` frames each, a few thousand distinct tracebacks, each entry with
frame dicts of its own as in PyTorch's snapshots; blocks live at the end in ``segments``),
pickled as ``_dump_snapshot`` does, then times, on the same file:

- poolsight: ``import`` (MB/s of pickle, peak memory), ``report`` on the snapshot and on the
  converted trace;
- PyTorch: ``pickle.load`` plus ``_memory_viz.trace`` and ``segsum`` (what ``python -m
  torch.cuda._memory_viz trace|stats`` run), and ``pickle.load`` plus ``memory``'s folded
  stacks.

Each measurement runs ``--repeats`` times, the rows taking turns so that a busy machine
weighs on all of them alike; the table gives the median time and the largest peak RSS, and
the load average before and after.

Usage: python scripts/snapshot_bench.py [--entries 100000] [--depth 50] [--poolsight PATH]
(the release binary, target/release/poolsight, by default). Prints one table."""

from __future__ import annotations

import argparse
import os
import pickle
import random
import shutil
import statistics
import subprocess
import sys
import tempfile


def make_snapshot(entries: int, depth: int, stacks: int, seed: int = 0) -> dict:
    rng = random.Random(seed)
    files = [f"/src/project/model/layer_{i}.py" for i in range(40)]
    frame_pool = [
        {"filename": rng.choice(files), "line": rng.randrange(1, 2000), "name": f"fn_{i}"}
        for i in range(4 * depth)
    ]
    tracebacks = [
        [frame_pool[rng.randrange(len(frame_pool))] for _ in range(depth)] for _ in range(stacks)
    ]

    def frames() -> list:
        # Each entry has frame dicts of its own, as in PyTorch's snapshots (only the strings
        # are shared), so the pickle holds every frame: about 1 KB per entry at 50 frames.
        return [dict(f) for f in rng.choice(tracebacks)]

    base = 0x7F0000000000
    trace, live, t = [], {}, 1_700_000_000_000_000
    trace.append(
        {
            "action": "segment_alloc",
            "addr": base,
            "size": 1 << 34,
            "stream": 0,
            "time_us": t,
            "frames": frames(),
        }
    )
    next_addr = base
    while len(trace) < entries:
        t += rng.randrange(1, 50)
        if live and (len(live) > 2000 or rng.random() < 0.45):
            addr = rng.choice(list(live)) if len(live) < 64 else next(iter(live))
            size = live.pop(addr)
            for action in ("free_requested", "free_completed"):
                trace.append(
                    {
                        "action": action,
                        "addr": addr,
                        "size": size,
                        "stream": 0,
                        "time_us": t,
                        "frames": frames(),
                    }
                )
        else:
            size = 512 * rng.randrange(1, 4096)
            addr = next_addr
            next_addr += size
            live[addr] = size
            trace.append(
                {
                    "action": "alloc",
                    "addr": addr,
                    "size": size,
                    "stream": 0,
                    "time_us": t,
                    "frames": frames(),
                }
            )
    total = next_addr - base
    trace[0]["size"] = total
    blocks, addr = [], base
    for a in sorted(live):
        if a > addr:
            blocks.append(
                {
                    "address": addr,
                    "size": a - addr,
                    "requested_size": 0,
                    "state": "inactive",
                    "frames": [],
                }
            )
        blocks.append(
            {
                "address": a,
                "size": live[a],
                "requested_size": live[a],
                "state": "active_allocated",
                "frames": frames(),
            }
        )
        addr = a + live[a]
    if base + total > addr:
        blocks.append(
            {
                "address": addr,
                "size": base + total - addr,
                "requested_size": 0,
                "state": "inactive",
                "frames": [],
            }
        )
    seg = {
        "device": 0,
        "address": base,
        "total_size": total,
        "stream": 0,
        "segment_type": "large",
        "allocated_size": 0,
        "active_size": 0,
        "requested_size": 0,
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "blocks": blocks,
    }
    return {"segments": [seg], "device_traces": [trace], "allocator_settings": {}}


def timed(cmd: list[str]) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of a command, run from a fresh interpreter so that
    its children's maximum RSS is this command's."""
    script = (
        "import resource, subprocess, sys, time\n"
        "t0 = time.perf_counter()\n"
        "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)\n"
        "print(time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, *cmd], check=True, capture_output=True, text=True
    ).stdout.split()
    return float(out[-2]), int(out[-1]) * 1024


def python_timed(code: str, path: str) -> tuple[float, int]:
    script = (
        "import pickle, resource, sys, time\n"
        "from torch.cuda import _memory_viz as mv\n"
        "t0 = time.perf_counter()\n"
        f"data = pickle.load(open({path!r}, 'rb'))\n"
        f"{code}\n"
        "print(time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], check=True, capture_output=True, text=True
    ).stdout.split()
    return float(out[-2]), int(out[-1]) * 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--depth", type=int, default=50)
    ap.add_argument("--stacks", type=int, default=5000)
    ap.add_argument("--poolsight", default="target/release/poolsight")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    exe = args.poolsight if os.path.exists(args.poolsight) else shutil.which("poolsight")
    tmp = tempfile.mkdtemp(prefix="snapshot-bench-")
    try:
        snap = os.path.join(tmp, "snapshot.pickle")
        with open(snap, "wb") as f:
            pickle.dump(make_snapshot(args.entries, args.depth, args.stacks), f)
        size = os.path.getsize(snap)
        trace = os.path.join(tmp, "snapshot.pstrace")

        # In this order: each round's reports read the trace its import wrote.
        what = {
            "poolsight import": lambda: timed([exe, "import", snap, "-o", trace, "--force"]),
            "poolsight report (snapshot)": lambda: timed([exe, "report", snap]),
            "poolsight report (converted trace)": lambda: timed([exe, "report", trace]),
            "_memory_viz load + trace + segsum": lambda: python_timed(
                "mv.trace(data); mv.segsum(data)", snap
            ),
            "_memory_viz load + memory": lambda: python_timed(
                "mv.memory(data, format_flamegraph=lambda s: s)", snap
            ),
        }
        load_before = os.getloadavg()
        runs = {name: [] for name in what}
        for _ in range(args.repeats):
            for name, fn in what.items():
                runs[name].append(fn())
        load_after = os.getloadavg()
        rows = {
            name: (statistics.median(r[0] for r in rs), max(r[1] for r in rs))
            for name, rs in runs.items()
        }
        mb = size / 1e6
        print(
            f"snapshot: {args.entries} entries, {args.depth} frames each, "
            f"{args.stacks} distinct stacks, {mb:.1f} MB pickle"
        )
        print(f"{'what':<38}{'seconds':>9}{'MB/s':>9}{'peak RSS':>11}{'x pickle':>10}")
        for name, (sec, rss) in rows.items():
            print(f"{name:<38}{sec:>9.3f}{mb / sec:>9.1f}{rss / 1e6:>9.1f}MB{rss / size:>10.2f}")
        ratio = (
            rows["poolsight report (snapshot)"][0] / rows["poolsight report (converted trace)"][0]
        )
        print(f"report on the snapshot / on the converted trace: {ratio:.2f}x")
        print(
            f"medians of {args.repeats} runs; load average {load_before[0]:.2f} before, "
            f"{load_after[0]:.2f} after"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
