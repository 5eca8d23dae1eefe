"""Shared helpers: a fresh trace path per test, and the installed `poolsight` command."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def poolsight_command() -> list:
    """The console script the wheel installed next to this interpreter, else the module."""
    exe = Path(sys.executable).with_name("poolsight")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("poolsight")
    return [found] if found else [sys.executable, "-m", "poolsight"]


def run_cli(*args, check=True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [*poolsight_command(), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"poolsight {' '.join(map(str, args))} exited {proc.returncode}:\n{proc.stderr}"
        )
    return proc


def report_json(command: str, trace, *extra) -> dict:
    return json.loads(run_cli(command, trace, "--format", "json", *extra).stdout)


@pytest.fixture
def trace(tmp_path) -> Path:
    return tmp_path / "run.pstrace"


@pytest.fixture(autouse=True)
def _no_leftover_recordings():
    import poolsight

    yield
    # A test that forgot to finish would leak into the next one's `active()`.
    while poolsight.active() is not None:
        poolsight.active().finish()


def skip_without(module: str, why: str):
    try:
        __import__(module)
    except ImportError:
        print(f"skipped: {module} is not installed ({why})", file=sys.stderr)
        return pytest.mark.skip(reason=f"{module} is not installed ({why})")
    return pytest.mark.usefixtures()


os.environ.setdefault("NO_COLOR", "1")


@pytest.fixture(params=["native", "python"])
def backend(request, monkeypatch):
    """What ``track()`` and ``hook()`` pick by default in the test (``backend="auto"``): each
    test that uses it runs with each backend (the native one skipped, saying why, where it
    cannot be built)."""
    import poolsight.torch as pst

    if request.param == "native":
        from poolsight import _native_observer

        try:
            _native_observer.load()
        except _native_observer.Unavailable as e:
            print(f"skipped: no native observer here ({e})", file=sys.stderr)
            pytest.skip(f"no native observer here: {e}")
    monkeypatch.setattr(pst, "_AUTO", request.param)
    return request.param
