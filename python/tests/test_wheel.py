"""The manylinux2014 x86_64 wheel (scripts/wheels.sh) installed into a fresh virtual environment
with no Rust toolchain on PATH records a run, and its ``poolsight`` command reads it.

Which wheel: ``POOLSIGHT_WHEEL`` (a path: the release workflow's), else the one in
``target/manylinux``, installed by README.md's "Install from a wheel" lines as written; with
neither, ``POOLSIGHT_WHEEL_TEST=1`` builds it first with the README's ``scripts/wheels.sh``
line (minutes). Otherwise the test is skipped, saying why: building release wheels does not
belong in every test run.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WHEELS = REPO / "target" / "manylinux"
PATTERN = "poolsight-*manylinux2014_x86_64*.whl"


def _skip(reason: str):
    print(f"skipped test_wheel.py: {reason}", file=sys.stderr)
    pytest.skip(reason)


def _readme_lines() -> tuple:
    """README.md's "Install from a wheel" commands: (build, install)."""
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("### Install from a wheel") :]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    build, install = block.strip().splitlines()
    assert build.startswith("scripts/wheels.sh") and install.startswith("pip install "), block
    return build, install


def _wheel() -> tuple:
    """The wheel, and the command that installs it (``pip`` is the fresh venv's)."""
    build, install = _readme_lines()
    given = os.environ.get("POOLSIGHT_WHEEL")
    if given:
        path = Path(given).resolve()
        assert path.is_file(), f"POOLSIGHT_WHEEL={given} is not a file"
        return path, f"pip install {path}"
    if platform.machine() != "x86_64":
        _skip(f"the x86_64 wheel does not run on {platform.machine()}")
    built = sorted(WHEELS.glob(PATTERN))
    if not built and os.environ.get("POOLSIGHT_WHEEL_TEST") == "1":
        subprocess.run(["bash", "-c", build], check=True, cwd=REPO)
        built = sorted(WHEELS.glob(PATTERN))
    if not built:
        _skip(
            f"no {PATTERN} in target/manylinux and POOLSIGHT_WHEEL is unset: run "
            "scripts/wheels.sh x86_64, or set POOLSIGHT_WHEEL_TEST=1 to build it here"
        )
    if len(built) > 1:
        _skip(f"several wheels match the README's line in target/manylinux: {built}")
    return built[0], install


RUN = """
import poolsight

with poolsight.record("run.pstrace") as rec:
    pool = poolsight.Pool(rec)
    for epoch in range(2):
        with rec.epoch(epoch), rec.link("MLP"):
            ptr = pool.malloc(3 << 20)
            pool.free(ptr)
print(poolsight.__file__)
"""


def test_the_wheel_installs_and_runs_without_rust(tmp_path):
    wheel, install = _wheel()
    with zipfile.ZipFile(wheel) as z:
        tags = next(n for n in z.namelist() if n.endswith(".dist-info/WHEEL"))
        text = z.read(tags).decode()
    # One abi3 wheel for every CPython >= 3.9, for glibc 2.17 and later.
    assert "Tag: cp39-abi3-manylinux_2_17_x86_64" in text, text
    assert "Tag: cp39-abi3-manylinux2014_x86_64" in text, text

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    bin_dir = env_dir / "bin"
    # No Rust toolchain, no cargo: only the venv and the system's own programs.
    path = os.pathsep.join([str(bin_dir), "/usr/bin", "/bin"])
    for tool in ("cargo", "rustc", "maturin"):
        assert shutil.which(tool, path=path) is None, f"{tool} is on the test's PATH"
    env = {"PATH": path, "HOME": str(tmp_path), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    started = time.perf_counter()
    subprocess.run(
        ["bash", "-c", f"{install} --quiet --no-index"],
        check=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )
    took = time.perf_counter() - started
    print(f"{wheel.name}: {wheel.stat().st_size:,} B, installed in {took:.1f} s", file=sys.stderr)

    work = tmp_path / "work"
    work.mkdir()
    out = subprocess.run(
        [str(bin_dir / "python"), "-c", RUN],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    # The package came from the fresh environment, not from this checkout.
    assert out.stdout.strip().startswith(str(env_dir)), out.stdout
    cli = [str(bin_dir / "poolsight")]
    report = subprocess.run(
        [*cli, "report", "--format", "json", "run.pstrace"],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr
    summary = json.loads(report.stdout)["summary"]
    # Two epochs, each a 3 MiB malloc freed: the pool's peak, exact.
    assert summary["peak_used_bytes"] == 3 << 20, summary
    epochs = subprocess.run(
        [*cli, "epochs", "run.pstrace"], env=env, cwd=work, capture_output=True, text=True
    )
    assert epochs.returncode == 0, epochs.stderr
    assert [line.split()[0] for line in epochs.stdout.splitlines()[1:]] == ["0", "1"], epochs
