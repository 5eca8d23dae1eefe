"""Recording from Python: scopes, epochs, the pool, the CLI on what was recorded, bad input."""

import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest
from conftest import report_json, run_cli

import poolsight


def test_scopes_and_pool_allocations_make_the_functions_table(trace):
    with poolsight.record(trace) as rec:
        pool = poolsight.Pool(rec)
        with rec.link("MLP"):
            with rec.function("LinearFunction", "forward"):
                a = pool.malloc(1000)  # 1024 bytes in the pool's 512-byte unit
                b = pool.malloc(3000)  # 3072
                pool.free(a)
                pool.free(b)
            with rec.function("ReLU", "forward"):
                pool.free(pool.malloc(100))  # 512, served from the cache
    assert rec.closed
    rows = {r["name"]: r for r in report_json("functions", trace)["functions"]}
    assert rows["LinearFunction"]["used_bytes"] == 1024 + 3072
    assert rows["LinearFunction"]["occurrence"] == 1
    assert rows["ReLU"]["used_bytes"] == 512
    assert rows["ReLU"]["acquired_bytes"] == 0, "the ReLU malloc was a cache hit"
    links = report_json("timers", trace)["links"]
    assert [link["name"] for link in links] == ["MLP"]


def test_a_decorated_function_is_one_scope_per_call(trace):
    with poolsight.record(trace) as rec:
        pool = poolsight.Pool(rec)

        @rec.function("Step", phase="backward")
        def step(n):
            pool.free(pool.malloc(n))
            return n

        assert [step(512), step(1024), step(2048)] == [512, 1024, 2048]
        assert step.__name__ == "step", "functools.wraps keeps the name"
    rows = report_json("functions", trace)["functions"]
    assert [(r["name"], r["used_bytes"], r["occurrence"]) for r in rows] == [
        ("Step", 512 + 1024 + 2048, 3)
    ]
    assert rows[0]["self_used_bytes"] == rows[0]["used_bytes"]
    assert rows[0]["failed_used_bytes"] == 0


def test_epochs_give_one_row_each(trace):
    with poolsight.record(trace) as rec:
        pool = poolsight.Pool(rec)
        kept = []
        for epoch in (1, 2):
            with rec.epoch(epoch):
                kept.append(pool.malloc(3 << 20))
    epochs = report_json("epochs", trace)["epochs"]
    assert [e["epoch"] for e in epochs] == [1, 2]
    assert epochs[0]["gpu_used_mb"] == 3
    assert all(e["cpu_used_bytes"] >= 0 for e in epochs)


def test_info_says_the_run_finished_and_counts_no_drops(trace):
    with poolsight.record(trace, rank=3, world_size=4) as rec:
        with rec.scope("step"):
            pass
    summary = rec._native.closed
    assert summary is True
    info = report_json("info", trace)
    assert info["finished"] is True
    assert info["dropped_events"] == 0
    assert info["rank"] == 3


def test_ring_mode_records_too(trace):
    with poolsight.record(trace, mode="ring", ring_slots=4, chunk_size=4096) as rec:
        pool = poolsight.Pool(rec)
        for _ in range(2000):
            pool.free(pool.malloc(1000))
    info = report_json("info", trace)
    assert info["finished"] is True
    # Only the newest chunks survive the ring, but what survived reads back.
    assert 0 < info["events"].get("malloc_post", 0) < 2000


def test_scopes_nest_per_thread():
    import threading

    errors = []

    def worker(rec, name):
        try:
            with rec.scope(name):
                with rec.function(f"{name}-fn"):
                    pass
        except Exception as e:  # noqa: BLE001 - collected for the assertion below
            errors.append(e)

    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "threads.pstrace")
        with poolsight.record(path) as rec:
            threads = [threading.Thread(target=worker, args=(rec, f"t{i}")) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        assert errors == []
        names = {r["name"] for r in report_json("functions", path)["functions"]}
        assert names == {f"t{i}-fn" for i in range(4)}


# -- bad input: one clear exception, never a crash -------------------------------------------


def test_a_path_that_cannot_be_created_raises_at_record(tmp_path):
    missing = tmp_path / "no-such-dir" / "run.pstrace"
    with pytest.raises(poolsight.PoolsightError, match="no-such-dir"):
        poolsight.record(missing)


def test_a_non_writable_path_raises_at_record(tmp_path):
    if os.geteuid() == 0:
        target = "/proc/version"  # not writable even for root
    else:
        d = tmp_path / "ro"
        d.mkdir()
        d.chmod(0o500)
        target = d / "run.pstrace"
    with pytest.raises(poolsight.PoolsightError):
        poolsight.record(target)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"mode": "circular"}, "mode must be"),
        ({"stacks": "native"}, "stacks must be"),
        ({"cpu": "vms"}, "cpu must be"),
        ({"max_depth": -1}, "max_depth"),
        ({"pack_level": 0}, "zstd level"),
        ({"pack_level": True}, "zstd level"),
    ],
)
def test_wrong_arguments_raise_value_errors(trace, kwargs, message):
    with pytest.raises(ValueError, match=message):
        poolsight.record(trace, **kwargs)


def test_a_finished_recording_refuses_a_second_finish(trace):
    """Later events are dropped and counted, never raised (test_drills.py); finishing twice is
    wrong use, refused where it happens."""
    rec = poolsight.record(trace)
    rec.finish()
    with pytest.raises(poolsight.PoolsightError, match="finished"):
        rec.finish()


def test_wrong_phase_and_epoch_numbers(trace):
    with poolsight.record(trace) as rec:
        with pytest.raises(ValueError, match="phase"):
            rec.function("f", phase="sideways")
        with pytest.raises(ValueError, match="epoch"):
            rec.epoch_begin(-1)
        with pytest.raises(ValueError, match="epoch"):
            rec.epoch_begin(1.5)


def test_pool_errors_are_exceptions(trace):
    with poolsight.record(trace) as rec:
        pool = poolsight.Pool(rec, capacity=1 << 20)
        with pytest.raises(poolsight.PoolsightError, match="out of memory"):
            pool.malloc(2 << 20)
        p = pool.malloc(1000)
        pool.free(p)
        with pytest.raises(poolsight.PoolsightError, match="not an allocation"):
            pool.free(p)
        with pytest.raises(ValueError, match="device"):
            poolsight.Pool(rec, device="tpu:0")
        with pytest.raises(TypeError):
            poolsight.Pool("not a recording")
        with pytest.raises(OverflowError):
            pool.malloc(-1)
    # The failed request is in the trace, as an out-of-memory event.
    info = report_json("info", trace)
    assert info["events"].get("out_of_memory", 0) == 1


def test_cuda_pool_without_cuda_is_a_clear_error(trace):
    with poolsight.record(trace) as rec:
        try:
            pool = poolsight.Pool(rec, device="cuda:0")
        except poolsight.PoolsightError as e:
            assert "cuda" in str(e).lower()
        else:  # a machine with a GPU
            pool.free(pool.malloc(1 << 20))


# -- crash safety ------------------------------------------------------------------------------


def test_a_killed_process_leaves_a_readable_trace(trace):
    script = textwrap.dedent(
        f"""
        import os, signal, poolsight
        rec = poolsight.record({str(trace)!r})
        pool = poolsight.Pool(rec)
        with rec.function("BeforeTheKill"):
            for _ in range(100):
                pool.free(pool.malloc(4096))
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL
    info = report_json("info", trace)
    assert info["finished"] is False
    assert info["events"].get("malloc_post", 0) == 100
    rows = report_json("functions", trace)["functions"]
    assert rows[0]["name"] == "BeforeTheKill"
    assert rows[0]["used_bytes"] == 100 * 4096


# -- the CLI the wheel installs -------------------------------------------------------------------


def test_the_cli_is_installed_and_exits_2_on_bad_usage(trace):
    assert "report" in run_cli("--help").stdout
    bad = run_cli("report", "--no-such-flag", trace, check=False)
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0, "one line on stderr"
    missing = run_cli("report", trace, check=False)
    assert missing.returncode == 2


def test_main_runs_the_cli_in_process(trace, capfd):
    with poolsight.record(trace) as rec:
        with rec.scope("step"):
            pass
    assert poolsight.main(["info", str(trace)]) == 0
    assert "finished" in capfd.readouterr().out


def test_one_scope_object_serves_several_threads_at_once(trace):
    import threading

    errors = []
    with poolsight.record(trace) as rec:
        shared = rec.function("Shared")
        barrier = threading.Barrier(4)

        def worker():
            try:
                for _ in range(50):
                    with shared:
                        barrier.wait(timeout=10)  # all four inside the same object at once
            except Exception as e:  # noqa: BLE001 - collected for the assertion below
                errors.append(e)

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    rows = report_json("functions", trace)["functions"]
    assert [(r["name"], r["occurrence"]) for r in rows] == [("Shared", 200)]


def _steps(rec, n=200):
    pool = poolsight.Pool(rec)
    for _ in range(n):
        with rec.scope("step"), rec.function("LinearFunction", "forward"):
            pool.free(pool.malloc(4096))
            pool.free(pool.malloc(1000))


def test_pack_at_finish_writes_a_copy_that_reports_the_same(trace):
    with poolsight.record(trace, pack=True) as rec:
        _steps(rec)
    packed = trace.with_name("run.packed.pstrace")
    assert packed.exists() and trace.exists(), "the live file is kept beside its packed copy"
    assert packed.stat().st_size * 3 < trace.stat().st_size
    for command in ("functions", "timers", "lines"):
        assert run_cli(command, packed).stdout == run_cli(command, trace).stdout
    assert report_json("info", packed)["format_version"].endswith(" packed")
    assert not report_json("info", trace)["format_version"].endswith(" packed")
    # Without a pack_level, the level of `poolsight pack`: the same bytes.
    cli = trace.with_name("cli.pstrace")
    run_cli("pack", trace, "-o", cli)
    assert packed.read_bytes() == cli.read_bytes()


def test_finish_pack_argument_and_the_result(trace, tmp_path):
    rec = poolsight.record(trace)
    _steps(rec, 20)
    out = tmp_path / "elsewhere.pstrace"
    result = rec.finish(pack=out)
    assert result["packed_path"] == str(out)
    assert result["packed_bytes"] == out.stat().st_size
    assert result["packed_warnings"] == []
    assert result["file_bytes"] == trace.stat().st_size
    # pack=False at finish overrides record's pack.
    other = tmp_path / "b.pstrace"
    rec = poolsight.record(other, pack=True)
    assert "packed_path" not in rec.finish(pack=False)
    assert not (tmp_path / "b.packed.pstrace").exists()


def test_packing_that_fails_leaves_the_live_file_sealed(trace, tmp_path):
    rec = poolsight.record(trace, pack=tmp_path / "no" / "such" / "dir.pstrace")
    _steps(rec, 5)
    with pytest.raises(poolsight.PoolsightError, match="finished and complete"):
        rec.finish()
    assert rec.closed
    assert report_json("functions", trace)["functions"][0]["occurrence"] == 5


def test_pack_function_and_its_bad_arguments(trace, tmp_path):
    with poolsight.record(trace) as rec:
        _steps(rec, 10)
    out = tmp_path / "p.pstrace"
    s = poolsight.pack(trace, out, level=19)
    assert s["events"] > 0 and s["bytes_out"] == out.stat().st_size
    assert s["bytes_in"] == trace.stat().st_size and s["warnings"] == []
    # Without a level, the CLI's: the same bytes as `poolsight pack`.
    mine, cli = tmp_path / "mine.pstrace", tmp_path / "cli.pstrace"
    poolsight.pack(trace, mine)
    run_cli("pack", trace, "-o", cli)
    assert mine.read_bytes() == cli.read_bytes()
    for bad in (23, True):
        with pytest.raises(ValueError, match="zstd level"):
            poolsight.pack(trace, out, level=bad)
    with pytest.raises(TypeError, match="'output'"):
        poolsight.pack(trace, 3)
    with pytest.raises(TypeError, match="pack is a path"):
        poolsight.record(trace, pack=1.5)
    with pytest.raises(poolsight.PoolsightError, match="the trace being packed"):
        poolsight.pack(trace, trace)
    not_a_trace = tmp_path / "x.pstrace"
    not_a_trace.write_bytes(b"hello" * 100)
    with pytest.raises(poolsight.PoolsightError):
        poolsight.pack(not_a_trace, tmp_path / "y.pstrace")


def test_each_pool_records_into_its_own_recording_only(tmp_path):
    a, b = tmp_path / "a.pstrace", tmp_path / "b.pstrace"
    with poolsight.record(a) as rec_a, poolsight.record(b) as rec_b:
        pool_a, pool_b, unbound = poolsight.Pool(rec_a), poolsight.Pool(rec_b), poolsight.Pool()
        for _ in range(3):
            pool_a.free(pool_a.malloc(1000))
        for _ in range(5):
            pool_b.free(pool_b.malloc(1000))
        for _ in range(7):
            unbound.free(unbound.malloc(1000))
    assert report_json("info", a)["events"]["malloc_post"] == 3
    assert report_json("info", b)["events"]["malloc_post"] == 5


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RSS is read from /proc")
def test_an_rss_sample_raises_the_epochs_cpu_peak(trace):
    big = 256 << 20
    with poolsight.record(trace, cpu="rss") as rec:
        with rec.epoch(0):
            held = b"x" * big  # written, so resident
            rec.cpu_sample()
            del held  # a large block goes back to the OS at once
        with rec.epoch(1):
            pass
    rows = report_json("epochs", trace)["epochs"]
    assert rows[0]["cpu_peak_bytes"] >= big * 3 // 4, rows[0]
    assert rows[0]["cpu_used_bytes"] < big // 4, rows[0]
    assert rows[1]["cpu_peak_bytes"] < big // 4, "the peak starts again at each epoch"


def test_a_block_that_raises_is_finished_unpacked_and_its_error_kept(trace, tmp_path):
    with pytest.raises(RuntimeError, match="boom"):
        with poolsight.record(trace, pack=tmp_path / "no" / "such" / "x.pstrace") as rec:
            _steps(rec, 3)
            raise RuntimeError("boom")
    assert rec.closed
    assert report_json("info", trace)["finished"] is True


def test_packing_finds_the_trace_after_a_change_of_directory(tmp_path, monkeypatch):
    (tmp_path / "run").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "run")
    rec = poolsight.record("t.pstrace", pack=True)
    _steps(rec, 3)
    monkeypatch.chdir(tmp_path / "elsewhere")
    result = rec.finish()
    assert result["packed_path"] == str(tmp_path / "run" / "t.packed.pstrace")
    assert (tmp_path / "run" / "t.packed.pstrace").exists()


def test_a_cpu_peak_without_the_current_figure_is_refused(trace):
    with poolsight.record(trace) as rec:
        with pytest.raises(ValueError, match="cpu_peak needs cpu_bytes"):
            rec._native.epoch_end(0, cpu_peak=5)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc and RLIMIT_AS")
def test_recordings_start_where_little_address_space_is_left(tmp_path):
    # Under `ulimit -v` (here: what the process uses plus 8 GiB) a trace cannot be mapped at its
    # 1 TiB size limit: each recording maps a share of what is left instead, says so once, and
    # records; twenty finished ones kept referenced all start.
    script = textwrap.dedent(
        f"""
        import resource
        with open("/proc/self/status") as f:
            used = next(int(l.split()[1]) for l in f if l.startswith("VmSize:")) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (used + (8 << 30), resource.RLIM_INFINITY))
        import poolsight
        kept = []
        for i in range(20):
            rec = poolsight.record({str(tmp_path)!r} + f"/{{i}}.pstrace", cpu=None)
            with rec.function("step"):
                poolsight.Pool(rec).malloc(1000)
            rec.finish()
            kept.append(rec)
        print("kept", len(kept))
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert proc.returncode == 0, err
    assert "kept 20" in out
    said = [line for line in err.splitlines() if "little address space left" in line]
    assert len(said) == 20, err
    assert "not at its size limit of 1 TiB" in said[0]
    # A finished recording gives back all but its file's pages: the next one gets the same
    # share as the first (before, each share was an eighth of what the last ones left).
    shares = {re.search(r"mapped at ([\d.]+ [MGT]iB)", line).group(1) for line in said}
    assert len(shares) == 1, said
    for i in (0, 19):
        functions = report_json("functions", tmp_path / f"{i}.pstrace")
        assert [f["name"] for f in functions["functions"]] == ["step"], functions
