"""What predicting one CUDA training step costs on a machine without a GPU, beside PyTorch's
``MemTracker`` under fake tensors, in one run.

The model is a decoder-only Transformer LM (RMSNorm, rotary-free multi-head attention written
out, SwiGLU feed-forward) in the sizes of the well-known course configurations (``--size``:
``small`` 12 layers of 768, ``medium`` 24 of 1024, ``2.7b`` 32 of 2560 with a 10,240-wide
feed-forward: 2.7 billion parameters), vocabulary 10,000, batch 4, ``--context`` tokens. One
full step: the model built on the CPU and moved to ``cuda``, forward, cross-entropy,
``backward()``, ``torch.optim.AdamW.step()``, ``zero_grad()``. Each tool runs it in a fresh
process (``--tool``), which prints its wall time, its peak RSS and the peak it predicts:

- ``poolsight``: ``poolsight.torch.fake_cuda("H100-80GB")``, the script's code unmodified;
- ``memtracker``: ``torch.distributed._tools.mem_tracker.MemTracker`` with the model built and
  run under ``FakeTensorMode`` (as its documentation shows; built on ``cuda``), with
  poolsight's autograd-engine workaround installed so that ``backward()`` runs at all on a
  machine without a GPU.

Without ``--tool`` it runs both, each in its own process, and prints the two side by side::

    python python/benchmarks/predict_step.py --size 2.7b --context 512
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

SIZES = {
    "tiny": (2, 64, 256, 4),
    "small": (12, 768, 3072, 12),
    "medium": (24, 1024, 4096, 16),
    "2.7b": (32, 2560, 10240, 32),
}
VOCAB = 10_000
BATCH = 4


class RMSNorm(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight


class Block(nn.Module):
    def __init__(self, d: int, d_ff: int, heads: int):
        super().__init__()
        self.heads = heads
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.out = nn.Linear(d, d, bias=False)
        self.w1 = nn.Linear(d, d_ff, bias=False)
        self.w3 = nn.Linear(d, d_ff, bias=False)
        self.w2 = nn.Linear(d_ff, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        q, k, v = (y.transpose(1, 2) for y in (q, k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
        attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.out(attn)
        h = self.n2(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class LM(nn.Module):
    def __init__(self, layers: int, d: int, d_ff: int, heads: int):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.blocks = nn.ModuleList(Block(d, d_ff, heads) for _ in range(layers))
        self.norm = RMSNorm(d)
        self.head = nn.Linear(d, VOCAB, bias=False)

    def forward(self, ids):
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x))


def train(model: nn.Module, opt: torch.optim.Optimizer, context: int) -> None:
    """One full training step on random tokens."""
    ids = torch.randint(0, VOCAB, (BATCH, context), device="cuda")
    logits = model(ids)
    loss = F.cross_entropy(logits.view(-1, VOCAB), ids.view(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def step(size: str, context: int) -> None:
    """The user's code: build on the CPU, move to CUDA, one full training step."""
    model = LM(*SIZES[size]).to("cuda")
    train(model, torch.optim.AdamW(model.parameters(), lr=1e-3), context)


def run_poolsight(size: str, context: int) -> dict:
    import poolsight.torch as pst

    with pst.fake_cuda("H100-80GB") as run:
        step(size, context)
        peak = torch.cuda.max_memory_allocated()
    return {"peak_bytes": peak, "reserved_bytes": run.peak_reserved_bytes}


def run_memtracker(size: str, context: int) -> dict:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from poolsight._fake import engine

    patch = engine.patch() if engine.needed() else None
    if patch is not None:
        patch.apply()
    try:
        with FakeTensorMode():
            # Built on the device (`.to("cuda")` of a model built under fake mode cannot swap
            # its fake parameters).
            with torch.device("cuda"):
                model = LM(*SIZES[size])
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            mt = MemTracker()
            mt.track_external(model, opt)
            with mt:
                train(model, opt, context)
            peak = mt.get_tracker_snapshot("peak")
        total = sum(v.get("Total", 0) for v in peak.values())
    finally:
        if patch is not None:
            patch.undo()
    return {"peak_bytes": total, "reserved_bytes": None}


def one(tool: str, size: str, context: int) -> dict:
    torch.set_num_threads(1)
    start = time.perf_counter()
    figures = (run_poolsight if tool == "poolsight" else run_memtracker)(size, context)
    figures["wall_s"] = time.perf_counter() - start
    figures["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    figures["tool"] = tool
    return figures


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=sorted(SIZES), default="2.7b")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--tool", choices=("poolsight", "memtracker"))
    args = p.parse_args(argv)
    if args.tool:
        print(json.dumps(one(args.tool, args.size, args.context)))
        return 0
    rows = []
    for tool in ("poolsight", "memtracker"):
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--tool",
                tool,
                "--size",
                args.size,
                "--context",
                str(args.context),
            ],
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            tail = out.stderr.strip().splitlines()[-1:] or ["(no output)"]
            print(f"{tool}: failed: {tail[0]}")
            continue
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(
        f"one full step of the {args.size} LM, context {args.context}, batch {BATCH}, "
        "on fake CUDA tensors (H100-80GB)"
    )
    print(f"{'tool':<11} {'wall':>8} {'peak RSS':>10} {'active peak':>12} {'reserved peak':>14}")
    for r in rows:
        res = "-" if r["reserved_bytes"] is None else f"{r['reserved_bytes'] / 2**30:.2f} GiB"
        print(
            f"{r['tool']:<11} {r['wall_s']:>6.1f} s {r['peak_rss_bytes'] / 2**30:>6.2f} GiB "
            f"{r['peak_bytes'] / 2**30:>8.2f} GiB {res:>14}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
