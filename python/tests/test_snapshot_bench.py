"""scripts/snapshot_bench.py writes its large snapshots entry by entry: the file must read, with
Python's own pickle, as the value the small path builds in memory (so the benchmark's 1 GB
snapshot is the layout its docs describe)."""

import importlib.util
import pickle
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "snapshot_bench.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("snapshot_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# 1,500 and 2,500 entries: more than one batch of 1,000, and memo indices past 255.
@pytest.mark.parametrize("entries", [1, 2, 1500, 2500])
def test_the_streamed_snapshot_is_the_pickled_one(bench, tmp_path, entries):
    path = tmp_path / "s.pickle"
    bench.write_snapshot(str(path), entries, 6, 9)
    with open(path, "rb") as f:
        got = pickle.load(f)
    want = bench.make_snapshot(entries, 6, 9)
    assert got == want
    # A free is two entries (requested, completed), so the last may pass the count by one.
    assert entries <= len(got["device_traces"][0]) <= entries + 1
    # What pickle.dump writes, less its FRAME opcodes (9 bytes per 64 KiB).
    size, dumped = path.stat().st_size, len(pickle.dumps(want, 4))
    assert 0 <= dumped - size <= 9 + 9 * (dumped // 65_536), (size, dumped)
