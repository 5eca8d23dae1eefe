"""Reading a PyTorch memory snapshot: poolsight against PyTorch's own ``_memory_viz``.

Writes a snapshot in the layout of ``torch.cuda.memory._snapshot()`` (``--entries`` trace
entries with ``--depth`` frames each, a few thousand distinct tracebacks, each entry with
frame dicts of its own as in PyTorch's snapshots; blocks live at the end in ``segments``),
pickled as ``_dump_snapshot`` does, then times, on the same file:

- poolsight: ``import`` (MB/s of pickle, peak memory), ``report`` on the snapshot and on the
  converted trace, ``html`` on the snapshot (and the page's size);
- PyTorch: ``pickle.load`` plus ``_memory_viz.trace`` and ``segsum`` (what ``python -m
  torch.cuda._memory_viz trace|stats`` run), and ``pickle.load`` plus ``memory``'s folded
  stacks.

The snapshot is written entry by entry (``write_snapshot``), so a 1 GB one (``--entries
830000``) needs no more memory than a small one; ``--write PATH`` only writes it. Each
measurement runs ``--repeats`` times, the rows taking turns so that a busy machine
weighs on all of them alike; the table gives the median time and the largest peak RSS, and
the load average before and after.

Usage: python scripts/snapshot_bench.py [--entries 100000] [--depth 50] [--poolsight PATH]
[--no-pytorch] [--write PATH] (the release binary, target/release/poolsight, by default).
Prints one table."""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile


class Layout:
    """A snapshot in the layout of ``torch.cuda.memory._snapshot()``: ``entries`` trace entries
    with ``depth`` frames each, drawn from ``stacks`` distinct tracebacks, each entry with frame
    dicts of its own (only the strings are shared, as in PyTorch's snapshots: about 1 KB per
    entry at 50 frames); the blocks live at the end in ``segments``. One segment holds every
    block; its size is an upper bound known before the first entry, so that the entries can be
    written as they are made ([`write_snapshot`])."""

    def __init__(self, entries: int, depth: int, stacks: int, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        files = [f"/src/project/model/layer_{i}.py" for i in range(40)]
        self.frame_pool = [
            {
                "filename": self.rng.choice(files),
                "line": self.rng.randrange(1, 2000),
                "name": f"fn_{i}",
            }
            for i in range(4 * depth)
        ]
        self.tracebacks = [
            [self.frame_pool[self.rng.randrange(len(self.frame_pool))] for _ in range(depth)]
            for _ in range(stacks)
        ]
        self.entries = entries
        self.base = 0x7F0000000000
        self.total = 512 * 4096 * max(entries, 1)
        self.live: dict[int, int] = {}

    def frames(self) -> tuple[int, list]:
        """A traceback's index and frame dicts of its own."""
        i = self.rng.randrange(len(self.tracebacks))
        return i, [dict(f) for f in self.tracebacks[i]]

    def trace(self):
        """The trace entries, each with the index of its traceback."""
        t = 1_700_000_000_000_000

        def entry(action, addr, size):
            i, frames = self.frames()
            return i, {
                "action": action,
                "addr": addr,
                "size": size,
                "stream": 0,
                "time_us": t,
                "frames": frames,
            }

        yield entry("segment_alloc", self.base, self.total)
        n, next_addr, live = 1, self.base, self.live
        while n < self.entries:
            t += self.rng.randrange(1, 50)
            if live and (len(live) > 2000 or self.rng.random() < 0.45):
                addr = self.rng.choice(list(live)) if len(live) < 64 else next(iter(live))
                size = live.pop(addr)
                for action in ("free_requested", "free_completed"):
                    yield entry(action, addr, size)
                    n += 1
            else:
                size = 512 * self.rng.randrange(1, 4096)
                addr = next_addr
                next_addr += size
                live[addr] = size
                yield entry("alloc", addr, size)
                n += 1

    def segments(self) -> list:
        """The segments at the end (after [`trace`] is exhausted)."""
        base, total, live = self.base, self.total, self.live

        def block(addr, size, state, frames):
            return {
                "address": addr,
                "size": size,
                "requested_size": size if state == "active_allocated" else 0,
                "state": state,
                "frames": frames,
            }

        blocks, addr = [], base
        for a in sorted(live):
            if a > addr:
                blocks.append(block(addr, a - addr, "inactive", []))
            blocks.append(block(a, live[a], "active_allocated", self.frames()[1]))
            addr = a + live[a]
        if base + total > addr:
            blocks.append(block(addr, base + total - addr, "inactive", []))
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
        return [seg]


def make_snapshot(entries: int, depth: int, stacks: int, seed: int = 0) -> dict:
    """The snapshot as one value (small sizes: it holds every frame dict)."""
    layout = Layout(entries, depth, stacks, seed)
    trace = [e for _, e in layout.trace()]
    return {
        "device_traces": [trace],
        "segments": layout.segments(),
        "allocator_settings": {},
    }


class _Pickler:
    """Writes values as ``pickle.dump`` does with protocol 4 (less the optional framing):
    every string and container memoized, a string written again a memo reference, items in
    batches of 1,000. Only what a snapshot holds: dicts, lists, tuples, str, int, bool."""

    def __init__(self, out) -> None:
        self.out = out
        self.memo: dict[str, int] = {}
        self.n = 0

    def memoize(self) -> bytes:
        self.n += 1
        return b"\x94"

    def str_(self, s: str) -> bytes:
        i = self.memo.get(s)
        if i is not None:
            return b"h" + bytes([i]) if i < 256 else b"j" + struct.pack("<I", i)
        b = s.encode()
        head = b"\x8c" + bytes([len(b)]) if len(b) < 256 else b"X" + struct.pack("<I", len(b))
        self.memo[s] = self.n
        return head + b + self.memoize()

    def value(self, v) -> bytes:
        if isinstance(v, bool):
            return b"\x88" if v else b"\x89"
        if isinstance(v, int):
            if 0 <= v < 256:
                return b"K" + bytes([v])
            if 0 <= v < 65536:
                return b"M" + struct.pack("<H", v)
            if -(2**31) <= v < 2**31:
                return b"J" + struct.pack("<i", v)
            n = (v.bit_length() + 8) // 8
            return b"\x8a" + bytes([n]) + v.to_bytes(n, "little", signed=True)
        if isinstance(v, str):
            return self.str_(v)
        if isinstance(v, tuple):
            if len(v) != 2:
                raise TypeError("only pairs")
            items = self.value(v[0]) + self.value(v[1])
            return items + b"\x86" + self.memoize()
        if isinstance(v, dict):
            out = [b"}", self.memoize()]
            kv = [self.value(k) + self.value(x) for k, x in v.items()]
            out += self.batches(kv, b"s", b"u")
            return b"".join(out)
        if isinstance(v, list):
            out = [b"]", self.memoize()]
            out += self.batches([self.value(x) for x in v], b"a", b"e")
            return b"".join(out)
        raise TypeError(type(v).__name__)

    @staticmethod
    def batches(items: list, one: bytes, many: bytes) -> list:
        out = []
        for i in range(0, len(items), 1000):
            batch = items[i : i + 1000]
            out += batch + [one] if len(batch) == 1 else [b"("] + batch + [many]
        return out


def write_snapshot(path: str, entries: int, depth: int, stacks: int, seed: int = 0) -> None:
    """Writes [`make_snapshot`]'s value to ``path`` as ``pickle.dump`` would, entry by entry:
    a 1 GB snapshot is written without holding its 40 million frame dicts. A traceback's frame
    list, once each of its strings has been memoized, has the same bytes every time (new
    dicts and a list are each one MEMOIZE, which names no index), so it is encoded once."""
    layout = Layout(entries, depth, stacks, seed)
    with open(path, "wb") as f:
        p = _Pickler(f)
        f.write(b"\x80\x04}" + p.memoize() + b"(")
        f.write(p.str_("device_traces") + b"]" + p.memoize() + b"]" + p.memoize())
        cached: dict[int, tuple[bytes, int]] = {}
        batch: list[bytes] = []

        def flush() -> None:
            f.write(batch[0] + b"a" if len(batch) == 1 else b"(" + b"".join(batch) + b"e")
            batch.clear()

        for tb, e in layout.trace():
            frames = e.pop("frames")
            # The entry less its SETITEMS, then its frames (in the order they are memoized).
            head = p.value(e)[:-1] + p.str_("frames")
            if tb in cached:
                body, count = cached[tb]
                p.n += count
            else:
                before = p.n
                body = p.value(frames)
                if not any(k in body for k in (b"\x8c", b"X")):
                    cached[tb] = (body, p.n - before)
            batch.append(head + body + b"u")
            if len(batch) == 1000:
                flush()
        if batch:
            flush()
        f.write(b"a")  # the trace into device_traces
        f.write(p.str_("segments") + p.value(layout.segments()))
        f.write(p.str_("allocator_settings") + b"}" + p.memoize())
        f.write(b"u.")


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
    ap.add_argument(
        "--write", metavar="PATH", help="only write the snapshot to PATH (no timing), and keep it"
    )
    ap.add_argument(
        "--no-pytorch",
        action="store_true",
        help="leave PyTorch's _memory_viz out (it needs about 18x the pickle in memory)",
    )
    args = ap.parse_args()
    if args.write:
        write_snapshot(args.write, args.entries, args.depth, args.stacks)
        print(f"{args.write}: {os.path.getsize(args.write) / 1e6:.1f} MB")
        return
    exe = args.poolsight if os.path.exists(args.poolsight) else shutil.which("poolsight")
    tmp = tempfile.mkdtemp(prefix="snapshot-bench-")
    try:
        snap = os.path.join(tmp, "snapshot.pickle")
        write_snapshot(snap, args.entries, args.depth, args.stacks)
        size = os.path.getsize(snap)
        trace = os.path.join(tmp, "snapshot.pstrace")
        page = os.path.join(tmp, "snapshot.html")

        # In this order: each round's reports read the trace its import wrote.
        what = {
            "poolsight import": lambda: timed([exe, "import", snap, "-o", trace, "--force"]),
            "poolsight report (snapshot)": lambda: timed([exe, "report", snap]),
            "poolsight report (converted trace)": lambda: timed([exe, "report", trace]),
            "poolsight html (snapshot)": lambda: timed([exe, "html", snap, "-o", page]),
        }
        if not args.no_pytorch:
            what["_memory_viz load + trace + segsum"] = lambda: python_timed(
                "mv.trace(data); mv.segsum(data)", snap
            )
            what["_memory_viz load + memory"] = lambda: python_timed(
                "mv.memory(data, format_flamegraph=lambda s: s)", snap
            )
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
        imported = rows["poolsight import"][0]
        report = rows["poolsight report (snapshot)"][0]
        ratio = report / rows["poolsight report (converted trace)"][0]
        print(f"report on the snapshot / on the converted trace: {ratio:.2f}x")
        print(
            f"report / import: {report / imported:.2f}x; "
            f"html / import: {rows['poolsight html (snapshot)'][0] / imported:.2f}x; "
            f"the page: {os.path.getsize(page) / 1e6:.2f} MB"
        )
        print(
            f"medians of {args.repeats} runs; load average {load_before[0]:.2f} before, "
            f"{load_after[0]:.2f} after"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
