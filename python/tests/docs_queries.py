"""docs/queries.md as the tests read it: its code blocks by info string, the query under a
heading, and the DuckDB declarations run on a dataset (shared by test_parquet.py and
test_spark.py, so that every engine runs the same text)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
QUERIES = ROOT / "docs" / "queries.md"


def code_blocks(info: str) -> list:
    """The fenced blocks of docs/queries.md whose info string is exactly `info`."""
    text = QUERIES.read_text()
    return [m.group(1) for m in re.finditer(r"```" + info + r"\n(.*?)```", text, re.DOTALL)]


def sql_blocks(info: str = "sql") -> list:
    """The ```sql blocks (or those of another info string, e.g. "sql duckdb")."""
    return code_blocks(info)


def query(title: str) -> str:
    """The portable query under the heading `title` in docs/queries.md."""
    text = QUERIES.read_text()
    section = text.split("## " + title, 1)[1]
    return re.search(r"```sql\n(.*?)```", section, re.DOTALL).group(1)


def connect(dataset: Path):
    """A DuckDB connection with the tables declared as the docs declare them."""
    import duckdb

    con = duckdb.connect()
    (setup,) = sql_blocks("sql duckdb")
    for statement in setup.replace("DATASET", str(dataset)).split(";"):
        if statement.strip():
            con.execute(statement)
    return con


def rows(con, sql: str) -> list:
    """A DuckDB query's answer as dicts, column name to value."""
    cur = con.execute(sql)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def titled_sql_blocks() -> list:
    """(heading, query) for every ```sql block, under the `##` heading it follows."""
    found = []
    for section in QUERIES.read_text().split("\n## ")[1:]:
        title = section.split("\n", 1)[0].strip()
        found += [(title, sql) for sql in re.findall(r"```sql\n(.*?)```", section, re.DOTALL)]
    return found
