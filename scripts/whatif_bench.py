"""How fast ``poolsight whatif`` answers on a large PyTorch snapshot, beside ``poolsight import``
of the same file (the conversion every command makes of a snapshot: the yardstick).

Writes the snapshot of ``scripts/snapshot_bench.py`` (``--entries`` trace entries, ``--depth``
frames each), then times, the rows taking turns ``--repeats`` times so that a busy machine weighs
on all of them alike:

- ``whatif snap.pickle``: the recorded settings and the four default alternatives (five
  replays), the snapshot read once;
- ``whatif snap.pickle --min-capacity``: the same, each setting's smallest capacity searched;
- ``import snap.pickle``: the conversion alone;
- ``whatif`` on the converted trace, with and without ``--min-capacity``.

Prints each row's median wall and CPU (user + system) seconds and largest peak RSS, and the load
average before and after (a 2-core machine shared with builds doubles wall times: read the CPU
column then). Usage: python scripts/whatif_bench.py [--entries 100000] [--repeats 5]
[--poolsight target/release/poolsight]."""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from snapshot_bench import make_snapshot  # noqa: E402


def timed(cmd: list[str]) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds and peak RSS (bytes) of a command, from a fresh interpreter
    so that its children's usage is this command's alone."""
    script = (
        "import resource, subprocess, sys, time\n"
        "t0 = time.perf_counter()\n"
        "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)\n"
        "wall = time.perf_counter() - t0\n"
        "r = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
        "print(wall, r.ru_utime + r.ru_stime, r.ru_maxrss)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, *cmd], check=True, capture_output=True, text=True
    ).stdout.split()
    return float(out[-3]), float(out[-2]), int(out[-1]) * 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--depth", type=int, default=50)
    ap.add_argument("--stacks", type=int, default=5000)
    ap.add_argument("--poolsight", default="target/release/poolsight")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    exe = args.poolsight if os.path.exists(args.poolsight) else shutil.which("poolsight")
    if exe is None:
        sys.exit("no poolsight binary: cargo build --release, or pass --poolsight")
    tmp = tempfile.mkdtemp(prefix="whatif-bench-")
    try:
        snap = os.path.join(tmp, "snapshot.pickle")
        with open(snap, "wb") as f:
            pickle.dump(make_snapshot(args.entries, args.depth, args.stacks), f)
        trace = os.path.join(tmp, "snapshot.pstrace")
        subprocess.run([exe, "import", snap, "-o", trace], check=True, capture_output=True)
        what = {
            "whatif snapshot (five settings)": [exe, "whatif", snap],
            "whatif snapshot --min-capacity": [exe, "whatif", snap, "--min-capacity"],
            "import snapshot (the yardstick)": [exe, "import", snap, "-o", trace, "--force"],
            "whatif converted trace": [exe, "whatif", trace],
            "whatif converted trace --min-capacity": [exe, "whatif", trace, "--min-capacity"],
        }
        load_before = os.getloadavg()
        runs: dict[str, list[tuple[float, float, int]]] = {name: [] for name in what}
        for _ in range(args.repeats):
            for name, cmd in what.items():
                runs[name].append(timed(cmd))
        load_after = os.getloadavg()
        size = os.path.getsize(snap) / 1e6
        print(f"snapshot: {args.entries} entries, {args.depth} frames each, {size:.1f} MB pickle")
        print(f"{'what':<40}{'wall s':>9}{'CPU s':>9}{'peak RSS':>11}")
        for name, rs in runs.items():
            wall = statistics.median(r[0] for r in rs)
            cpu = statistics.median(r[1] for r in rs)
            rss = max(r[2] for r in rs) / 2**20
            print(f"{name:<40}{wall:>9.3f}{cpu:>9.3f}{rss:>8.0f}MiB")
        print(
            f"medians of {args.repeats} runs; load average {load_before[0]:.2f} before, "
            f"{load_after[0]:.2f} after, on {os.cpu_count()} CPUs"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
