"""``poolsight.whatif()``: the same replays as ``poolsight whatif --format json``, from Python,
and wrong arguments raising where they are given."""

from pathlib import Path

import pytest
from conftest import report_json

import poolsight

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "pytorch"
OOM = FIXTURES / "whatif_oom.pickle"
MIB = 1 << 20


def test_whatif_returns_what_the_command_prints():
    got = poolsight.whatif(OOM, settings="expandable_segments:True", min_capacity=True)
    cli = report_json("whatif", OOM, "--setting", "expandable_segments:True", "--min-capacity")
    assert got == cli
    recorded, expandable = got["runs"]
    assert (recorded["fits"], recorded["min_capacity_bytes"]) == (False, 80 * MIB)
    assert (expandable["fits"], expandable["min_capacity_bytes"]) == (True, 60 * MIB)


def test_capacity_allocator_and_check():
    fits = poolsight.whatif(OOM, capacity="80MiB")
    assert fits["capacity_bytes"] == 80 * MIB and fits["runs"][0]["fits"]
    assert poolsight.whatif(OOM, capacity=70 * MIB)["runs"][0]["fits"] is False
    cupy = poolsight.whatif(str(OOM), allocator="cupy")
    assert cupy["allocator"] == "cupy" and [r["label"] for r in cupy["runs"]] == ["cupy"]
    (check,) = poolsight.whatif(OOM, check=True)["checks"]
    assert check["exact"] and check["block_offsets_matching"] == 6
    two = poolsight.whatif(OOM, FIXTURES / "whatif_settings.pickle")
    assert isinstance(two, list) and [r["trace"] for r in two] == [
        str(OOM),
        str(FIXTURES / "whatif_settings.pickle"),
    ]


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"settings": "bogus:1"}, ValueError),
        ({"settings": ["max_split_size_mb:5"]}, ValueError),
        ({"settings": [3]}, TypeError),
        ({"capacity": "12XB"}, ValueError),
        ({"capacity": 0}, ValueError),
        ({"capacity": 1.5}, TypeError),
        ({"allocator": "tensorflow"}, ValueError),
        ({"frames": "some"}, ValueError),
        ({"allocator": "cupy", "settings": "expandable_segments:True"}, poolsight.PoolsightError),
    ],
)
def test_wrong_arguments_raise(kwargs, error):
    with pytest.raises(error):
        poolsight.whatif(OOM, **kwargs)


def test_files_that_cannot_be_read_raise(tmp_path):
    with pytest.raises(TypeError):
        poolsight.whatif()
    with pytest.raises(poolsight.PoolsightError, match="no-such"):
        poolsight.whatif(tmp_path / "no-such.pickle")
    cut = tmp_path / "cut.pickle"
    cut.write_bytes(OOM.read_bytes()[:100])
    with pytest.raises(poolsight.PoolsightError):
        poolsight.whatif(cut)
