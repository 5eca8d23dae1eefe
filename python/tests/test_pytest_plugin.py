"""``pytest --poolsight`` (python/poolsight/pytest_plugin.py), run on test files of its own with
``pytester``: each test recorded into a trace, the limit_memory and limit_leaks markers failing
a test for the right reason with the stacks that held most, the summary of the largest peaks,
and a run without ``--poolsight`` left untouched."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import report_json

import poolsight
from poolsight import pytest_plugin

pytest_plugins = ["pytester"]
torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20

# Tests of one file: a float32 tensor of 4 MiB made in a function of the test module, and one
# of 1 MiB.
TENSORS = """
import pytest
import torch


def build(n):
    return torch.zeros(n // 4, dtype=torch.float32)


@pytest.mark.limit_memory("1 MB")
def test_big():
    x = build(4 << 20)
    assert x.numel() == 1 << 20


@pytest.mark.limit_memory("2 MB")
def test_small():
    x = build(1 << 20)
    assert x.numel() == 1 << 18
"""


def _failure(result, name: str) -> str:
    """The failure text of test ``name`` in a pytester run."""
    reports = [
        r
        for r in result.getreports("pytest_runtest_logreport")
        if r.when == "call" and r.nodeid.endswith("::" + name)
    ]
    assert reports, f"no report of {name}"
    return str(reports[0].longrepr)


def test_a_test_over_its_limit_fails_naming_the_stacks_at_the_peak(pytester):
    pytester.makepyfile(test_tensors=TENSORS)
    result = pytester.inline_run("--poolsight", "-p", "no:cacheprovider")
    result.assertoutcome(passed=1, failed=1)
    passed, _, failed = result.listoutcomes()
    assert [r.nodeid.split("::")[1] for r in passed] == ["test_small"]
    assert [r.nodeid.split("::")[1] for r in failed] == ["test_big"]
    message = _failure(result, "test_big")
    # Over the limit for the right reason: the 4 MiB tensor, figures exact.
    assert "peak of live bytes is 4.00 MiB (4,194,304 B), above its limit of 1.00 MiB" in (
        message
    ), message
    # The stack that held it: the line of the test's code that made it, and its category.
    top = message.splitlines()[2]
    assert top.split() == ["4.00", "MiB", "build", "(test_tensors.py:6)", "->", "input"], top


def test_hooking_the_model_in_the_test_names_module_and_operator(pytester):
    pytester.makepyfile(
        test_hooked="""
        import contextlib
        import poolsight, poolsight.torch
        import pytest
        import torch

        @pytest.mark.limit_memory("24 MB")
        def test_forward():
            model = torch.nn.Sequential(torch.nn.Linear(1024, 4096))
            with poolsight.torch.hook(model) if poolsight.active() else contextlib.nullcontext():
                model(torch.randn(2048, 1024))
        """
    )
    result = pytester.inline_run("--poolsight", "-p", "no:cacheprovider")
    result.assertoutcome(failed=1)
    lines = _failure(result, "test_forward").splitlines()
    # 2048 x 4096 float32 outputs of the Linear: your line -> module -> operator -> category.
    assert lines[2].split(None, 2)[:2] == ["32.00", "MiB"], lines
    frames = lines[2].split(None, 2)[2].split(" -> ")
    assert re.fullmatch(r"test_forward \(test_hooked\.py:\d+\)", frames[0]), frames
    assert frames[1].startswith("Sequential (") and frames[2].startswith("0: Linear ("), frames
    assert frames[3:] == ["aten::addmm", "activation"], frames
    # Without --poolsight the same test runs (and passes: nothing checks its limit).
    pytester.inline_run("-p", "no:cacheprovider").assertoutcome(passed=1)


def test_the_limit_is_the_peak_not_what_is_alive_at_the_end(pytester):
    pytester.makepyfile(
        test_peak="""
        import pytest
        import torch

        @pytest.mark.limit_memory("3 MB")
        def test_transient():
            for _ in range(3):
                x = torch.ones(1 << 20)  # 4 MiB, freed before the next
                del x
        """
    )
    result = pytester.inline_run("--poolsight", "-p", "no:cacheprovider")
    result.assertoutcome(failed=1)
    assert "is 4.00 MiB (4,194,304 B)" in _failure(result, "test_transient")


def test_leaks_with_warmups_are_what_the_recorded_run_keeps(pytester):
    pytester.makepyfile(
        test_leaks="""
        import pytest
        import torch

        CACHE = []
        KEPT = []

        def cached():
            if not CACHE:  # filled on the first call only
                CACHE.append(torch.ones(1 << 18))  # 1 MiB
            return CACHE[0]

        @pytest.mark.limit_leaks("100 KB", warmups=1)
        def test_cache_warmed_up():
            cached().sum()

        @pytest.mark.limit_leaks("100 KB")
        def test_cache_cold():
            torch.ones(10).sum()
            KEPT.append(torch.ones(1 << 17))  # 512 KiB kept by every call

        @pytest.mark.limit_leaks("100 KB", warmups=2)
        def test_kept_each_call():
            KEPT.append(torch.ones(1 << 17))  # 512 KiB kept by every call
        """
    )
    result = pytester.inline_run("--poolsight", "-p", "no:cacheprovider")
    result.assertoutcome(passed=1, failed=2)
    passed = [r.nodeid.split("::")[1] for r in result.listoutcomes()[0]]
    assert passed == ["test_cache_warmed_up"]
    for name in ("test_cache_cold", "test_kept_each_call"):
        message = _failure(result, name)
        assert "left 512.00 KiB (524,288 B) alive after it returned" in message, message
        assert "above its leak limit of 100.00 KiB" in message, message
    assert "after 2 warm-up runs" in _failure(result, "test_kept_each_call")


def test_a_cold_cache_is_a_leak_without_warmups(pytester):
    pytester.makepyfile(
        test_cold="""
        import pytest
        import torch

        CACHE = []

        @pytest.mark.limit_leaks("100 KB")
        def test_cache():
            if not CACHE:
                CACHE.append(torch.ones(1 << 18))
        """
    )
    result = pytester.inline_run("--poolsight", "-p", "no:cacheprovider")
    result.assertoutcome(failed=1)
    assert "left 1.00 MiB (1,048,576 B) alive" in _failure(result, "test_cache")


def test_device_picks_the_memory_the_limit_is_about(pytester):
    pytester.makepyfile(
        test_devices="""
        import pytest
        import torch

        @pytest.mark.limit_memory("1 MB", device="cuda")
        def test_cpu_tensors_under_a_gpu_limit():
            torch.ones(1 << 20)

        @pytest.mark.limit_memory("1 MB", device="cpu")
        def test_cpu_tensors_under_a_cpu_limit():
            torch.ones(1 << 20)
        """
    )
    result = pytester.inline_run("--poolsight", "-p", "no:cacheprovider")
    result.assertoutcome(passed=1, failed=1)
    message = _failure(result, "test_cpu_tensors_under_a_cpu_limit")
    assert "peak of live bytes on cpu is 4.00 MiB" in message, message


def test_poolsight_pools_record_into_the_tests_recording(pytester):
    pytester.makepyfile(
        test_pool="""
        import poolsight
        import pytest

        @pytest.mark.limit_memory("2 MB")
        def test_pool():
            pool = poolsight.Pool(poolsight.active())
            ptr = pool.malloc(3 << 20)
            pool.free(ptr)
        """
    )
    result = pytester.inline_run("--poolsight", "-p", "no:cacheprovider")
    result.assertoutcome(failed=1)
    assert "is 3.00 MiB (3,145,728 B)" in _failure(result, "test_pool")


def test_the_summary_lists_the_largest_peaks_and_the_traces_are_kept(pytester, tmp_path):
    pytester.makepyfile(
        test_sizes="""
        import torch

        def test_one():
            torch.ones(1 << 18)

        def test_four():
            torch.ones(1 << 20)

        def test_two():
            torch.ones(1 << 19)
        """
    )
    kept = tmp_path / "traces"
    result = pytester.runpytest(
        "--poolsight", f"--poolsight-dir={kept}", "--poolsight-top=2", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=3)
    out = result.stdout.str()
    lines = out[out.index("largest peaks") :].splitlines()
    assert "(2 of 3 tests recorded)" in lines[0], out
    assert re.match(r"\s+test_sizes\.py::test_four\s+4\.00 MiB\s+0 B$", lines[2]), out
    assert re.match(r"\s+test_sizes\.py::test_two\s+2\.00 MiB\s+0 B$", lines[3]), out
    assert f"traces: {kept}" in out
    traces = sorted(kept.glob("*.pstrace"))
    assert len(traces) == 3
    four = next(t for t in traces if "test_four" in t.name)
    # The figures are the analyzer's: `poolsight report` of the kept trace says the same.
    assert report_json("report", four)["summary"]["peak_used_bytes"] == 4 * MiB


def test_without_the_flag_tests_run_untouched(pytester):
    pytester.makepyfile(
        test_plain="""
        import sys
        import pytest

        @pytest.mark.limit_memory("1 B")
        @pytest.mark.limit_leaks("1 B")
        def test_plain():
            # Nothing imported PyTorch for poolsight, and nothing is recording.
            assert "torch" not in sys.modules
            import poolsight
            assert poolsight.active() is None
        """
    )
    result = pytester.runpytest_subprocess("--strict-markers", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["poolsight: 1 test with limit_memory/limit_leaks ran without their limits checked*"]
    )
    assert "largest peaks" not in result.stdout.str()


def test_wrong_marker_arguments_are_the_tests_error(pytester):
    pytester.makepyfile(
        test_wrong="""
        import pytest

        @pytest.mark.limit_memory("lots")
        def test_unit():
            pass

        @pytest.mark.limit_memory("1 MB", device="tpu")
        def test_device():
            pass

        @pytest.mark.limit_leaks("1 MB", warmups=-1)
        def test_warmups():
            pass

        @pytest.mark.limit_leaks()
        def test_no_limit():
            pass
        """
    )
    result = pytester.inline_run("--poolsight", "-p", "no:cacheprovider")
    result.assertoutcome(failed=4)
    assert "not 'lots'" in _failure(result, "test_unit")
    assert "device is 'cpu', 'cuda', 'cuda:N' or None, not 'tpu'" in _failure(result, "test_device")
    assert "warmups is an int >= 0, not -1" in _failure(result, "test_warmups")
    assert "missing a required argument: 'limit'" in _failure(result, "test_no_limit")


def test_a_failing_test_keeps_its_own_failure(pytester):
    pytester.makepyfile(
        test_fails="""
        import pytest
        import torch

        @pytest.mark.limit_memory("1 B")
        def test_fails():
            torch.ones(1 << 20)
            assert 1 == 2
        """
    )
    result = pytester.inline_run("--poolsight", "-p", "no:cacheprovider")
    result.assertoutcome(failed=1)
    message = _failure(result, "test_fails")
    assert "assert 1 == 2" in message and "poolsight" not in message


def test_bad_options_are_usage_errors(pytester, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    result = pytester.runpytest("--poolsight", f"--poolsight-dir={afile}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--poolsight-dir" in result.stderr.str()
    result = pytester.runpytest("--poolsight", "--poolsight-top=-1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--poolsight-top is 0 (all) or more, not -1" in result.stderr.str()


@pytest.mark.parametrize(
    ("text", "nbytes"),
    [
        (1000, 1000),
        ("24 MB", 24 * MiB),
        ("2GB", 2 << 30),
        ("1.5 KiB", 1536),
        ("512 b", 512),
        ("1 M", MiB),
    ],
)
def test_limits_read_as_pytest_memray_reads_them(text, nbytes):
    assert pytest_plugin.parse_limit(text) == nbytes


@pytest.mark.parametrize("text", ["", "MB", "1 XB", "-1 MB", -1, True, 1.5, None])
def test_limits_that_are_not_sizes_are_refused(text):
    with pytest.raises(ValueError):
        pytest_plugin.parse_limit(text)


def test_the_plugin_is_an_entry_point_of_the_package():
    from importlib.metadata import entry_points

    found = [ep for ep in entry_points(group="pytest11") if ep.name == "poolsight"]
    assert [ep.value for ep in found] == ["poolsight.pytest_plugin"]


def test_peak_figures_come_from_the_analyzer(trace):
    with poolsight.record(trace) as rec:
        pool = poolsight.Pool(rec)
        a = pool.malloc(3 * MiB)
        pool.free(a)
        pool.malloc(MiB)
    figures = poolsight._native.peak(str(trace))
    summary = report_json("report", trace)["summary"]
    assert figures["peak_bytes"] == summary["peak_used_bytes"] == 3 * MiB
    assert figures["end_bytes"] == MiB
    assert sum(b for _, b in figures["at_peak"]) == 3 * MiB
    with pytest.raises(poolsight.PoolsightError):
        poolsight._native.peak(str(trace.with_name("missing.pstrace")))


def test_readme_example_fails_as_the_readme_shows(pytester):
    """README.md's "Memory limits in pytest": its test file, run with the command it shows,
    fails with the message it shows, line for line (the trace's path as it comes)."""
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Memory limits in pytest") :]
    section = section[: section.index("\n## ", 1)]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    shown = re.search(r"```text\n(.*?)```", section, re.S).group(1)
    command = re.search(r"```sh\n(.*?)```", section, re.S).group(1).strip()
    assert command.startswith("pytest --poolsight"), command
    pytester.makepyfile(test_model=code)
    result = pytester.runpytest(*command.split()[1:], "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()

    def message(text: str) -> list:
        # From the first line of poolsight's message to its trace line, the path left out.
        lines = text.splitlines()
        first = next(i for i, line in enumerate(lines) if line.startswith("poolsight: the test"))
        last = next(i for i in range(first, len(lines)) if lines[i].startswith("trace: "))
        return [
            re.sub(r"^trace: \S+\.pstrace", "trace: TRACE", line)
            for line in lines[first : last + 1]
        ]

    got, want = message(out), message(shown)
    assert len(want) >= 3, shown
    assert got == want, "\n".join(got)


def test_a_device_limit_checks_that_devices_own_peak_when_a_test_mixes_devices(pytester):
    # 3 MiB in a poolsight pool (its own device) while 2 MiB of CPU tensors live: 5 MiB in all
    # at the peak, 2 MiB at the CPU's own.
    pytester.makepyfile(
        test_mixed="""
        import poolsight
        import pytest
        import torch

        def work():
            pool = poolsight.Pool(poolsight.active())
            ptr = pool.malloc(3 << 20)
            x = torch.ones(1 << 19)
            del x
            pool.free(ptr)
            torch.ones(1 << 18)

        @pytest.mark.limit_memory("4 MB", device="cpu")
        def test_cpu_within():
            work()

        @pytest.mark.limit_memory("1 MB", device="cpu")
        def test_cpu_over():
            work()

        @pytest.mark.limit_memory("4 MB")
        def test_all_over():
            work()
        """
    )
    result = pytester.inline_run("--poolsight", "-p", "no:cacheprovider")
    result.assertoutcome(passed=1, failed=2)
    cpu = _failure(result, "test_cpu_over")
    assert "peak of live bytes on cpu (its own peak; the test used other devices too) is " in cpu
    assert "is 2.00 MiB (2,097,152 B)" in cpu, cpu
    assert "is 5.00 MiB (5,242,880 B)" in _failure(result, "test_all_over")
