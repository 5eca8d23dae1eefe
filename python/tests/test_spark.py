"""Every query of docs/queries.md on Apache Spark (local mode), over a 64-rank Parquet dataset
exported by `poolsight export --format parquet`, with the tables declared by the docs' own
Spark snippet: each answer must equal DuckDB's on the same dataset.

Skipped, with the reason printed, when pyspark or a Java runtime (17 or later, as Spark 4
needs) is missing: scripts/test.sh installs both."""

import datetime
import os
import re
import shutil
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
from conftest import run_cli, skip_without
from docs_queries import code_blocks, connect, query, rows, sql_blocks, titled_sql_blocks

import poolsight

pytest.importorskip("duckdb", reason="Spark's answers are checked against DuckDB's")

SPARK_JAVA = 17


def java_problem():
    """Why Spark cannot start here (no Java, or one too old), else None. Spark runs
    $JAVA_HOME/bin/java when JAVA_HOME is set, else the `java` on PATH."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not os.access(java, os.X_OK):
        return "no Java runtime (Debian: apt-get install openjdk-17-jre-headless)"
    try:
        proc = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        return f"{java} -version failed: {e}"
    found = re.search(r'version "(\d+)(?:\.(\d+))?', proc.stderr + proc.stdout)
    if not found:
        return f"{java} -version did not say its version"
    major = int(found.group(1))
    if major == 1:  # "1.8.0_392" is Java 8
        major = int(found.group(2) or 0)
    if major < SPARK_JAVA:
        return f"{java} is Java {major}; Spark 4 needs Java {SPARK_JAVA} or later"
    return None


def skip_without_java():
    problem = java_problem()
    if problem:
        print(f"skipped: {problem}", file=sys.stderr)
        return pytest.mark.skip(reason=problem)
    return pytest.mark.usefixtures()  # as skip_without: no mark to add


pytestmark = [
    mark
    for mark in (
        skip_without("pyspark", "Apache Spark runs docs/queries.md; pip install pyspark"),
        skip_without_java(),
    )
    if mark.name == "skip"
] + [
    # PySpark 4.x warns on import that it does not yet fully support pandas 3; no pandas here.
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas"),
]

KB = 1 << 10
WORLD = 64
DROPPING = 50  # its trace reaches max_bytes: the recorder drops the rest and counts them
KILLED = 62  # exported from a copy taken inside its second epoch: as a killed rank leaves it
SMALL = 13  # a pool of 6 MB: some of its mallocs fail (out_of_memory, ptr 0)
NESTING = 5  # ranks r % 8 == NESTING call Attention.forward inside itself
# The query the docs' snippet ends with, in place of its placeholder "SELECT ...".
PROBE = "SELECT run, COUNT(*) AS ranks FROM runs GROUP BY run"


def record_rank(path: Path, rank: int, attempt: int) -> Path:
    """One rank of a training job whose figures vary with the rank: 1-3 epochs, 1-4 attention
    layers keeping 2-3 blocks each, block sizes from 128 KB to 2 MB. Returns the trace to
    export (for KILLED, a copy of its file taken mid-epoch)."""
    exported = path
    options = {"max_bytes": 10_000, "chunk_size": 4096} if rank == DROPPING else {}
    if rank == KILLED:
        options["max_bytes"] = 1 << 20  # room for all its events; a 1 MiB live file to copy
    if rank % 16 == 7:
        options["stacks"] = "python"
    with poolsight.record(path, rank=rank, world_size=WORLD, cpu=None, **options) as rec:
        pool = poolsight.Pool(rec, capacity=(6 << 20) if rank == SMALL else 1 << 30)
        block = 128 * KB * (1 + (rank * 7 + attempt) % 16)
        for epoch in range(1, 2 + rank % 3):
            with rec.epoch(epoch):
                kept = []
                with rec.link("Transformer"):
                    with rec.function("Embedding.forward"):
                        pool.free(pool.malloc((rank % 5 + 1) * 300 * KB))
                    for layer in range(1 + rank % 4):
                        with rec.function("Attention.forward"):
                            for _ in range(2 + rank % 2):
                                try:
                                    kept.append(pool.malloc(block + 512 * layer + 100 * epoch))
                                except poolsight.PoolsightError:
                                    pass  # SMALL's pool is full
                            if rank % 8 == NESTING:
                                with rec.function("Attention.forward"):
                                    pool.free(pool.malloc(64 * KB * (layer + 1)))
                        with rec.scope("optimizer"):
                            done = 1 + epoch % 2
                            for p in kept[:done]:
                                pool.free(p)
                            del kept[:done]
                if rank == KILLED and epoch == 2:
                    exported = path.with_name(path.stem + "-killed.pstrace")
                    shutil.copyfile(path, exported)
                for p in kept:
                    pool.free(p)
                if epoch % 2 == 0 or rank % 4 == 0:
                    pool.free_all_blocks()
    return exported


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """Two runs of a 64-rank job (an earlier attempt in which only ranks 0 and 1 started, then
    all 64 ranks), exported with every table."""
    traces = tmp_path_factory.mktemp("traces")
    earlier = [record_rank(traces / f"attempt1-rank{r:02}.pstrace", r, 1) for r in (0, 1)]
    job = [record_rank(traces / f"attempt2-rank{r:02}.pstrace", r, 2) for r in range(WORLD)]
    out = tmp_path_factory.mktemp("dataset")
    run_cli(
        "export",
        "--format",
        "parquet",
        "--tables",
        "all",
        "--allow-incomplete",  # DROPPING lost events and KILLED never finished: rows all the same
        "-o",
        out,
        *earlier,
        *job,
    )
    return out


@pytest.fixture(scope="module")
def spark():
    """One local Spark for the module, kept small and quiet."""
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("poolsight-test_spark")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.memory", "1g")
        # A short job: the client compiler only and the serial collector start and run it
        # about twice as fast as the JVM's defaults.
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        # List the dataset's partition directories in the driver, not with a Spark job.
        .config("spark.sql.sources.parallelPartitionDiscovery.threshold", "100000")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def tables(spark, dataset):
    """The tables, declared by running the docs' Spark snippet as written (DATASET and the
    "SELECT ..." placeholder substituted)."""
    (snippet,) = code_blocks("python spark")
    assert '"SELECT ..."' in snippet and "DATASET" in snippet
    code = snippet.replace("DATASET", str(dataset)).replace('"SELECT ..."', repr(PROBE))
    namespace = {}
    exec(compile(code, "docs/queries.md (the Spark snippet)", "exec"), namespace)
    assert namespace["spark"] is spark, "the snippet's getOrCreate() is the module's session"
    return spark


def plain(value):
    """One engine's value as the other gives it: Spark's decimals as ints when whole, every
    timestamp as an aware UTC datetime (Spark's are naive local times, DuckDB's aware)."""
    if isinstance(value, Decimal) and value == value.to_integral_value():
        return int(value)
    if isinstance(value, datetime.datetime):
        return value.astimezone(datetime.timezone.utc)
    return value


def ordered(sql: str) -> bool:
    """Whether the query's result is ordered: an ORDER BY after its last parenthesis."""
    return re.search(r"\bORDER BY\b[^()]*\Z", sql.strip()) is not None


def answer(names: list, values: list, sql: str) -> tuple:
    """Column names and rows, each value with its Python type (so that True is not 1)."""
    got = [tuple((type(v).__name__, v) for v in map(plain, row)) for row in values]
    return list(names), got if ordered(sql) else sorted(got, key=repr)


def spark_answer(spark, sql: str) -> tuple:
    df = spark.sql(sql)
    return answer(df.columns, df.collect(), sql)


def duckdb_answer(con, sql: str) -> tuple:
    cur = con.execute(sql)
    return answer([d[0] for d in cur.description], cur.fetchall(), sql)


QUERY_IDS = [title for title, _ in titled_sql_blocks()]


def test_the_docs_spark_snippet_declares_every_table(tables):
    assert len(sql_blocks("sql")) == len(QUERY_IDS) >= 6
    counted = {r.run: r.ranks for r in tables.sql(PROBE).collect()}
    assert sorted(counted.values()) == [2, WORLD], counted
    for table in ["runs", "events", "stacks", "functions", "epochs"]:
        df = tables.table(table)
        assert dict(df.dtypes)["rank"] == "int" and dict(df.dtypes)["run"] == "string"


@pytest.mark.parametrize(("title", "sql"), titled_sql_blocks(), ids=QUERY_IDS)
def test_spark_answers_each_query_as_duckdb_does(tables, dataset, title, sql):
    want = duckdb_answer(connect(dataset), sql)
    assert want[1], f"{title}: no rows on the test dataset, nothing is compared"
    got = spark_answer(tables, sql)
    assert got[0] == want[0], title
    assert len(got[1]) == len(want[1]), title
    for i, (g, w) in enumerate(zip(got[1], want[1])):
        assert g == w, f"{title}: row {i}"


def test_the_dataset_makes_the_answers_telling(dataset):
    """What the comparisons cover (on DuckDB: Spark is held to the same answers above)."""
    con = connect(dataset)
    job = {r["run"] for r in rows(con, f"SELECT DISTINCT run FROM runs WHERE world_size = {WORLD}")}
    assert len(job) == 2
    lost = rows(con, query("Runs that did not finish, or lost events"))
    assert {(r["rank"], r["finished"], r["dropped_events"] > 0) for r in lost} == {
        (KILLED, False, False),
        (DROPPING, True, True),
    }, lost
    assert [r["rank"] for r in rows(con, "SELECT rank FROM runs WHERE out_of_memory > 0")] == [
        SMALL
    ]
    trend = rows(con, query("The memory of `Attention.forward` over the last 100 runs"))
    assert len(trend) == 2 and trend[0]["used_bytes"] != trend[1]["used_bytes"], trend
    peaks = rows(con, query("Every rank's peak, from the events alone"))
    assert len({r["peak_used_bytes"] for r in peaks if r["run"] in job}) > 16, peaks
    epochs = rows(con, query("fastai's epoch columns per rank, from the events"))
    assert any(r["gpu_used_mb"] is None for r in epochs), "KILLED's open epoch"
    assert any(r["gpu_used_mb"] for r in epochs) and any(r["gpu_peak_mb"] for r in epochs)
    top = rows(con, query("Which rank peaked highest in the last week, and from which stack"))
    assert [r["depth"] for r in top] == list(range(1, len(top) + 1)), top
    assert "Attention.forward" in [r["name"] for r in top], top
