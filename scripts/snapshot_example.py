"""A CUDA-like memory snapshot of a real training run, on a machine without a GPU: the
snapshot of docs/html-snapshot.png.

PyTorch's ``_memory_viz._profile_to_snapshot`` turns a CPU profile (here an MLP trained with
AdamW for a few steps) into a snapshot dict, but a CPU run has no caching allocator: its one
segment spans every CPU address (tens of TB). This script places the same blocks, in the same
order and with the same stacks and categories, in a simple caching allocator's segments
(20 MiB, blocks rounded to 512 bytes, a freed block reused by the next request of its size),
adds ``time_us`` and the ``free_requested``/``free_completed`` pair of each free, and pickles it
as ``_dump_snapshot`` does.

Usage: python scripts/snapshot_example.py OUT.pickle
then:  poolsight html OUT.pickle -o snapshot.html"""

from __future__ import annotations

import pickle
import sys
from collections import defaultdict

import torch
from torch.cuda._memory_viz import _profile_to_snapshot
from torch.profiler import ProfilerActivity, profile

SEGMENT = 20 << 20


def train_profile() -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 1024),
        torch.nn.GELU(),
        torch.nn.Linear(1024, 1024),
        torch.nn.GELU(),
        torch.nn.Linear(1024, 10),
    )
    opt = torch.optim.AdamW(model.parameters())
    x, y = torch.randn(512, 256), torch.randint(0, 10, (512,))
    with profile(
        activities=[ProfilerActivity.CPU],
        profile_memory=True,
        with_stack=True,
        record_shapes=True,
    ) as prof:
        for _ in range(4):
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    return _profile_to_snapshot(prof)


class Allocator:
    def __init__(self) -> None:
        self.segments: list[dict] = []
        self.free: dict[int, list[int]] = defaultdict(list)
        self.next_base = 0x7F0000000000

    def place(self, size: int) -> tuple[int, int, dict | None]:
        """(address, rounded size, the segment allocated for it or None)."""
        rounded = max(512, (size + 511) // 512 * 512)
        if self.free[rounded]:
            return self.free[rounded].pop(), rounded, None
        for seg in self.segments:
            if seg["bump"] + rounded <= seg["address"] + seg["total_size"]:
                addr = seg["bump"]
                seg["bump"] += rounded
                return addr, rounded, None
        total = max(SEGMENT, (rounded + (2 << 20) - 1) // (2 << 20) * (2 << 20))
        seg = {"address": self.next_base, "total_size": total, "bump": self.next_base}
        self.next_base += total + (64 << 20)
        self.segments.append(seg)
        seg["bump"] += rounded
        return seg["address"], rounded, seg


def cuda_like(snap: dict) -> dict:
    entries = snap["device_traces"][0]
    # Blocks the trace frees without allocating, and blocks live in the segments that it
    # did not allocate: live before the trace.
    live, before = set(), []
    for e in entries:
        if e["action"] == "alloc":
            live.add(e["addr"])
        elif e["action"] == "free_completed" and e["addr"] not in live:
            before.append((e["addr"], e["size"], e["frames"], e.get("category")))
        elif e["action"] == "free_completed":
            live.discard(e["addr"])
    for seg in snap["segments"]:
        addr = seg["address"]
        for b in seg["blocks"]:
            if b["state"] == "active_allocated" and addr not in live:
                before.append((addr, b["requested_size"], b["frames"], None))
            addr += b["size"]
    heap = Allocator()
    where: dict[int, tuple[int, int, int, list, str | None]] = {}
    for addr, size, frames, category in before:
        new, rounded, _ = heap.place(size)
        where[addr] = (new, rounded, size, frames, category)
    trace, t = [], 1_000_000
    for e in entries:
        t += 7
        if e["action"] == "alloc":
            new, rounded, seg = heap.place(e["size"])
            if seg is not None:
                trace.append(
                    {
                        "action": "segment_alloc",
                        "addr": seg["address"],
                        "size": seg["total_size"],
                        "stream": 0,
                        "time_us": t,
                        "frames": e["frames"],
                    }
                )
            where[e["addr"]] = (new, rounded, e["size"], e["frames"], e.get("category"))
            trace.append(dict(e, addr=new, size=rounded, time_us=t))
        elif e["action"] == "free_completed" and e["addr"] in where:
            new, rounded, _, frames, _ = where.pop(e["addr"])
            for action in ("free_requested", "free_completed"):
                trace.append(
                    {
                        "action": action,
                        "addr": new,
                        "size": rounded,
                        "stream": 0,
                        "time_us": t,
                        "frames": e["frames"],
                    }
                )
            heap.free[rounded].append(new)
    segments = []
    by_addr = sorted(where.values())
    for seg in heap.segments:
        start, end = seg["address"], seg["address"] + seg["total_size"]
        blocks, at = [], start
        for new, rounded, size, frames, _ in by_addr:
            if start <= new < end:
                if new > at:
                    blocks.append(
                        {"size": new - at, "requested_size": 0, "state": "inactive", "frames": []}
                    )
                blocks.append(
                    {
                        "size": rounded,
                        "requested_size": size,
                        "state": "active_allocated",
                        "frames": frames,
                    }
                )
                at = new + rounded
        if at < end:
            blocks.append(
                {"size": end - at, "requested_size": 0, "state": "inactive", "frames": []}
            )
        segments.append(
            {
                "device": 0,
                "address": start,
                "total_size": seg["total_size"],
                "stream": 0,
                "segment_type": "large",
                "allocated_size": 0,
                "active_size": 0,
                "requested_size": 0,
                "is_expandable": False,
                "blocks": blocks,
            }
        )
    return {"segments": segments, "device_traces": [trace]}


if __name__ == "__main__":
    with open(sys.argv[1], "wb") as f:
        pickle.dump(cuda_like(train_profile()), f)
