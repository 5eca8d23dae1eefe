"""Crash drills from Python: the recorder never hurts the training run it observes.

One recording per file, never a signal; a call that raises is not a call; hooks on a finished
recording never raise into training; wrong use is refused where it happens; deep stacks report.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from conftest import report_json, run_cli

import poolsight
from poolsight import _native

# -- one recording per file ------------------------------------------------------------------


def test_a_second_recording_of_one_file_is_refused_and_the_first_goes_on(trace):
    first = poolsight.record(trace)
    pool = poolsight.Pool(first)
    for _ in range(100):
        pool.free(pool.malloc(1000))
    for overwrite in (False, True):
        with pytest.raises(poolsight.PoolsightError, match=rf"this process \(pid {os.getpid()}\)"):
            poolsight.record(trace, overwrite=overwrite)
    for _ in range(100):
        pool.free(pool.malloc(1000))
    first.finish()
    info = report_json("info", trace)
    assert info["finished"] and info["events"]["malloc_post"] == 200


def test_a_rerun_while_the_old_job_records_is_refused_naming_it(trace, tmp_path):
    program = tmp_path / "job.py"
    program.write_text(
        textwrap.dedent(
            """
            import sys, poolsight
            with poolsight.record(sys.argv[1]) as rec:
                pool = poolsight.Pool(rec)
                pool.free(pool.malloc(1000))
                print("recording", flush=True)
                sys.stdin.readline()
                pool.free(pool.malloc(2000))
            """
        )
    )
    job = subprocess.Popen(
        [sys.executable, str(program), str(trace)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert job.stdout.readline().strip() == "recording"
        with pytest.raises(poolsight.PoolsightError, match=f"process {job.pid}"):
            poolsight.record(trace, overwrite=True)
        # A reader of the live file is fine, and learns that it is being recorded.
        assert report_json("info", trace)["recording"] is True
    finally:
        job.communicate("\n", timeout=60)
    assert job.returncode == 0
    assert report_json("info", trace)["events"]["malloc_post"] == 2


def test_an_existing_file_is_replaced_only_when_asked(trace):
    trace.write_text("my notes")
    with pytest.raises(poolsight.PoolsightError, match="already exists.*overwrite=True"):
        poolsight.record(trace)
    assert trace.read_text() == "my notes"
    with pytest.raises(TypeError, match="overwrite"):
        poolsight.record(trace, overwrite="yes")
    with poolsight.record(trace, overwrite=True) as rec:
        with rec.scope("step"):
            pass
    assert report_json("info", trace)["finished"]


# -- calls that raise ------------------------------------------------------------------------


def test_a_scope_left_by_an_exception_is_not_a_call(trace):
    with poolsight.record(trace) as rec:
        pool = poolsight.Pool(rec)

        @rec.function("Decorated")
        def decorated(fail):
            pool.free(pool.malloc(1 << 20))
            if fail:
                raise ValueError("bad batch")

        for i in range(4):
            with rec.function("Step"):
                try:
                    with rec.function("Embed"):
                        pool.free(pool.malloc(1 << 20))
                        if i == 1:
                            raise RuntimeError("bad index")
                except RuntimeError:
                    pass
                try:
                    decorated(fail=i == 2)
                except ValueError:
                    pass
        # The only call of this one raised: no row at all.
        try:
            with rec.function("OnlyRaises"):
                pool.free(pool.malloc(3 << 20))
                raise KeyError("x")
        except KeyError:
            pass
    rows = {r["name"]: r for r in report_json("functions", trace)["functions"]}
    assert "OnlyRaises" not in rows
    assert (rows["Embed"]["occurrence"], rows["Embed"]["used_bytes"]) == (3, 3 << 20)
    assert (rows["Decorated"]["occurrence"], rows["Decorated"]["used_bytes"]) == (3, 3 << 20)
    # The enclosing calls keep what the raising ones allocated.
    assert (rows["Step"]["occurrence"], rows["Step"]["used_bytes"]) == (4, 8 << 20)
    timers = {r["name"]: r["occurrence"] for r in report_json("timers", trace)["functions"]}
    assert timers == {"Embed": 3, "Decorated": 3, "Step": 4}


# -- finished recordings ---------------------------------------------------------------------


def test_hooks_on_a_finished_recording_never_raise(trace, capfd):
    rec = poolsight.record(trace)
    token = rec._native.enter(1, "Open", 1, "", 0)
    rec.finish()
    capfd.readouterr()
    with rec.scope("late"):
        with rec.function("late_fn"):
            pass
    rec.epoch_begin(1)
    rec.epoch_end(1)
    rec.cpu_sample()
    rec._native.exit(token)
    rec._native.mem(1, 100, 0x10, 0, 0)
    rec._native.freed(100, 0x10)
    assert rec.dropped_events >= 6
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is finished" in err[0], err
    with pytest.raises(poolsight.PoolsightError, match="finished"):
        rec.finish()
    # Making a new hook for it is wrong use, refused where it is made.
    with pytest.raises(poolsight.PoolsightError, match="finished"):
        _native.CupyHookSink(rec._native, False, 0, False)


def test_epochs_do_not_nest(trace):
    with poolsight.record(trace) as rec:
        with rec.epoch(1):
            with pytest.raises(poolsight.PoolsightError, match="epoch 1 is still open"):
                rec.epoch_begin(2)
            with pytest.raises(poolsight.PoolsightError, match="cannot end epoch 3"):
                rec.epoch_end(3)
        assert rec.open_epoch is None
    epochs = report_json("epochs", trace)["epochs"]
    assert [(e["fit"], e["epoch"], e["complete"]) for e in epochs] == [(0, 1, True)]


def test_epoch_cpu_figures_are_tracemallocs(trace):
    """fastai's PeakMemMetric columns: tracemalloc started at the epoch's begin, so a block
    from before the epoch freed during it lowers nothing (an RSS or live-bytes delta would
    read it as a shrink)."""
    import tracemalloc

    old = bytearray(8 << 20)
    with poolsight.record(trace) as rec:
        with rec.epoch(0):
            del old
            kept = bytearray(3 << 20)
            peak = bytearray(5 << 20)
            del peak
        assert not tracemalloc.is_tracing(), "stopped again, as it was not tracing before"
    del kept
    (row,) = report_json("epochs", trace)["epochs"]
    assert row["cpu_used_mb"] == 3 and row["cpu_used_bytes"] >= 3 << 20
    # Both blocks were live at once: 3 + 5 MB, as tracemalloc's peak counts them.
    assert row["cpu_peak_mb"] == 8, row
    info = report_json("info", trace)
    assert info["events"]["epoch_end"] == 1


# -- deep stacks -----------------------------------------------------------------------------


def test_a_100000_deep_stack_reports_from_python(trace):
    """A runaway recursion's scopes, 100,000 deep, reported in this process (the CLI runs
    in-process through poolsight.main, on threads with default stacks)."""
    with poolsight.record(trace) as rec:
        native = rec._native
        tokens = [native.enter(1, "Recurse", 1, "deep.py", i % 7) for i in range(100_000)]
        pool = poolsight.Pool(rec)
        pool.free(pool.malloc(4096))
        for t in reversed(tokens):
            native.exit(t)
    assert poolsight.main(["report", str(trace)]) == 0
    rows = report_json("functions", trace)["functions"]
    assert rows == [
        {
            "name": "Recurse",
            "used_bytes": 100_000 * 4096,
            "acquired_bytes": 100_000 * 4096,
            "occurrence": 100_000,
            "self_used_bytes": 4096,
            "self_acquired_bytes": 4096,
            "failed_used_bytes": 0,
            "failed_acquired_bytes": 0,
        }
    ]
    lines = run_cli("lines", trace).stdout.splitlines()
    assert len(lines) == 1 + 256 + 1 and "folded" in lines[-1]
