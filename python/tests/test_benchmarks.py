"""The PyTorch benchmark scripts the docs show run, at their smallest, and print every row.

Their figures are not checked (machines are noisy); that each variant runs to a ratio is."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
RATIO = r"\s+\d+\.\d+"


def run(script: str, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_torch_overhead_prints_each_variant_against_plain():
    out = run(
        "torch_overhead.py",
        *("--repeats", "1", "--epochs", "2", "--steps", "1"),
        *("--only", "empty bound", "track+hook (native)", "track+hook (python)"),
    )
    for variant in ("plain", "empty bound", "track+hook (native)", "track+hook (python)"):
        # CPU, thread and wall seconds, the ratio, the paired ratio, the first epoch's and the
        # later ones', once, the microseconds per operator over the plain run.
        assert re.search(rf"^{re.escape(variant)}{RATIO * 8}\s+[+-]\d+\.\d+$", out, re.M), out
    assert re.search(
        rf"^plain{RATIO * 3}\s+1\.00\s+1\.000\s+1\.00\s+1\.00{RATIO}\s+\+0\.00$", out, re.M
    ), out


def test_torch_overhead_pools_fresh_processes_and_prints_each_ones_ratio():
    out = run(
        "torch_overhead.py",
        *("--processes", "2", "--repeats", "1", "--epochs", "1", "--steps", "1"),
        # The plain run named last: each process's line is of the other variants all the same.
        *("--only", "track+hook (native)", "plain"),
    )
    assert "medians of 2 shuffled repeats (1 in each of 2 processes), seed 0" in out, out
    assert re.search(rf"^track\+hook \(native\){RATIO * 7}\s+[+-]\d+\.\d+$", out, re.M), out
    assert re.search(
        r"^paired, by process:\n  track\+hook \(native\)\s+\d\.\d{3} \d\.\d{3}$", out, re.M
    ), out


def test_each_repeat_runs_every_variant_once_in_an_order_drawn_from_its_seed():
    spec = importlib.util.spec_from_file_location(
        "torch_overhead", BENCHMARKS / "torch_overhead.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    names = ["plain", "plain (again)", "track", "hook", "profiler"]
    drawn = bench.orders(names, 40, 3)
    assert all(sorted(order) == sorted(names) for order in drawn)
    assert drawn == bench.orders(names, 40, 3)
    assert drawn != bench.orders(names, 40, 4)
    # Over the repeats the plain run is in every place and beside every other variant (forward
    # and back, it would only be first or last, beside the same one).
    places = [order.index("plain") for order in drawn]
    assert set(places) == set(range(len(names)))
    beside = {
        order[i + d] for order, i in zip(drawn, places) for d in (-1, 1) if 0 <= i + d < len(names)
    }
    assert set(names) - {"plain"} <= beside


def test_cpp_observer_floor_runs_or_says_why_not():
    out = run("cpp_observer_floor.py", "--repeats", "1", "--steps", "1")
    if "C++ observer" not in out:
        assert "no g++" in out or "did not compile" in out, out
        pytest.skip(out.strip().splitlines()[0])
    for variant in (
        "plain",
        "empty bound",
        "C++ observer",
        "C++ dispatch key",
        "track+hook (native)",
    ):
        assert re.search(rf"^{re.escape(variant)}{RATIO * 2}$", out, re.M), out
    assert re.search(r"C\+\+ observer saw [\d,]+ operator calls", out), out
    # The fallback sees each operator a dispatch mode sees once, and none of the nested ones
    # RecordFunction records: fewer calls than the callback's, and not none.
    seen = {
        who: int(n.replace(",", ""))
        for who, n in re.findall(r"the (C\+\+|dispatch-key) observer saw ([\d,]+)", out)
    }
    assert 0 < seen["dispatch-key"] < seen["C++"], out


def test_torch_per_op_prints_microseconds_per_operator_for_each_variant():
    out = run(
        "torch_per_op.py",
        *("--repeats", "1", "--steps", "2", "--layers", "2"),
        *("--only", "track+hook (native)", "track+hook (python)"),
    )
    for variant in ("plain", "track+hook (native)", "track+hook (python)"):
        # CPU seconds, the ratio, the microseconds per operator over the plain run.
        assert re.search(rf"^{re.escape(variant)}{RATIO * 2}\s+[+-]\d+\.\d+$", out, re.M), out
    assert re.search(r"^plain\s+\d+\.\d+\s+1\.00\s+\+0\.00$", out, re.M), out
    ops = int(re.search(r"([\d,]+) operators", out).group(1).replace(",", ""))
    assert ops > 2 * 2 * 4, out


@pytest.mark.parametrize(
    "script", ["torch_overhead.py", "cpp_observer_floor.py", "torch_per_op.py"]
)
def test_a_count_below_one_is_a_usage_error(script):
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--steps", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "--steps: must be at least 1, not 0" in proc.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--device", "gpu"], "--device: cpu, cuda or cuda:N, not 'gpu'"),
        (["--only", "memory history"], "--only: 'memory history' needs --device cuda"),
        (["--only", "profiler", "nothing"], "--only: no variant 'nothing'"),
        (["--profile", "--profile-variant", "nothing"], "--profile-variant: no variant"),
        (["--processes", "0"], "--processes: must be at least 1, not 0"),
    ],
)
def test_torch_overhead_says_what_is_wrong_with_its_arguments(args, message):
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "torch_overhead.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr, proc.stderr


def test_torch_overhead_on_cuda_compares_wall_time_beside_the_memory_history():
    import torch

    if not torch.cuda.is_available():
        proc = subprocess.run(
            [sys.executable, str(BENCHMARKS / "torch_overhead.py"), "--device", "cuda"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 2, proc.stderr
        assert "PyTorch sees no CUDA device here" in proc.stderr, proc.stderr
        pytest.skip("no CUDA device: the benchmark refuses --device cuda, as it should")
    out = run(
        "torch_overhead.py",
        *("--device", "cuda", "--repeats", "1", "--epochs", "2", "--steps", "1"),
        *("--only", "track+hook (native)", "memory history"),
    )
    assert re.search(r"x plain \(wall\)", out), out
    for variant in ("plain", "track+hook (native)", "memory history"):
        assert re.search(rf"^{re.escape(variant)}{RATIO * 8}\s+[+-]\d+\.\d+$", out, re.M), out


def test_predict_step_prints_poolsight_beside_memtracker():
    out = run("predict_step.py", "--size", "tiny", "--context", "32")
    rows = {line.split()[0]: line.split() for line in out.splitlines()[2:]}
    assert set(rows) == {"poolsight", "memtracker"}, out
    # Wall seconds, peak RSS and the active peak of each; only fake_cuda has a reserved peak.
    assert rows["poolsight"][-1] == "GiB" and rows["memtracker"][-1] == "-", out
