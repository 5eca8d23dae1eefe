"""``poolsight predict`` (also ``python -m poolsight.predict``): a Python command run on fake
CUDA tensors, and what it would do on a GPU (docs/predict.md).

    poolsight predict --gpu A100-40GB -- python train.py --batch-size 16
    poolsight predict --gpu L4 --search batch=1..256 -- python train.py --batch-size {batch}

The command runs in this process under :func:`poolsight.torch.fake_cuda` and
:func:`poolsight.record`; the trace it leaves is then read by the analyzer (the allocator model
replays it under ``PYTORCH_CUDA_ALLOC_CONF``). Exit 0 when it fits, 1 when it does not, 2 for
bad input or a command that failed (its own error shown).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import runpy
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["Search", "Trial", "largest_batch", "main"]

PROG = "poolsight predict"


class _Usage(Exception):
    """Bad input: one line on stderr, exit 2."""


class StepsDone(BaseException):
    """``--steps N`` reached: the command stops (a BaseException, so that a script's own
    ``except Exception`` does not swallow it)."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "Run a Python command on fake CUDA tensors (no GPU needed, nothing computed) and "
            "predict what it does with a GPU's memory: the active peak (max_memory_allocated), "
            "the reserved peak of PyTorch's caching allocator (replayed under "
            "PYTORCH_CUDA_ALLOC_CONF), whether it fits the GPU, the first request that would "
            "not, the smallest capacity it fits in, and what was live at the peak. "
            "Exit 0 fits, 1 does not fit, 2 bad input or the command failed."
        ),
        epilog=(
            "examples:\n"
            "  poolsight predict --gpu A100-40GB -- python train.py --batch-size 16\n"
            "  poolsight predict --capacity 24GiB --steps 2 -o step.pstrace -- train.py\n"
            "  poolsight predict --gpu L4 --search batch=1..256 -- python train.py --bs {batch}\n"
            "  poolsight predict --list-gpus\n"
            "The trace (-o) is a poolsight trace: report, categories, lines, html, diff, whatif "
            "and oom read it as they read a recording."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--gpu",
        metavar="NAME",
        help="the GPU to predict for, from poolsight's table (--list-gpus); default H100-80GB",
    )
    which.add_argument(
        "--capacity",
        metavar="BYTES",
        help="instead of a GPU: the bytes the caching allocator may hold (40GiB, 39.5GB, ...)",
    )
    p.add_argument(
        "-o", "--output", metavar="TRACE", help="write the trace there (default: a temporary file)"
    )
    p.add_argument("--force", action="store_true", help="replace an existing -o file")
    p.add_argument(
        "--settings",
        metavar="CONF",
        help="PYTORCH_CUDA_ALLOC_CONF for the allocator (default: the environment's)",
    )
    p.add_argument(
        "--steps",
        type=int,
        metavar="N",
        help="stop the command after N optimizer steps (optimizer.step() calls)",
    )
    p.add_argument(
        "--search",
        metavar="NAME=LOW..HIGH",
        help="find the largest integer NAME in LOW..HIGH that fits: {NAME} in the command is "
        "replaced by each size tried (each a fresh process)",
    )
    p.add_argument(
        "--items",
        choices=("error", "zero"),
        default="error",
        help="a value your code asks of a fake tensor (loss.item()): an error naming the line "
        "(default), or read as 0",
    )
    p.add_argument(
        "--context-bytes",
        metavar="BYTES",
        help="the CUDA context's bytes outside the allocator (default: the GPU table's estimate)",
    )
    p.add_argument("--format", choices=("table", "json"), default="table", help="output format")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    p.add_argument("--list-gpus", action="store_true", help="print the GPUs poolsight knows")
    p.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND...",
        help="the Python command: python script.py ARGS, script.py ARGS, -m module ARGS",
    )
    return p


def _say(quiet: bool, text: str) -> None:
    if not quiet:
        print(f"poolsight predict: {text}", file=sys.stderr, flush=True)


def _mib(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB" if n >= 2**30 else f"{n / 2**20:,.2f} MiB"


# -- running a command in this process ---------------------------------------------------------


def _split_command(command: list[str]) -> tuple[str, str, list[str]]:
    """``(kind, target, args)`` of a Python command: ``("path", "train.py", [...])``,
    ``("module", "pkg.train", [...])`` or ``("code", "...", [...])``."""
    cmd = list(command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise _Usage("no command given (poolsight predict [OPTIONS] -- python train.py ...)")
    first = os.path.basename(cmd[0])
    if re.fullmatch(r"python[0-9.]*", first) or os.path.abspath(cmd[0]) == sys.executable:
        cmd = cmd[1:]
        while (
            cmd
            and cmd[0] in ("-u", "-B", "-E", "-s", "-X", "-W")
            or (cmd and re.fullmatch(r"-[WX].+", cmd[0]))
        ):
            flag = cmd.pop(0)
            if flag in ("-X", "-W") and cmd:
                cmd.pop(0)
        if not cmd:
            raise _Usage("the command names Python but no script, -m module or -c code")
    if cmd[0] == "-m":
        if len(cmd) < 2:
            raise _Usage("-m needs a module name")
        return "module", cmd[1], cmd[2:]
    if cmd[0] == "-c":
        if len(cmd) < 2:
            raise _Usage("-c needs code")
        return "code", cmd[1], cmd[2:]
    if cmd[0].startswith("-"):
        raise _Usage(f"the command's Python option {cmd[0]} is not supported here")
    if not os.path.isfile(cmd[0]):
        raise _Usage(f"{cmd[0]}: no such script (the command must be a Python script or -m module)")
    return "path", cmd[0], cmd[1:]


def _execute(kind: str, target: str, args: list[str]) -> None:
    """Runs a script, module or code as ``python`` would, in this process."""
    argv, path0 = sys.argv, sys.path[0] if sys.path else None
    try:
        if kind == "path":
            sys.argv = [target, *args]
            sys.path[0] = os.path.dirname(os.path.abspath(target))
            runpy.run_path(target, run_name="__main__")
        elif kind == "module":
            sys.argv = [target, *args]
            sys.path[0] = os.getcwd()
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.argv = ["-c", *args]
            exec(compile(target, "<string>", "exec"), {"__name__": "__main__"})
    finally:
        sys.argv = argv
        if path0 is not None:
            sys.path[0] = path0


@contextlib.contextmanager
def _steps(limit: int | None, quiet: bool, run: Any) -> Iterator[dict]:
    """Counts optimizer steps (progress on stderr at most once a second); raises
    :class:`StepsDone` after ``limit``."""
    from torch.optim import optimizer

    seen = {"steps": 0}
    last = [0.0]
    started = time.monotonic()

    def after(opt: Any, args: Any, kwargs: Any) -> None:
        seen["steps"] += 1
        now = time.monotonic()
        done = limit is not None and seen["steps"] >= limit
        if now - last[0] >= 1.0 or done:
            last[0] = now
            _say(
                quiet,
                f"step {seen['steps']} ({now - started:.1f} s): active peak "
                f"{_mib(run.peak_allocated_bytes)}, reserved {_mib(run.peak_reserved_bytes)}",
            )
        if done:
            raise StepsDone

    handle = optimizer.register_optimizer_step_post_hook(after)
    try:
        yield seen
    finally:
        handle.remove()


@dataclasses.dataclass
class _Outcome:
    trace: str
    steps: int
    seconds: float
    capacity: int
    settings: str


def _run_one(opts: argparse.Namespace, command: list[str], trace: str) -> _Outcome:
    """Runs ``command`` under fake_cuda into ``trace``; raises on bad input or failure."""
    import poolsight
    import poolsight.torch as pst

    kind, target, args = _split_command(command)
    settings = (
        opts.settings
        if opts.settings is not None
        else os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    )
    started = time.monotonic()
    with poolsight.record(trace, overwrite=opts.force):
        with pst.fake_cuda(
            opts.gpu,
            opts.capacity,
            settings=settings,
            oom="continue",
            items=opts.items,
            context_bytes=opts.context_bytes,
        ) as run:
            _say(
                opts.quiet,
                f"running {' '.join(command).strip()} on fake CUDA tensors "
                f"({run.gpu.key}: {_mib(run.gpu.capacity)} for the allocator)",
            )
            # With --format json, stdout is the report's: what the command prints goes to stderr.
            out = contextlib.redirect_stdout(sys.stderr) if opts.format == "json" else None
            with _steps(opts.steps, opts.quiet, run) as seen, out or contextlib.nullcontext():
                try:
                    _execute(kind, target, args)
                except StepsDone:
                    _say(opts.quiet, f"stopped after {seen['steps']} optimizer steps (--steps)")
                except SystemExit as e:
                    if e.code not in (None, 0):
                        raise _Failed(f"the command exited with {e.code!r}") from None
            capacity = run.gpu.capacity
    return _Outcome(trace, seen["steps"], time.monotonic() - started, capacity, settings)


class _Failed(Exception):
    """The command failed: exit 2."""


def _report(outcome: _Outcome, fmt: str, command: list[str], kept: bool) -> tuple[str, bool]:
    from . import _native

    shown, fits = _native.predict_report(
        outcome.trace, outcome.settings, outcome.capacity, fmt == "json"
    )
    if fmt == "json":
        doc = shown
        doc.update(
            {
                "command": command,
                "optimizer_steps": outcome.steps,
                "seconds": round(outcome.seconds, 3),
                "trace_kept": kept,
            }
        )
        return json.dumps(doc, indent=2) + "\n", fits
    tail = f"command          {' '.join(command)}: {outcome.steps} optimizer steps in "
    tail += f"{outcome.seconds:.1f} s\n"
    tail += f"trace            {outcome.trace}"
    tail += "\n" if kept else " (removed at exit: keep it with -o FILE)\n"
    return shown + tail, fits


def _strip(command: list[str]) -> list[str]:
    return command[1:] if command and command[0] == "--" else list(command)


def _predict(opts: argparse.Namespace) -> int:
    command = _strip(opts.command)
    keep = opts.output is not None
    folder = None if keep else tempfile.mkdtemp(prefix="poolsight-predict-")
    trace = opts.output if keep else os.path.join(folder, "predict.pstrace")
    try:
        outcome = _run_one(opts, command, trace)
        text, fits = _report(outcome, opts.format, command, keep)
        sys.stdout.write(text)
        return 0 if fits else 1
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


# -- searching the largest size that fits ------------------------------------------------------


@dataclasses.dataclass
class Trial:
    """One size tried: its figures, and whether it fits."""

    n: int
    fits: bool
    active_peak_bytes: int
    reserved_peak_bytes: int
    #: The line of the first request that would not fit, when one would not.
    first_failure_line: str | None = None
    min_capacity_bytes: int | None = None

    def row(self) -> str:
        failure = f"  first failure at {self.first_failure_line}" if self.first_failure_line else ""
        return (
            f"{self.n:>8}  {_mib(self.active_peak_bytes):>12}  {_mib(self.reserved_peak_bytes):>12}"
            f"  {'yes' if self.fits else 'no':>4}{failure}"
        )


@dataclasses.dataclass
class Search:
    """What :func:`largest_batch` (``--search``) found: the largest size that fits (None: not
    even the smallest), every size tried, and whether fitting was monotonic in the size."""

    largest: int | None
    tried: list[Trial]
    capacity_bytes: int
    #: The highest size the search could try (None: no bound was given).
    high: int | None = None

    @property
    def at_bound(self) -> bool:
        """Whether the highest size allowed fits: a larger one may fit too."""
        return self.largest is not None and self.largest == self.high

    @property
    def monotonic(self) -> bool:
        """False when a size that does not fit is smaller than one that does."""
        ordered = sorted(self.tried, key=lambda t: t.n)
        seen_fail = False
        for t in ordered:
            if not t.fits:
                seen_fail = True
            elif seen_fail:
                return False
        return True

    def table(self) -> str:
        head = f"{'n':>8}  {'active peak':>12}  {'reserved peak':>12}  fits"
        rows = [t.row() for t in sorted(self.tried, key=lambda t: t.n)]
        out = [head, *rows]
        if self.largest is None:
            out.append(f"no size fits in {_mib(self.capacity_bytes)}")
        else:
            out.append(f"largest that fits in {_mib(self.capacity_bytes)}: {self.largest}")
            if self.at_bound:
                out.append(
                    f"note: {self.largest} is the highest size allowed and it fits: a larger "
                    "one may fit too (raise HIGH)"
                )
        if not self.monotonic:
            bad = [
                (a.n, b.n)
                for a in self.tried
                for b in self.tried
                if a.n < b.n and not a.fits and b.fits
            ]
            a, b = min(bad)
            out.append(
                f"note: fitting is not monotonic in n ({a} does not fit, {b} does): the search "
                "assumes it is, so another size may fit too"
            )
        return "\n".join(out) + "\n"

    def __str__(self) -> str:
        return self.table()


def _bisect(
    low: int, high: int | None, trial: Callable[[int], Trial], say: Callable[[Trial], None]
) -> tuple[int | None, list[Trial]]:
    tried: dict[int, Trial] = {}

    def at(n: int) -> Trial:
        if n not in tried:
            tried[n] = trial(n)
            say(tried[n])
        return tried[n]

    if not at(low).fits:
        return None, list(tried.values())
    if high is None:
        # Doubling until a size does not fit (at most 2**20 times the smallest).
        good, n = low, low * 2 if low > 0 else 1
        while n <= max(low, 1) << 20 and at(n).fits:
            good, n = n, n * 2
        bad = n
    else:
        if at(high).fits:
            return high, list(tried.values())
        good, bad = low, high
    while bad - good > 1:
        mid = (good + bad) // 2
        if at(mid).fits:
            good = mid
        else:
            bad = mid
    return good, list(tried.values())


def largest_batch(
    step: Callable[[int], Any],
    gpu: str | None = None,
    capacity: int | str | None = None,
    low: int = 1,
    high: int | None = None,
    *,
    settings: str | None = None,
    quiet: bool = False,
) -> Search:
    """The largest ``n`` in ``low..high`` for which ``step(n)`` fits ``gpu`` (or ``capacity``
    bytes), found by bisection over fake CUDA runs (``high=None``: doubling from ``low`` until
    a size does not fit). ``step(n)`` runs one training step (or as many as you want judged)
    at size ``n``: build the model and batch in it, or reuse ones you made. Every size tried
    is printed on stderr (unless ``quiet``) and kept in the result, with its peaks."""
    import poolsight.torch as pst

    if not callable(step):
        raise TypeError(f"step must be a callable taking the size n, not {step!r}")
    for name, v in (("low", low), ("high", high)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise TypeError(f"{name} must be an int, not {v!r}")
    if low < 0 or (high is not None and high < low):
        raise ValueError(f"low..high must be a range of sizes >= 0, not {low}..{high}")
    cap: list[int] = []

    def trial(n: int) -> Trial:
        with pst.fake_cuda(gpu, capacity, settings=settings, oom="continue") as run:
            step(n)
            cap[:] = [run.gpu.capacity]
            f = run.first_failure
            return Trial(
                n,
                run.fits,
                run.peak_allocated_bytes,
                run.peak_reserved_bytes,
                f["line"] if f else None,
            )

    def say(t: Trial) -> None:
        if not quiet:
            print(f"poolsight largest_batch: {t.row()}", file=sys.stderr, flush=True)

    largest, tried = _bisect(low, high, trial, say)
    return Search(largest, tried, cap[0] if cap else 0, high)


def _search(opts: argparse.Namespace) -> int:
    m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)=([0-9]+)\.\.([0-9]+)?", opts.search)
    if m is None:
        raise _Usage(f"--search {opts.search!r}: give NAME=LOW..HIGH (batch=1..256)")
    name, low, high = m.group(1), int(m.group(2)), m.group(3)
    high_n = int(high) if high is not None else None
    if high_n is not None and high_n < low:
        raise _Usage(f"--search {opts.search}: HIGH is below LOW")
    command = _strip(opts.command)
    slot = "{" + name + "}"
    if not any(slot in a for a in command):
        raise _Usage(f"--search {name}: the command has no {slot} to replace")
    _split_command([a.replace(slot, str(low)) for a in command])
    capacity = [0]

    def trial(n: int) -> Trial:
        with tempfile.TemporaryDirectory(prefix="poolsight-search-") as d:
            cmd = [sys.executable, "-m", "poolsight.predict", "--format", "json", "-q"]
            for flag, value in (
                ("--gpu", opts.gpu),
                ("--capacity", opts.capacity),
                ("--settings", opts.settings),
                ("--steps", opts.steps),
                ("--items", opts.items),
                ("--context-bytes", opts.context_bytes),
            ):
                if value is not None:
                    cmd += [flag, str(value)]
            cmd += ["-o", os.path.join(d, "trial.pstrace"), "--"]
            cmd += [a.replace(slot, str(n)) for a in command]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode not in (0, 1):
                sys.stderr.write(done.stderr)
                raise _Failed(f"the command failed at {name}={n} (its error is above)")
            doc = json.loads(done.stdout)
            capacity[0] = doc.get("capacity_bytes") or 0
            f = doc.get("first_failure")
            return Trial(
                n,
                bool(doc["fits"]),
                int(doc["active_peak_bytes"]),
                int(doc["reserved_peak_bytes"]),
                f.get("line") if f else None,
                doc.get("min_capacity_bytes"),
            )

    def say(t: Trial) -> None:
        _say(opts.quiet, f"{name}={t.n}: {t.row().strip()}")

    largest, tried = _bisect(low, high_n, trial, say)
    result = Search(largest, tried, capacity[0], high_n)
    if opts.format == "json":
        doc = {
            "name": name,
            "largest": largest,
            "capacity_bytes": result.capacity_bytes,
            "monotonic": result.monotonic,
            "at_bound": result.at_bound,
            "tried": [dataclasses.asdict(t) for t in sorted(tried, key=lambda t: t.n)],
        }
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        sys.stdout.write(result.table().replace(f"{'n':>8}", f"{name:>8}", 1))
    return 0 if largest is not None else 1


def main(argv: list[str] | None = None) -> int:
    """``poolsight predict``; returns the exit code."""
    p = _parser()
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        opts = p.parse_args(args)
    except SystemExit as e:
        return 0 if e.code in (0, None) else 2
    try:
        if opts.list_gpus:
            from ._fake import gpus

            print(gpus.table())
            return 0
        if opts.steps is not None and opts.steps < 1:
            raise _Usage(f"--steps must be at least 1, not {opts.steps}")
        from ._fake import _gpu_for

        _gpu_for(opts.gpu, opts.capacity, opts.context_bytes)
        if opts.settings is not None:
            from . import _native

            _native.FakeGpu(opts.settings, None)
        if opts.output is not None and os.path.exists(opts.output) and not opts.force:
            raise _Usage(f"{opts.output} exists: pass --force to replace it")
        if opts.search is None:
            _split_command(_strip(opts.command))
    except (_Usage, ValueError, TypeError) as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    try:
        if opts.search is not None:
            return _search(opts)
        return _predict(opts)
    except _Usage as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    except _Failed as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - the command's own failure
        from . import PoolsightError
        from ._fake import FakeCudaError

        if isinstance(e, FakeCudaError):
            print(f"{PROG}: {e}", file=sys.stderr)
        elif isinstance(e, PoolsightError) and "exists" in str(e):
            print(f"{PROG}: {e}", file=sys.stderr)
        else:
            traceback.print_exc()
            print(f"{PROG}: the command failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
