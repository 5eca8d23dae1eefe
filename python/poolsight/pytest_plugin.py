"""``pytest --poolsight``: each test recorded into a trace, memory limits as markers.

The package registers this module as a pytest plugin (entry point ``pytest11``), so installing
poolsight is all it takes. Without ``--poolsight`` nothing is recorded and nothing is imported
beyond this module: tests run untouched (the markers are known to pytest, so
``--strict-markers`` accepts them, and the summary says when limits went unchecked).

With ``--poolsight`` each test function runs inside ``poolsight.record()`` (one trace per test
under ``--poolsight-dir``, by default a temporary folder removed at the end), with
``poolsight.torch.track()`` when PyTorch is installed (tensor storages on every device) and
``poolsight.cupy.TraceHook`` when CuPy is. Pools the test makes with ``poolsight.active()`` as
their recording, and scopes opened with it (``poolsight.torch.hook(model)``), record there too.
The figures are the analyzer's (``poolsight report`` of the test's trace):

- ``@pytest.mark.limit_memory("2 GB", device=None)`` fails a test whose peak of live bytes is
  above the limit, naming the stacks that held most at the peak; with ``device`` ('cpu',
  'cuda', 'cuda:N'), the peak of that device's live bytes alone (of each such device);
- ``@pytest.mark.limit_leaks("1 MB", warmups=0)`` fails a test that leaves more than that alive
  once it has returned (after a garbage collection); ``warmups`` runs it that many times
  unrecorded first, so that caches filled once are not counted as leaks.

Limits are bytes (an int) or strings as pytest-memray reads them: ``"24 MB"`` (KB, MB, GB, TB
are powers of 1024; KiB, MiB... are accepted too).

``--poolsight-fake-cuda`` (which implies ``--poolsight``), on a machine without a GPU: each test
runs under ``poolsight.torch.fake_cuda`` for the GPU ``--poolsight-gpu`` names (default
H100-80GB), and ``torch.cuda.is_available()`` says True from the start of the session, so
tests that use ``cuda`` (and those skipped without it) run, on fake CUDA tensors, and
``limit_memory(..., device="cuda")`` checks the predicted peak: the same figure on every run.
A test that asks a fake tensor for a value fails with the line that asked; one that needs more
than the GPU holds fails with PyTorch's out-of-memory error, as it would on the GPU. Where a
GPU is present, tests run on it as they are.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import importlib.util
import inspect
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

MARKERS = ("limit_memory", "limit_leaks")
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
_LIMIT = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(?:([KMGTP])(?:I?B)?|(B))?\s*$", re.IGNORECASE)
# How many stacks a failure message names, and how many tests the summary lists by default.
_STACKS_SHOWN = 5
_TOP = 5


def parse_limit(limit: Any) -> int:
    """A memory limit in bytes: an int, or ``"<number> <unit>"`` with unit B, KB (KiB), MB
    (MiB), GB, TB or PB, powers of 1024 as in pytest-memray; ValueError otherwise."""
    if isinstance(limit, bool):
        raise ValueError(f"a memory limit is bytes or a string like '2 GB', not {limit!r}")
    if isinstance(limit, int):
        if limit < 0:
            raise ValueError(f"a memory limit cannot be negative ({limit})")
        return limit
    m = _LIMIT.match(limit) if isinstance(limit, str) else None
    if m is None:
        raise ValueError(
            f"a memory limit is bytes or a string like '2 GB' or '512 MiB', not {limit!r}"
        )
    unit = (m.group(2) or m.group(3) or "").upper()
    return int(float(m.group(1)) * _UNITS[unit])


def size(nbytes: int) -> str:
    """``3.05 MiB``: bytes for people, powers of 1024 as the limits read."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{nbytes} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


# -- options and markers (always registered, cheap) ---------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("poolsight", "memory of each test, recorded by poolsight")
    group.addoption(
        "--poolsight",
        action="store_true",
        default=False,
        help="record each test into a poolsight trace (PyTorch tensors on any device, "
        "poolsight pools, CuPy), check the limit_memory and limit_leaks markers, and list "
        "the tests with the largest peaks at the end",
    )
    group.addoption(
        "--poolsight-dir",
        metavar="DIR",
        default=None,
        help="keep the traces in DIR, one per test (default: a temporary folder removed at "
        "the end); read them with `poolsight report DIR/TRACE`",
    )
    group.addoption(
        "--poolsight-fake-cuda",
        action="store_true",
        default=False,
        help="where no GPU is present, run each test on fake CUDA tensors "
        "(poolsight.torch.fake_cuda): tests that use cuda run, and limit_memory(..., "
        "device='cuda') checks the predicted peak; implies --poolsight",
    )
    group.addoption(
        "--poolsight-gpu",
        metavar="NAME",
        default=None,
        help="the GPU --poolsight-fake-cuda predicts for (default H100-80GB; "
        "`poolsight predict --list-gpus` lists them)",
    )
    group.addoption(
        "--poolsight-top",
        metavar="N",
        type=int,
        default=_TOP,
        help=f"how many tests the summary lists, largest peak first (default {_TOP}; 0: all)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "limit_memory(limit, device=None): with --poolsight, fail the test when its peak of "
        "live bytes (on `device`: 'cpu', 'cuda', 'cuda:N'; default every device recorded) is "
        "above `limit` ('2 GB', or bytes)",
    )
    config.addinivalue_line(
        "markers",
        "limit_leaks(limit, warmups=0): with --poolsight, fail the test when more than "
        "`limit` of what it allocated is still alive after it returned; `warmups` runs it "
        "that many times unrecorded first",
    )
    if config.getoption("poolsight") or config.getoption("poolsight_fake_cuda"):
        top = config.getoption("poolsight_top")
        if top < 0:
            raise pytest.UsageError(f"--poolsight-top is 0 (all) or more, not {top}")
        config.pluginmanager.register(_Recorder(config), "poolsight-recorder")
    else:
        config.pluginmanager.register(_Unchecked(), "poolsight-unchecked")


class _Unchecked:
    """Without ``--poolsight``: counts the tests whose limits go unchecked, and says so."""

    def __init__(self) -> None:
        self.limited = 0

    def pytest_collection_modifyitems(self, items: list) -> None:
        self.limited = sum(1 for item in items if any(item.get_closest_marker(n) for n in MARKERS))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.limited:
            s = "s" if self.limited > 1 else ""
            terminalreporter.write_line(
                f"poolsight: {self.limited} test{s} with limit_memory/limit_leaks ran without "
                "their limits checked (run pytest --poolsight to check them)"
            )


# -- recording ---------------------------------------------------------------------------------


@dataclass
class _Result:
    nodeid: str
    path: Path
    figures: dict | None = None
    error: str | None = None
    limits: list = field(default_factory=list)
    # Whether the trace outlives the session (--poolsight-dir).
    kept: bool = True


@dataclass
class _Limit:
    marker: str
    limit: int
    device: str | None = None
    warmups: int = 0


def _limits(item: pytest.Item) -> list:
    """The test's poolsight markers, checked: a wrong argument is the test's error."""
    out = []
    for marker in item.iter_markers():
        if marker.name not in MARKERS:
            continue
        where = f"@pytest.mark.{marker.name}"
        if marker.name == "limit_memory":
            sig = inspect.signature(lambda limit, device=None: None)
        else:
            sig = inspect.signature(lambda limit, warmups=0: None)
        try:
            bound = sig.bind(*marker.args, **marker.kwargs).arguments
        except TypeError as e:
            raise TypeError(f"{where}: {e} (expected {marker.name}{sig})") from None
        try:
            limit = parse_limit(bound["limit"])
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        if marker.name == "limit_memory":
            device = bound.get("device")
            if device is not None and not _DEVICE.match(str(device)):
                raise ValueError(
                    f"{where}: device is 'cpu', 'cuda', 'cuda:N' or None, not {device!r}"
                )
            out.append(_Limit(marker.name, limit, device=None if device is None else str(device)))
        else:
            warmups = bound.get("warmups", 0)
            if isinstance(warmups, bool) or not isinstance(warmups, int) or warmups < 0:
                raise ValueError(f"{where}: warmups is an int >= 0, not {warmups!r}")
            out.append(_Limit(marker.name, limit, warmups=warmups))
    return out


_DEVICE = re.compile(r"^(cpu|cuda|gpu|cuda:\d+)$")


def _on_device(name: str, kind: str, device: str) -> bool:
    """Whether the trace's device ``name`` (of ``kind``: cpu, gpu...) is what ``device`` names."""
    if device == "cpu":
        return kind == "cpu"
    if device in ("cuda", "gpu"):
        return kind == "gpu"
    return name == device


def _trace_name(nodeid: str) -> str:
    """A file name for a test: its id made safe, cut to fit, a digest keeping it unique."""
    safe = re.sub(r"[^A-Za-z0-9_.\-\[\]]+", "-", nodeid).strip("-") or "test"
    digest = hashlib.sha1(nodeid.encode()).hexdigest()[:8]
    return f"{safe[:150]}-{digest}.pstrace"


class _Recorder:
    """With ``--poolsight``: records each test, checks its markers, prints the summary."""

    def __init__(self, config: pytest.Config):
        import poolsight  # noqa: F401  (only with --poolsight)

        self.config = config
        chosen = config.getoption("poolsight_dir")
        self.temporary = chosen is None
        if chosen is None:
            self.dir = Path(tempfile.mkdtemp(prefix="poolsight-pytest-"))
        else:
            self.dir = Path(chosen).resolve()
            try:
                self.dir.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise pytest.UsageError(f"--poolsight-dir {chosen}: {e}") from None
            if not os.access(self.dir, os.W_OK):
                raise pytest.UsageError(f"--poolsight-dir {chosen} is not writable")
        self.results: dict = {}
        # What records besides the recording itself: PyTorch's tensors and CuPy's pool.
        self.notes: list = []
        self.torch = None
        self.cupy = None
        if importlib.util.find_spec("torch") is not None:
            import poolsight.torch

            self.torch = poolsight.torch
        if importlib.util.find_spec("cupy") is not None:
            try:
                import poolsight.cupy

                self.cupy = poolsight.cupy
            except Exception as e:  # CuPy without a usable CUDA install
                self.notes.append(f"CuPy is installed but not recorded ({e})")
        # --poolsight-fake-cuda: the GPU tests are predicted for, when there is no GPU.
        self.fake_gpu: str | None = None
        self._available: Any = None
        if config.getoption("poolsight_fake_cuda"):
            self._fake_cuda(config.getoption("poolsight_gpu"))
        elif config.getoption("poolsight_gpu") is not None:
            raise pytest.UsageError("--poolsight-gpu is for --poolsight-fake-cuda")

    def _fake_cuda(self, gpu: str | None) -> None:
        if self.torch is None:
            raise pytest.UsageError("--poolsight-fake-cuda needs PyTorch")
        import torch

        from ._fake import gpus

        try:
            spec = gpus.lookup(gpu) if gpu is not None else gpus.GPUS[gpus.DEFAULT]
        except ValueError as e:
            raise pytest.UsageError(f"--poolsight-gpu: {e}") from None
        if torch.cuda.device_count() > 0:
            self.notes.append(
                "--poolsight-fake-cuda: a GPU is present, so tests ran on it, not on fake tensors"
            )
            return
        self.fake_gpu = spec.key
        self.notes.append(
            f"tests ran on fake CUDA tensors (--poolsight-fake-cuda): figures on cuda are "
            f"predicted for {spec.key}"
        )
        # Collected as a GPU machine would collect them (skipif(not torch.cuda.is_available())).
        self._available = (torch.cuda.is_available, torch.cuda.device_count)
        torch.cuda.is_available = lambda: True
        torch.cuda.device_count = lambda: 1

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self._available is not None:
            import torch

            torch.cuda.is_available, torch.cuda.device_count = self._available
            self._available = None
        if self.temporary:
            shutil.rmtree(self.dir, ignore_errors=True)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_pyfunc_call(self, pyfuncitem: pytest.Function) -> Any:
        func = pyfuncitem.obj
        result = _Result(pyfuncitem.nodeid, self.dir / _trace_name(pyfuncitem.nodeid))
        result.kept = not self.temporary
        try:
            result.limits = _limits(pyfuncitem)
        except (TypeError, ValueError) as e:
            wrong = e  # the test's error, raised when it is called

            def refuse(*args: Any, **kwargs: Any) -> Any:
                raise wrong

            pyfuncitem.obj = refuse
            try:
                yield
            finally:
                pyfuncitem.obj = func
            return
        warmups = max((lim.warmups for lim in result.limits), default=0)
        self.results[pyfuncitem.nodeid] = result

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def wrapper(*args: Any, **kwargs: Any) -> Any:
                for _ in range(warmups):
                    await func(*args, **kwargs)
                with self._recording(result):
                    return await func(*args, **kwargs)

        else:

            @functools.wraps(func)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                for _ in range(warmups):
                    func(*args, **kwargs)
                with self._recording(result):
                    return func(*args, **kwargs)

        pyfuncitem.obj = wrapper
        try:
            yield
        finally:
            pyfuncitem.obj = func
        self._analyze(result)

    def _recording(self, result: _Result) -> Any:
        import poolsight

        @contextlib.contextmanager
        def recording() -> Any:
            with poolsight.record(result.path, overwrite=True, cpu=None) as rec:
                with contextlib.ExitStack() as stack:
                    if self.fake_gpu is not None:
                        # fake_cuda tracks the recording itself (it must come first).
                        stack.enter_context(self.torch.fake_cuda(self.fake_gpu))
                    elif self.torch is not None:
                        stack.enter_context(self.torch.track(recorder=rec))
                    if self.cupy is not None:
                        stack.enter_context(self.cupy.TraceHook(rec))
                    try:
                        yield rec
                    finally:
                        # What only a reference cycle kept is not a leak.
                        gc.collect()

        return recording()

    def _analyze(self, result: _Result) -> None:
        from poolsight import PoolsightError, _native

        if not result.path.exists():
            return
        try:
            result.figures = _native.peak(str(result.path))
        except PoolsightError as e:
            result.error = str(e)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo) -> Any:
        outcome = yield
        report = outcome.get_result()
        result = self.results.get(item.nodeid)
        if report.when != "call" or result is None:
            return
        if result.figures is not None:
            f = result.figures
            report.user_properties.append(("poolsight_peak_bytes", f["peak_bytes"]))
            report.user_properties.append(("poolsight_trace", str(result.path)))
        if report.outcome != "passed" or not result.limits:
            return
        failures = []
        if result.figures is None:
            failures.append(
                f"poolsight could not read this test's trace {result.path}: {result.error}"
            )
        else:
            for lim in result.limits:
                message = _check(lim, result)
                if message:
                    failures.append(message)
        if failures:
            report.outcome = "failed"
            report.longrepr = "\n\n".join(failures)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        tr = terminalreporter
        tr.write_sep("=", "poolsight")
        for note in self.notes:
            tr.write_line(f"poolsight: {note}")
        done = [r for r in self.results.values() if r.figures is not None]
        if not done:
            tr.write_line("no test was recorded")
            return
        done.sort(key=lambda r: r.figures["peak_bytes"], reverse=True)
        top = self.config.getoption("poolsight_top") or len(done)
        shown = done[:top]
        tr.write_line(f"largest peaks of live bytes ({len(shown)} of {len(done)} tests recorded):")
        width = max(len(r.nodeid) for r in shown)
        tr.write_line(f"  {'test':<{width}}  {'peak':>12}  {'alive at end':>12}")
        for r in shown:
            f = r.figures
            tr.write_line(
                f"  {r.nodeid:<{width}}  {size(f['peak_bytes']):>12}  "
                f"{size(max(f['end_bytes'], 0)):>12}"
            )
        if self.temporary:
            tr.write_line(
                "traces: removed at exit (keep them with --poolsight-dir DIR; "
                "`poolsight report DIR/TRACE` reads one)"
            )
        else:
            tr.write_line(f"traces: {self.dir} (`poolsight report TRACE` reads one)")


def _stacks(figures: dict, n: int = _STACKS_SHOWN) -> str:
    """The stacks that held most at the peak, one per line: outermost frame first, as ``poolsight
    flamegraph --metric peak`` draws them."""
    lines = []
    for frames, nbytes in figures["at_peak"][:n]:
        path = " -> ".join(frames) if frames else "(allocated outside every scope)"
        lines.append(f"  {size(nbytes):>12}  {path}")
    rest = figures["at_peak"][n:]
    if rest:
        lines.append(f"  {size(sum(b for _, b in rest)):>12}  ({len(rest)} more stacks)")
    return "\n".join(lines)


def _peak_on(f: dict, device: str | None) -> tuple[int, str]:
    """The peak a ``limit_memory`` checks, and where it is (for the message): every device's
    live bytes together without ``device``; with it, the highest own peak of the devices it
    names (each device's live bytes alone, at that device's own peak; 0 when none of them held
    anything)."""
    if device is None:
        return f["peak_bytes"], ""
    own = {name: b for name, kind, b in f["device_peaks"] if _on_device(name, kind, device)}
    if not own:
        return 0, f" on {device}"
    name = max(own, key=own.get)
    if len(f["device_peaks"]) == 1:
        return own[name], f" on {name}"
    return own[name], f" on {name} (its own peak; the test used other devices too)"


def _kept(result: _Result) -> str:
    return "" if result.kept else " (removed at exit: keep it with --poolsight-dir DIR)"


def _check(lim: _Limit, result: _Result) -> str | None:
    """The failure message of one limit the test crossed, else None."""
    f = result.figures
    assert f is not None
    if lim.marker == "limit_memory":
        peak, where = _peak_on(f, lim.device)
        if peak <= lim.limit:
            return None
        return (
            f"poolsight: the test's peak of live bytes{where} is {size(peak)} ({peak:,} B), "
            f"above its limit of {size(lim.limit)} ({lim.limit:,} B).\n"
            f"What held most at the peak (stacks, outermost frame first):\n"
            f"{_stacks(f)}\n"
            f"trace: {result.path}{_kept(result)}"
        )
    left = max(f["end_bytes"], 0)
    if left <= lim.limit:
        return None
    warm = f" after {lim.warmups} warm-up run{'s' if lim.warmups != 1 else ''}"
    kept = [(name or "unlabelled", end) for name, _, end in f["categories"] if end > 0]
    by_category = ""
    if kept:
        kept.sort(key=lambda c: c[1], reverse=True)
        by_category = "What is still alive, by category:\n" + "\n".join(
            f"  {size(b):>12}  {name}" for name, b in kept
        )
        by_category += "\n"
    return (
        f"poolsight: the test left {size(left)} ({left:,} B) alive after it returned"
        f"{warm if lim.warmups else ''}, above its leak limit of {size(lim.limit)} "
        f"({lim.limit:,} B).\n"
        f"{by_category}"
        f"What held most at the test's peak (stacks, outermost frame first):\n"
        f"{_stacks(f)}\n"
        f"trace: {result.path}{_kept(result)}"
    )
