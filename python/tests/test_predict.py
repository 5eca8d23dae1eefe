"""``poolsight predict`` (and ``python -m poolsight.predict``), and pytest's
``--poolsight-fake-cuda``: a script run on fake CUDA tensors, as a user runs one."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import poolsight_command, run_cli

# The script docs/predict.md shows (line 21: the optimizer step).
SCRIPT = (Path(__file__).resolve().parents[2] / "fixtures" / "scripts" / "train_mlp.py").read_text()


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return path


def predict(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*poolsight_command(), "predict", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
    )


def test_predict_prints_the_peaks_whether_it_fits_and_what_was_live(script, tmp_path):
    trace = tmp_path / "p.pstrace"
    out = predict("--gpu", "T4", "-o", trace, "--", "python", script, "--batch-size", "256")
    assert out.returncode == 0, out.stderr
    printed = out.stdout.splitlines()
    # The script's own line, as torch.cuda answered it, then the prediction.
    peak, reserved = (int(w) for w in printed[0].split()[1::2])
    assert printed[1].startswith("prediction: a CUDA run on T4 (Tesla T4)")
    text = out.stdout
    assert f"active peak      {peak / 2**20:.2f} MiB" in text
    assert f"reserved peak    {reserved / 2**20:.2f} MiB" in text
    assert "fits             yes" in text
    # The peak is in the first step, while AdamW makes its state: until the step returns,
    # that state is the step's temporary memory.
    assert "by category:" in text and "workspace" in text and "temporary" in text
    assert f"{script.name}:21:<module> > AdamW.step" in text
    assert "3 optimizer steps" in text
    assert "running" in out.stderr and "step 1" in out.stderr
    assert trace.exists()
    info = json.loads(run_cli("info", trace, "--format", "json").stdout)
    assert info["prediction"]["gpu"] == "T4"


def test_predict_exits_1_when_it_does_not_fit_and_says_what_failed(script):
    out = predict(
        "--capacity", "100MiB", "-q", "--format", "json", "--", script, "--batch-size", "4096"
    )
    assert out.returncode == 1, out.stderr
    doc = json.loads(out.stdout)
    assert doc["fits"] is False and doc["capacity_bytes"] == 100 << 20
    assert doc["first_failure"]["requested_bytes"] > 0
    assert doc["first_failure"]["line"].split(":")[0].endswith("train.py")
    assert doc["min_capacity_bytes"] > 100 << 20
    assert doc["active_peak_bytes"] > 0 and doc["optimizer_steps"] == 3
    assert {c["name"] for c in doc["live_at_peak_by_category"]} >= {"parameter", "activation"}


def test_steps_stops_the_command_and_the_module_form_runs_the_same(script, tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "poolsight.predict",
            "--steps",
            "1",
            "--format",
            "json",
            "--",
            script,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["optimizer_steps"] == 1 and doc["gpu"] == "H100-80GB"
    assert "stopped after 1 optimizer steps" in out.stderr


def test_search_finds_the_largest_batch_and_its_next_does_not_fit(script):
    out = predict(
        "--capacity",
        "400MiB",
        "--search",
        "n=1..65536",
        "-q",
        "--",
        script,
        "--batch-size",
        "{n}",
        "--steps",
        "1",
    )
    assert out.returncode == 0, out.stderr
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("largest that fits in 400.00 MiB: "), out.stdout
    n = int(last.rsplit(" ", 1)[1])
    assert out.stdout.splitlines()[0].split() == ["n", "active", "peak", "reserved", "peak", "fits"]
    fits = predict("--capacity", "400MiB", "-q", "--", script, "--batch-size", n, "--steps", "1")
    over = predict(
        "--capacity", "400MiB", "-q", "--", script, "--batch-size", n + 1, "--steps", "1"
    )
    assert (fits.returncode, over.returncode) == (0, 1), (fits.stderr, over.stderr)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpu", "X100", "--", "train.py"], "unknown GPU 'X100'"),
        (["--gpu", "T4", "--capacity", "1GiB", "--", "train.py"], "not allowed with argument"),
        (["--", "missing.py"], "missing.py: no such script"),
        ([], "no command given"),
        (["--steps", "0", "--", "train.py"], "--steps must be at least 1"),
        (["--settings", "expandable_segments:Maybe", "--", "train.py"], "PYTORCH_CUDA_ALLOC_CONF"),
        (["--search", "n=5..2", "--", "train.py"], "HIGH is below LOW"),
        (["--search", "batch=1..8", "--", "train.py"], "no {batch} to replace"),
    ],
)
def test_bad_input_is_one_clear_error_and_exit_2(script, args, message):
    out = predict(*args, cwd=script.parent)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert message in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_a_command_that_fails_or_asks_a_value_fails_predict_with_its_own_error(tmp_path):
    boom = tmp_path / "boom.py"
    boom.write_text(
        "import torch\nx = torch.ones(3, device='cuda')\nraise KeyError('my own bug')\n"
    )
    out = predict("-q", "--", boom)
    assert out.returncode == 2
    assert "KeyError: 'my own bug'" in out.stderr and "the command failed" in out.stderr
    item = tmp_path / "item.py"
    item.write_text("import torch\nloss = torch.ones(3, device='cuda').sum()\nprint(loss.item())\n")
    out = predict("-q", "--", item)
    assert out.returncode == 2
    assert "item.py:3 (in <module>) asks for the value of a fake CUDA tensor" in out.stderr
    assert predict("-q", "--items", "zero", "--", item).returncode == 0


def test_an_unknown_gpu_lists_the_table_and_list_gpus_prints_it():
    out = predict("--list-gpus")
    assert out.returncode == 0
    assert "H100-80GB" in out.stdout and "A100-40GB" in out.stdout and "RTX-4090" in out.stdout


def test_pytest_runs_cuda_tests_on_fake_tensors_and_gates_the_predicted_peak(tmp_path):
    test = tmp_path / "test_gpu.py"
    test.write_text(
        textwrap.dedent(
            """\
            import pytest
            import torch

            @pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
            @pytest.mark.limit_memory("100 MB", device="cuda")
            def test_wide_layer():
                model = torch.nn.Linear(4096, 4096).cuda()
                model(torch.randn(2048, 4096, device="cuda")).sum().backward()

            @pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
            @pytest.mark.limit_memory("100 MB", device="cuda")
            def test_narrow_layer():
                model = torch.nn.Linear(256, 256).cuda()
                model(torch.randn(8, 256, device="cuda")).sum().backward()
            """
        )
    )
    outs = []
    for _ in range(2):
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "--poolsight-fake-cuda",
                "--poolsight-gpu",
                "T4",
                str(test),
            ],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
        )
        outs.append(out.stdout)
    assert "1 failed, 1 passed" in outs[0], outs[0]
    line = next(ln for ln in outs[0].splitlines() if "above its limit" in ln)
    assert "on cuda:0 is 177.28 MiB" in line, line
    assert "test_gpu.py:8) -> temporary" in outs[0]
    # The same figure on every run: no flaky limits.
    assert line in outs[1]
    assert "figures on cuda are predicted for T4" in outs[0]
