"""What recording costs per PyTorch operator, where operators are cheap and many: a stack of
tiny layers (``--layers`` Linear(16, 16) + ReLU, a batch of 4) trained with SGD, so that a
step is hundreds of operators of microseconds each and what a recorder adds per operator is
most of the difference. Variants as ``torch_overhead.py`` names them (``plain``,
``track (native)``, ``hook (native)``, ``track+hook (native)``, the same with ``(python)``,
``profiler``), in a fresh order each repeat (shuffled, ``--seed``); the medians' CPU time
over the plain run, divided by the operators a dispatch mode sees, is the microseconds per
operator.

    python python/benchmarks/torch_per_op.py [--repeats 9] [--steps 200] [--layers 24] [--seed S]

Nothing is asserted: the figures are printed with the machine's load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch_overhead
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode


def make(layers: int):
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(16, 16), nn.ReLU())])
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    return model, optimizer, torch.randn(4, 16)


def train(model, optimizer, x, steps: int) -> None:
    for _ in range(steps):
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()


def operators(layers: int, steps: int) -> int:
    seen = 0

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            nonlocal seen
            seen += 1
            return func(*args, **(kwargs or {}))

    model, optimizer, x = make(layers)
    train(model, optimizer, x, 1)
    with Count():
        train(model, optimizer, x, steps)
    return seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=torch_overhead.positive, default=9)
    ap.add_argument("--steps", type=torch_overhead.positive, default=200)
    ap.add_argument("--layers", type=torch_overhead.positive, default=24)
    ap.add_argument("--only", nargs="*", help="variants to run (default: the native ones)")
    ap.add_argument("--seed", type=int, default=0, help="draws each repeat's order (default 0)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        table = torch_overhead.variants(tmp)
        names = args.only or ["track (native)", "hook (native)", "track+hook (native)", "profiler"]
        unknown = [n for n in names if n not in table]
        if unknown:
            ap.error(f"--only: no variant {unknown[0]!r} (variants: {', '.join(table)})")
        if "plain" not in names:
            names.insert(0, "plain")
        runs: dict[str, list[float]] = {n: [] for n in names}
        for r, order in enumerate(torch_overhead.orders(names, args.repeats + 1, args.seed)):
            for n in order:
                model, optimizer, x = make(args.layers)
                train(model, optimizer, x, 2)  # first-use costs outside the clock
                ctx = table[n](model, optimizer)
                ctx.__enter__()
                train(model, optimizer, x, 2)  # the recording's first sight of each stack
                t0 = time.process_time()
                train(model, optimizer, x, args.steps)
                t1 = time.process_time()
                ctx.__exit__(None, None, None)
                if r > 0:  # the first round warms every variant up
                    runs[n].append(t1 - t0)
        ops = operators(args.layers, args.steps)
        base = statistics.median(runs["plain"])
        print(
            f"torch {torch.__version__}, {args.steps} steps of {args.layers} Linear+ReLU layers, "
            f"{ops:,} operators, medians of {args.repeats} shuffled repeats (seed {args.seed}), "
            f"load average {os.getloadavg()[0]:.2f}"
        )
        print(f"{'variant':<22} {'CPU s':>8} {'x plain':>8} {'us/op':>8}")
        for n in names:
            m = statistics.median(runs[n])
            print(f"{n:<22} {m:>8.3f} {m / base:>8.2f} {(m - base) / ops * 1e6:>+8.2f}")
        print("us/op: CPU microseconds per operator over the plain run")


if __name__ == "__main__":
    main()
