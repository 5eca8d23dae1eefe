"""What recording a PyTorch training epoch costs, against PyTorch's own memory tools, in one run.

A CNN + Transformer-encoder classifier, AdamW, synthetic images, on CPU (one intra-op thread so
that the figures are CPU time of one core). Each variant trains one epoch; the variants run in
a fresh order each repeat (shuffled, ``--seed``), and the medians are compared with the plain
run. A run is what a user records: ``--epochs`` epochs (3, as the example of issue 26) of
``--steps`` steps (16: the 512 images once) inside one recording, the first epoch's ratio
printed apart (it pays the recording's first sight of every stack and tensor). The recording
is opened and the hooks installed before the first epoch's clock starts, and finished after
the last stops: those costs are once per run, printed on their own:

- ``plain``: no recording;
- ``plain (again)``: the same, a second time in each repeat: its ratios are the machine's
  noise, the yardstick for every other row's;
- ``track``, ``hook``, ``track+hook``: ``poolsight.torch.track(model, optimizer)`` and
  ``poolsight.torch.hook(model)``, alone and together, as the README shows them, with each
  backend: ``(native)``, PyTorch's C++ callbacks (built on first use, before the clocks
  start), and ``(python)``, the dispatch mode;
- ``MemTracker``: ``torch.distributed._tools.mem_tracker.MemTracker`` (PyTorch's per-category
  tracker), the step inside it;
- ``profiler``: ``torch.profiler.profile(profile_memory=True, with_stack=True)``;
- ``memory history`` (with ``--device cuda`` only): PyTorch's CUDA memory history,
  ``torch.cuda.memory._record_memory_history(stacks="python")``, and the snapshot taken when the
  run ends (what the viewer and ``poolsight`` read);
- ``empty mode``: a ``TorchDispatchMode`` that only calls each operator: the floor of any
  per-operator observer written in Python;
- ``empty bound``: the same with its ``__torch_dispatch__`` set on the instance, as poolsight's
  (native) one is: PyTorch then finds it without making a bound method per operator. The
  floor of ``track()`` and ``hook()``.

CPU time is the process's (every thread); ``thread s`` is the training thread's alone (the rest
is other threads', the recorder's, which faults the trace's pages in ahead of the writers,
among them). With ``--device cuda`` the model and data are on the GPU, and the ratios are of
wall time (each step ends with ``loss.item()``, which waits for the GPU): what the step costs
there, where the host's time per operator is often what bounds it.

    python python/benchmarks/torch_overhead.py [--repeats 7] [--epochs 3] [--steps 16]
        [--device cpu|cuda[:N]] [--only VARIANT ...] [--processes N] [--seed S] [--profile]

``--processes N`` measures in N fresh processes, one after another (``--repeats`` in each), and
pools their repeats: one process is one draw of where its heap and the trace land, and on a
small machine two processes' ratios for the same variant differ by as much as a recorder
costs. Each process's paired ratio is printed too.

``--profile`` runs ``track+hook`` once more under cProfile and prints where its time goes.
Nothing is asserted: the figures are printed, with the machine's load next to them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import types

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import poolsight
import poolsight.torch


class Net(nn.Module):
    """A small CNN stem, a Transformer encoder over the feature map's positions, a classifier."""

    def __init__(self, width: int = 64, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, width, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        layer = nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)  # (B, C, H, W)
        h = h.flatten(2).transpose(1, 2)  # (B, H*W, C)
        h = self.encoder(h)
        return self.head(h.mean(dim=1))


def make(seed: int = 0, device: str = "cpu"):
    torch.manual_seed(seed)
    model = Net().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    images = torch.randn(512, 3, 32, 32).to(device)
    labels = torch.randint(0, 10, (512,)).to(device)
    return model, optimizer, images, labels


def epoch(model, optimizer, images, labels, steps: int, batch: int = 32, after_step=None) -> float:
    model.train()
    total = 0.0
    for i in range(steps):
        idx = torch.arange(i * batch, (i + 1) * batch, device=images.device) % images.shape[0]
        x, y = images[idx], labels[idx]
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        total += loss.item()
        if after_step is not None:
            after_step()
    return total


def variants(tmp: str, device: str = "cpu"):
    """name -> a function(model, optimizer) returning a context manager around one epoch
    (``memory history`` only on a CUDA ``device``)."""
    cuda = device.startswith("cuda")
    counter = iter(range(1 << 30))

    @contextlib.contextmanager
    def recorded(model, optimizer, track: bool, hook: bool, backend: str):
        path = os.path.join(tmp, f"run-{next(counter)}.pstrace")
        with poolsight.record(path), contextlib.ExitStack() as stack:
            if track:
                stack.enter_context(poolsight.torch.track(model, optimizer, backend=backend))
            if hook:
                stack.enter_context(poolsight.torch.hook(model, backend=backend))
            yield
        os.remove(path)

    @contextlib.contextmanager
    def memtracker(model, optimizer):
        from torch.distributed._tools.mem_tracker import MemTracker

        mt = MemTracker()
        mt.track_external(model, optimizer)
        with mt:
            # MemTracker keeps per-module figures of one iteration: reset after each step, as
            # its documentation asks for a training loop.
            yield mt.reset_mod_stats

    @contextlib.contextmanager
    def profiler(model, optimizer):
        activities = [torch.profiler.ProfilerActivity.CPU]
        if cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities, profile_memory=True, with_stack=True):
            yield

    @contextlib.contextmanager
    def memory_history(model, optimizer):
        torch.cuda.memory._record_memory_history(stacks="python")
        try:
            yield
            torch.cuda.memory._snapshot()
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)

    class Empty(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    @contextlib.contextmanager
    def empty_mode(model, optimizer):
        with Empty():
            yield

    def call(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))

    class Bound(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.__torch_dispatch__ = types.MethodType(call, self)

    @contextlib.contextmanager
    def empty_bound(model, optimizer):
        with Bound():
            yield

    table = {
        "plain": lambda m, o: contextlib.nullcontext(),
        "plain (again)": lambda m, o: contextlib.nullcontext(),
        "empty mode": empty_mode,
        "empty bound": empty_bound,
        "track (native)": lambda m, o: recorded(m, o, True, False, "native"),
        "track (python)": lambda m, o: recorded(m, o, True, False, "python"),
        "hook (native)": lambda m, o: recorded(m, o, False, True, "native"),
        "hook (python)": lambda m, o: recorded(m, o, False, True, "python"),
        "track+hook (native)": lambda m, o: recorded(m, o, True, True, "native"),
        "track+hook (python)": lambda m, o: recorded(m, o, True, True, "python"),
        "MemTracker": memtracker,
        "profiler": profiler,
    }
    if cuda:
        table["memory history"] = memory_history
    return table


#: Variants that need a CUDA device (``--device cuda``).
CUDA_ONLY = ("memory history",)


def run_once(
    ctx_of, steps: int, epochs: int = 1, device: str = "cpu"
) -> tuple[list, list, list, float]:
    """Training under a variant, ``epochs`` epochs of ``steps`` steps inside one recording (as
    a user records a run): each epoch's CPU time (process, then training thread) and wall time,
    and the CPU time of entering and leaving the variant (opening and finishing the recording,
    installing hooks; once per run, not per epoch)."""
    model, optimizer, images, labels = make(device=device)
    # Warm-up step outside the measurement (first-call costs of every op and of AdamW's state).
    epoch(model, optimizer, images, labels, 1)
    s0 = time.process_time()
    ctx = ctx_of(model, optimizer)
    after_step = ctx.__enter__()
    inside = time.process_time()
    cpu, thread, wall = [], [], []
    for _ in range(epochs):
        c0, t0, w0 = time.process_time(), time.thread_time(), time.perf_counter()
        epoch(model, optimizer, images, labels, steps, after_step=after_step)
        c1, t1, w1 = time.process_time(), time.thread_time(), time.perf_counter()
        cpu.append(c1 - c0)
        thread.append(t1 - t0)
        wall.append(w1 - w0)
    ctx.__exit__(None, None, None)
    return cpu, thread, wall, (inside - s0) + (time.process_time() - c1)


def operators(steps: int, epochs: int, device: str = "cpu") -> int:
    """The ATen operators of one run, as a dispatch mode sees them (those poolsight scopes)."""
    seen = 0

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            nonlocal seen
            seen += 1
            return func(*args, **(kwargs or {}))

    model, optimizer, images, labels = make(device=device)
    epoch(model, optimizer, images, labels, 1)
    with Count():
        for _ in range(epochs):
            epoch(model, optimizer, images, labels, steps)
    return seen


def positive(text: str) -> int:
    """An argparse type: a count of at least 1."""
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {n}")
    return n


def device_arg(text: str) -> str:
    """An argparse type: ``cpu``, or ``cuda``/``cuda:N`` where PyTorch sees that device."""
    if text == "cpu":
        return text
    if text != "cuda" and not re.fullmatch(r"cuda:\d+", text):
        raise argparse.ArgumentTypeError(f"cpu, cuda or cuda:N, not {text!r}")
    if not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(
            f"{text}: PyTorch sees no CUDA device here (torch.cuda.is_available() is False)"
        )
    index = int(text.partition(":")[2] or 0)
    if index >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(
            f"{text}: PyTorch sees {torch.cuda.device_count()} CUDA device(s)"
        )
    return text


def orders(names: list[str], repeats: int, seed: int) -> list[list[str]]:
    """The order of the variants in each repeat: a fresh shuffle per repeat, drawn from
    ``seed``. Over the repeats each variant runs early and late and beside each of the others,
    so that neither the machine's drift nor what the run before leaves behind (a warm cache,
    a heap grown or trimmed) favours one; an alternation forward and back would leave each
    beside the same two every time."""
    draw = random.Random(seed)
    return [draw.sample(names, len(names)) for _ in range(repeats)]


def measure(table, names: list[str], args, device: str) -> dict[str, list[tuple[float, ...]]]:
    """Per variant, per repeat: the run's CPU time (all epochs), its first epoch's, the training
    thread's, wall time (all epochs, the first), and the once-per-run cost."""
    runs: dict[str, list[tuple[float, ...]]] = {n: [] for n in names}
    for n in names:
        # First-use costs (PyTorch imports its compiler at a mode's first op).
        run_once(table[n], 1, device=device)
    for order in orders(names, args.repeats, args.seed):
        for n in order:
            cpu, thread, wall, once = run_once(table[n], args.steps, args.epochs, device)
            runs[n].append((sum(cpu), cpu[0], sum(thread), sum(wall), once, wall[0]))
    return runs


def in_processes(names: list[str], args) -> list[dict[str, list[tuple[float, ...]]]]:
    """``measure`` in ``args.processes`` fresh processes, one after another: each process's
    runs (where its heap and the trace land is a draw of its own)."""
    argv = [sys.executable, os.path.abspath(__file__), "--emit-runs"]
    argv += ["--repeats", str(args.repeats), "--steps", str(args.steps)]
    argv += ["--epochs", str(args.epochs), "--device", args.device, "--only", *names]
    drawn = []
    for i in range(args.processes):
        print(f"process {i + 1} of {args.processes} ...", file=sys.stderr, flush=True)
        # Each process draws its own orders.
        seed = ["--seed", str(args.seed + i)]
        proc = subprocess.run(argv + seed, stdout=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            sys.exit(f"process {i + 1} of {args.processes} failed (exit {proc.returncode})")
        drawn.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return drawn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=positive, default=7, help="repeats (in each process)")
    ap.add_argument(
        "--steps", type=positive, default=16, help="steps per epoch (16: the 512 images once)"
    )
    ap.add_argument("--epochs", type=positive, default=3, help="epochs per recorded run")
    ap.add_argument(
        "--device",
        type=device_arg,
        default="cpu",
        help="where the model trains: cpu (default), cuda or cuda:N (ratios of wall time)",
    )
    ap.add_argument("--only", nargs="*", help="variants to run (default: all)")
    ap.add_argument(
        "--processes",
        type=positive,
        default=1,
        help="measure in this many fresh processes, one after another, and pool their repeats "
        "(default 1: in this process)",
    )
    ap.add_argument(
        "--seed",
        type=int,
        default=0,
        help="draws each repeat's order of the variants (default 0; process i of --processes "
        "draws with seed+i)",
    )
    ap.add_argument("--profile", action="store_true", help="cProfile one variant once")
    ap.add_argument(
        "--profile-variant", default="track+hook (native)", help="the variant --profile runs"
    )
    # A process of --processes: measures and prints its runs as JSON, nothing else.
    ap.add_argument("--emit-runs", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(1)
    device = args.device
    cuda = device != "cpu"
    if cuda:
        torch.cuda.set_device(device)
    with tempfile.TemporaryDirectory() as tmp:
        table = variants(tmp, device)
        names = args.only or list(table)
        for n in names:
            if n in CUDA_ONLY and not cuda:
                ap.error(f"--only: {n!r} needs --device cuda")
            if n not in table:
                ap.error(f"--only: no variant {n!r} (variants: {', '.join(table)})")
        if args.profile and args.profile_variant not in table:
            ap.error(f"--profile-variant: no variant {args.profile_variant!r}")
        if "plain" not in names:
            names.insert(0, "plain")
        if args.emit_runs:
            print(json.dumps(measure(table, names, args, device)))
            return
        if args.processes > 1:
            drawn = in_processes(names, args)
        else:
            drawn = [measure(table, names, args, device)]
        runs = {n: [run for one in drawn for run in one[n]] for n in names}
        report(table, names, runs, drawn, args, device)


def report(table, names: list[str], runs, drawn, args, device: str) -> None:
    """Prints the medians of ``runs`` (every process's repeats, pooled) against the plain run's;
    with more than one process, each process's paired ratio too."""
    cuda = device != "cpu"
    # What the ratios compare: CPU time on the CPU, wall time on a GPU.
    total, first_of, basis = (3, 5, "wall") if cuda else (0, 1, "CPU")

    def med(n: str, i: int) -> float:
        return statistics.median(run[i] for run in runs[n])

    def paired(n: str, runs=runs) -> float:
        # Each repeat's time over the plain run's of the same repeat (seconds apart): the
        # median of those ratios follows the machine's drift less than a ratio of medians.
        return statistics.median(
            mine[total] / plain[total] for mine, plain in zip(runs[n], runs["plain"])
        )

    base, base_first = med("plain", total), med("plain", first_of)
    ops = operators(args.steps, args.epochs, device)
    later = args.epochs > 1
    later_head = f"{'later':>9}" if later else ""
    where = torch.cuda.get_device_name(device) if cuda else "1 intra-op thread"
    print(
        f"torch {torch.__version__} on {device} ({where}), {args.epochs} epoch(s) of "
        f"{args.steps} steps of 32 images per recorded run, medians of "
        f"{len(runs['plain'])} shuffled repeats"
        + (f" ({args.repeats} in each of {len(drawn)} processes)" if len(drawn) > 1 else "")
        + f", seed {args.seed}"
        + f", load average {os.getloadavg()[0]:.2f}"
    )
    print(
        f"{'variant':<20} {'CPU s':>8} {'thread s':>9} {'wall s':>8} "
        f"{f'x plain ({basis})':>14} {'paired':>7} {'epoch 1':>8}{later_head} "
        f"{'once s':>8} {'us/op':>7}"
    )
    for n in names:
        c, t, w, o = (med(n, i) for i in (0, 2, 3, 4))
        mine, first = med(n, total), med(n, first_of)
        rest = ""
        if later:
            rest = f"{(mine - first) / (base - base_first):>9.2f}"
        print(
            f"{n:<20} {c:>8.3f} {t:>9.3f} {w:>8.3f} {mine / base:>14.2f} "
            f"{paired(n):>7.3f} {first / base_first:>8.2f}{rest} {o:>8.3f} "
            f"{(mine - base) / ops * 1e6:>+7.2f}"
        )
    print(
        f"x plain: the run's {basis} time against the plain run's (medians); paired: the "
        "median of each repeat's ratio to the plain run of the same repeat; epoch 1: its first "
        "epoch's alone (the recording's first sight of every stack and tensor)"
        + ("; later: the other epochs'" if later else "")
    )
    print("once: CPU time to begin and end the variant (recording, hooks), once per run")
    print(
        f"us/op: {basis} microseconds per operator over the plain run ({ops:,} operators a "
        "run, as a dispatch mode sees them)"
    )
    if len(drawn) > 1:
        # One process is one draw of where its heap and the trace land: its median can differ
        # from another process's by as much as a recorder costs.
        print("paired, by process:")
        for n in (n for n in names if n != "plain"):
            print(f"  {n:<20} " + " ".join(f"{paired(n, one):.3f}" for one in drawn))
    if args.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        # cProfile: all of it.
        run_once(table[args.profile_variant], args.steps, args.epochs, device)
        prof.disable()
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
