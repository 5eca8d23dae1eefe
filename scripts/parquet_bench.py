#!/usr/bin/env python3
"""The Parquet export's figures (README, "Performance"): throughput and size on a large trace,
side by side with `report`; and a 64-rank synthetic job exported and queried in DuckDB.

    cargo build --release
    cargo bench --bench analyze -- --events 10M  # writes $TMPDIR/poolsight-bench-10000000.pstrace
    python3 scripts/parquet_bench.py --trace /tmp/poolsight-bench-10000000.pstrace
    python3 scripts/parquet_bench.py --fleet 64        # needs the poolsight package and duckdb

`--poolsight PATH` picks the binary (default target/release/poolsight). Each command runs
`--runs` times (default 3) and the fastest is reported; the page cache is warm (the trace is
read once first). Nothing is asserted: these are figures.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(cmd: list) -> tuple:
    """(seconds, peak RSS in MB) of one run of `cmd`."""
    t = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    s = time.perf_counter() - t
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise subprocess.CalledProcessError(child.returncode, cmd)
    return s, usage.ru_maxrss / 1024


def dir_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*.parquet"))


def large_trace(exe: str, trace: Path, runs: int) -> None:
    info = json.loads(
        subprocess.run(
            [exe, "info", trace, "--format", "json"], check=True, capture_output=True
        ).stdout
    )
    events = info["total_events"]
    size = trace.stat().st_size
    with open(trace, "rb") as f:
        while f.read(1 << 22):
            pass
    print(
        f"trace {trace}: {events / 1e6:.1f} M events, {size / 1e9:.2f} GB, "
        f"{size / events:.1f} B/event"
    )
    report = min(timed([exe, "report", trace]) for _ in range(runs))
    out = Path(tempfile.mkdtemp(prefix="poolsight-parquet-"))
    try:
        export = None
        for _ in range(runs):
            shutil.rmtree(out, ignore_errors=True)
            r = timed([exe, "export", "--format", "parquet", "-o", out, trace])
            export = r if export is None or r < export else export
        events_bytes = dir_bytes(out / "events")
        total_bytes = dir_bytes(out)
        shutil.rmtree(out, ignore_errors=True)
        summary = min(
            timed(
                [
                    exe,
                    "export",
                    "--format",
                    "parquet",
                    "--tables",
                    "summary",
                    "-o",
                    out,
                    trace,
                ]
            )
            for _ in range(runs)
        )
        summary_bytes = dir_bytes(out)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    print("| what | time | M events/s | output |")
    print("|---|---|---|---|")
    print(f"| `report` | {report[0]:.2f} s | {events / report[0] / 1e6:.0f} | (text) |")
    print(
        f"| `export --format parquet` | {export[0]:.2f} s | {events / export[0] / 1e6:.1f} | "
        f"{total_bytes / 1e6:.1f} MB: events {events_bytes / events:.2f} B/event "
        f"({size / events_bytes:.1f}x smaller than the trace) |"
    )
    print(
        f"| `export --format parquet --tables summary` | {summary[0]:.2f} s | "
        f"{events / summary[0] / 1e6:.0f} | {summary_bytes / 1e3:.0f} KB |"
    )
    print(f"peak RSS: report {report[1]:.0f} MB, export {export[1]:.0f} MB")


def query_time(con, sql: str, runs: int) -> tuple:
    """(fastest seconds, rows) of a query."""
    best, n = None, 0
    for _ in range(runs):
        t = time.perf_counter()
        n = len(con.execute(sql).fetchall())
        s = time.perf_counter() - t
        best = s if best is None else min(best, s)
    return best, n


def record_rank(path: Path, rank: int, world: int, steps: int) -> None:
    import poolsight

    with poolsight.record(path, rank=rank, world_size=world) as rec:
        pool = poolsight.Pool(rec, capacity=1 << 34)
        for epoch in range(1, 4):
            with rec.epoch(epoch):
                for _ in range(steps):
                    with rec.link("Transformer"):
                        for block in range(4):
                            with rec.function("Attention.forward"):
                                kept = [
                                    pool.malloc((1 + rank % 8) * 65536 + block * 512)
                                    for _ in range(4)
                                ]
                            with rec.function("MLP.forward"):
                                pool.free(pool.malloc(262144))
                            for p in kept:
                                pool.free(p)
                pool.free_all_blocks()


def fleet(exe: str, world: int, steps: int, runs: int) -> None:
    import duckdb

    work = Path(tempfile.mkdtemp(prefix="poolsight-fleet-"))
    try:
        traces = []
        t = time.perf_counter()
        for rank in range(world):
            p = work / f"rank{rank:03}.pstrace"
            record_rank(p, rank, world, steps)
            traces.append(p)
        record_s = time.perf_counter() - t
        events = sum(
            json.loads(
                subprocess.run(
                    [exe, "info", p, "--format", "json"],
                    check=True,
                    capture_output=True,
                ).stdout
            )["total_events"]
            for p in traces
        )
        trace_bytes = sum(p.stat().st_size for p in traces)
        print(
            f"{world} ranks recorded in {record_s:.1f} s: {events / 1e6:.2f} M events, "
            f"{trace_bytes / 1e6:.1f} MB of traces"
        )
        out = work / "dataset"
        export = None
        for _ in range(runs):
            shutil.rmtree(out, ignore_errors=True)
            r = timed(
                [
                    exe,
                    "export",
                    "--format",
                    "parquet",
                    "--tables",
                    "all",
                    "-o",
                    out,
                    *traces,
                ]
            )
            export = r if export is None or r < export else export
        print(
            f"export of the {world} traces (--tables all, in parallel): {export[0]:.2f} s, "
            f"{events / export[0] / 1e6:.1f} M events/s, {dir_bytes(out) / 1e6:.1f} MB, "
            f"{len(list(out.rglob('*.parquet')))} files"
        )
        text = (ROOT / "docs" / "queries.md").read_text()
        (setup,) = re.findall(r"```sql duckdb\n(.*?)```", text, re.DOTALL)
        con = duckdb.connect()
        for statement in setup.replace("DATASET", str(out)).split(";"):
            if statement.strip():
                con.execute(statement)
        for title in re.findall(r"^## (.+)$", text, re.MULTILINE):
            body = text.split("## " + title, 1)[1]
            m = re.search(r"```sql\n(.*?)```", body.split("\n## ", 1)[0], re.DOTALL)
            if not m:
                continue
            best, n = query_time(con, m.group(1), runs)
            print(f"| {title} | {best * 1000:.0f} ms | {n} rows |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--poolsight", default=str(ROOT / "target" / "release" / "poolsight"))
    ap.add_argument("--trace", type=Path, help="a large trace (the analyzer benchmark's)")
    ap.add_argument(
        "--fleet",
        type=int,
        metavar="RANKS",
        help="record, export and query a job of RANKS traces",
    )
    ap.add_argument("--steps", type=int, default=100, help="fleet: steps per epoch per rank")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    if not a.trace and not a.fleet:
        ap.error("give --trace and/or --fleet")
    print(f"poolsight {a.poolsight}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    if a.trace:
        large_trace(a.poolsight, a.trace, a.runs)
    if a.fleet:
        fleet(a.poolsight, a.fleet, a.steps, a.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
