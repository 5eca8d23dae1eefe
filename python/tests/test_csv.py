"""Every CSV the CLI writes is one table that pandas loads as it is, per rank included."""

import io
from pathlib import Path

import pytest
from conftest import report_json, run_cli

pd = pytest.importorskip("pandas")

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "traces"
RANKS = [FIXTURES / "two_ranks-rank0.pstrace", FIXTURES / "two_ranks-rank1.pstrace"]

COMMANDS = [
    ["functions"],
    ["lines"],
    ["timers"],
    ["epochs"],
    ["info"],
    *(["report", "--table", t] for t in ("summary", "functions", "lines", "timers", "epochs")),
]


# info always has one row per trace, so it has no --per-rank.
CASES = [(c, p) for c in COMMANDS for p in (False, True) if not (p and c == ["info"])]


@pytest.mark.parametrize(
    "command, per_rank", CASES, ids=[f"{'-'.join(c)}{'-per-rank' if p else ''}" for c, p in CASES]
)
def test_csv_is_one_table(command, per_rank):
    args = [*command, "--format", "csv", *(["--per-rank"] if per_rank else []), *RANKS]
    text = run_cli(*args).stdout
    df = pd.read_csv(io.StringIO(text))
    header = text.splitlines()[0].split(",")
    assert list(df.columns) == header
    assert len(df) >= 1
    if per_rank and command[0] != "info":
        assert df.columns[0] == "trace"
        assert df["trace"].nunique() == 2


def test_functions_csv_has_the_json_rows():
    df = pd.read_csv(io.StringIO(run_cli("functions", "--format", "csv", *RANKS).stdout))
    rows = report_json("functions", RANKS[0], RANKS[1])["functions"]
    assert list(df["name"]) == [r["name"] for r in rows]
    assert list(df["used_bytes"]) == [r["used_bytes"] for r in rows]


def test_report_csv_without_a_table_says_how_to_choose():
    proc = run_cli("report", "--format", "csv", *RANKS, check=False)
    assert proc.returncode == 2
    assert "--table summary|peak|functions|lines|timers|epochs" in proc.stderr
