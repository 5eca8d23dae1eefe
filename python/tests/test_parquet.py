"""`poolsight export --format parquet`, queried with DuckDB: SQL over the dataset reproduces
`functions`, `epochs` and `info`'s peak for every rank, and every query of docs/queries.md
runs (on DuckDB, unchanged)."""

import json
from pathlib import Path

import pytest
from conftest import run_cli
from docs_queries import ROOT, connect, query, rows, sql_blocks

import poolsight

duckdb = pytest.importorskip("duckdb", reason="the Parquet dataset is queried with DuckDB")

FIXTURES = sorted((ROOT / "fixtures" / "traces").glob("*.pstrace"))
MB = 1 << 20
# Rank r of the test job allocates (r + 1) * UNIT three times an epoch: rank 3's peak (480 MB)
# is above every fixture's, so it is the week's highest.
UNIT = 40 * MB


def record_job(directory: Path, world: int, night: int) -> list:
    """A small training job of `world` ranks: an Attention.forward function whose allocations
    grow with the rank, inside two epochs; returns the trace paths."""
    paths = []
    for rank in range(world):
        path = directory / f"night{night}-rank{rank}.pstrace"
        with poolsight.record(path, rank=rank, world_size=world) as rec:
            pool = poolsight.Pool(rec, capacity=1 << 31)
            for epoch in (1, 2):
                with rec.epoch(epoch):
                    with rec.link("Transformer"):
                        with rec.function("MLP.forward"):
                            pool.free(pool.malloc(512 * 1024))
                        with rec.function("Attention.forward"):
                            kept = [pool.malloc((rank + 1) * UNIT + 1000 * epoch) for _ in range(3)]
                    for p in kept:
                        pool.free(p)
                    pool.free_all_blocks()
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dataset")
    traces = tmp_path_factory.mktemp("traces")
    job = record_job(traces, 4, 1) + record_job(traces, 4, 2)
    run_cli("export", "--format", "parquet", "--tables", "all", "-o", out, *FIXTURES, *job)
    return out


def per_rank(command: str, trace: Path) -> dict:
    return json.loads(run_cli(command, trace, "--format", "json").stdout)


def trace_of(con) -> dict:
    """(run, rank) -> the trace file it was exported from."""
    return {
        (r["run"], r["rank"]): Path(r["trace_path"])
        for r in rows(con, "SELECT run, rank, trace_path FROM runs")
    }


def test_sql_over_the_events_reproduces_info_peak_per_rank(dataset):
    con = connect(dataset)
    traces = trace_of(con)
    assert len(traces) == len(FIXTURES) + 8
    peaks = rows(con, query("Every rank's peak, from the events alone"))
    assert {(r["run"], r["rank"]) for r in peaks} <= set(traces)
    for r in peaks:
        info = per_rank("info", traces[(r["run"], r["rank"])])
        assert r["peak_used_bytes"] == info["pool"]["peak_used_bytes"], r
    for r in rows(con, "SELECT run, rank, peak_used_bytes FROM runs"):
        info = per_rank("info", traces[(r["run"], r["rank"])])
        assert r["peak_used_bytes"] == info["pool"]["peak_used_bytes"], r


def test_sql_over_the_events_reproduces_functions_per_rank(dataset):
    con = connect(dataset)
    got = {}
    for r in rows(con, query("Chainer's functions table per rank, from the events")):
        got.setdefault((r["run"], r["rank"]), {})[r["name"]] = (
            r["used_bytes"],
            r["acquired_bytes"],
            r["occurrence"],
        )
    for key, trace in trace_of(con).items():
        want = {
            f["name"]: (f["used_bytes"], f["acquired_bytes"], f["occurrence"])
            for f in per_rank("functions", trace)["functions"]
        }
        assert got.get(key, {}) == want, trace
        summary = rows(
            con,
            f"SELECT name, used_bytes, acquired_bytes, occurrence FROM functions "
            f"WHERE run = '{key[0]}' AND rank = {key[1]} ORDER BY row",
        )
        assert [r["name"] for r in summary] == [
            f["name"] for f in per_rank("functions", trace)["functions"]
        ]


def test_sql_over_the_events_reproduces_epochs_per_rank(dataset):
    con = connect(dataset)
    got = {}
    for r in rows(con, query("fastai's epoch columns per rank, from the events")):
        got.setdefault((r["run"], r["rank"]), []).append(
            (r["epoch"], r["gpu_used_mb"], r["gpu_peak_mb"])
        )
    seen = 0
    for key, trace in trace_of(con).items():
        want = [
            (e["epoch"], e["gpu_used_mb"], e["gpu_peak_mb"])
            for e in per_rank("epochs", trace)["epochs"]
        ]
        assert got.get(key, []) == want, trace
        seen += len(want)
    assert seen >= 8 * 2


def test_every_query_in_the_docs_runs_and_answers(dataset):
    con = connect(dataset)
    blocks = sql_blocks("sql")
    assert len(blocks) >= 6
    for sql in blocks:
        rows(con, sql)

    top = rows(con, query("Which rank peaked highest in the last week, and from which stack"))
    # Rank 3 of either night allocates the most; its peak comes from Attention.forward.
    assert {r["rank"] for r in top} == {3}, top
    assert [r["depth"] for r in top] == list(range(1, len(top) + 1))
    names = [r["name"] for r in top]
    assert "Attention.forward" in names and "Transformer" in names, top

    trend = rows(con, query("The memory of `Attention.forward` over the last 100 runs"))
    assert len(trend) == 2, "two nights, one run each"
    assert all(r["calls"] == 4 * 2 for r in trend), "4 ranks x 2 epochs"
    # 3 mallocs an epoch, rounded up to the pool's 512-byte unit
    assert all(r["used_bytes"] == 3 * (4 * UNIT + 1024) + 3 * (4 * UNIT + 2048) for r in trend)


def test_the_ranks_of_one_night_share_a_run_id(dataset):
    con = connect(dataset)
    runs = rows(
        con,
        "SELECT run, COUNT(*) AS ranks, MIN(world_size) AS world FROM runs "
        "WHERE world_size = 4 GROUP BY run ORDER BY run",
    )
    assert [(r["ranks"], r["world"]) for r in runs] == [(4, 4), (4, 4)]


def test_a_dataset_of_another_version_is_refused(tmp_path):
    (tmp_path / "_poolsight_dataset.json").write_text('{"schema_version": 2}')
    proc = run_cli("export", "--format", "parquet", "-o", tmp_path, FIXTURES[0], check=False)
    assert proc.returncode == 2
    assert "schema version 2" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_the_queries_give_the_same_answers_on_datafusion(dataset):
    pa = pytest.importorskip("pyarrow", reason="DataFusion's Python API takes pyarrow types")
    datafusion = pytest.importorskip("datafusion", reason="the optional second engine")
    ctx = datafusion.SessionContext()
    for table in ["runs", "events", "stacks", "functions", "epochs"]:
        ctx.register_parquet(
            table,
            f"{dataset}/{table}/",
            table_partition_cols=[("run", pa.string()), ("rank", pa.int32())],
        )
    con = connect(dataset)

    def answer(result: list) -> list:
        return sorted(tuple(str(v) for v in r.values()) for r in result)

    for sql in sql_blocks("sql"):
        assert answer(ctx.sql(sql).to_pylist()) == answer(rows(con, sql)), sql
