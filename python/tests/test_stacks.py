"""Allocation stacks at two levels: open scopes (cheap) and Python frames, as CuPy's LineProfileHook
shows them (outermost first, file:line:function, max_depth): a pool's trace reads as recorded."""

from conftest import report_json, run_cli

import poolsight

ALLOC_LINE = 12  # the line of the malloc in allocate_here, checked below


def allocate_here(pool, size):
    return pool.malloc(size)


def call_twice(pool):
    a = allocate_here(pool, 1000)
    b = allocate_here(pool, 2000)
    pool.free(a)
    pool.free(b)


def paths(node, prefix=()):
    """Every root-to-node path of the lines JSON tree, as tuples of (function, line)."""
    out = []
    for child in node.get("children", []):
        here = (*prefix, (child["function"], child["line"], child["file"]))
        out.append(here)
        out.extend(paths(child, here))
    return out


def test_python_stacks_name_the_allocating_line(trace):
    with open(__file__) as f:
        assert "pool.malloc(size)" in f.read().splitlines()[ALLOC_LINE - 1]
    with poolsight.record(trace, stacks="python") as rec:
        pool = poolsight.Pool(rec)
        call_twice(pool)
    root = report_json("lines", trace)["root"]
    assert root["used_bytes"] == 1024 + 2048
    leaves = [p for p in paths(root) if p[-1][0] == "allocate_here"]
    assert leaves, "allocate_here is in the tree"
    leaf = leaves[0]
    assert leaf[-1][1] == ALLOC_LINE
    assert leaf[-1][2] == __file__
    assert leaf[-2][0] == "call_twice", "its caller is the frame above it"
    assert leaf[-3][0] == "test_python_stacks_name_the_allocating_line"
    # One node per calling context: call_twice calls allocate_here from two lines.
    assert len(leaves) == 2
    assert leaves[0][:-2] == leaves[1][:-2]
    assert leaves[0][-2][1] + 1 == leaves[1][-2][1]
    # poolsight's own Python frames are left out, as CuPy leaves out its hook's frames.
    assert not any("poolsight" in f[2] and "site-packages" in f[2] for p in paths(root) for f in p)
    text = run_cli("lines", trace).stdout
    assert f"{__file__}:{ALLOC_LINE}:allocate_here (1.00KB, 1.00KB)" in text
    assert f"{__file__}:{ALLOC_LINE}:allocate_here (2.00KB, 2.00KB)" in text
    # The user's frames when asked: pytest's are left out, the path is this file's name.
    user = run_cli("lines", trace, "--frames", "user").stdout
    assert f"test_stacks.py:{ALLOC_LINE}:allocate_here (1.00KB, 1.00KB)" in user
    assert "_pytest" not in user and "pluggy" not in user


def test_max_depth_keeps_the_outermost_frames_as_cupy_does(trace, tmp_path):
    with poolsight.record(trace, stacks="python") as rec:
        call_twice(poolsight.Pool(rec))
    # max_depth keeps the outermost frames (pytest's here), as CuPy's hook does.
    full = paths(report_json("lines", trace)["root"])
    deepest = max(full, key=len)

    cut = tmp_path / "cut.pstrace"
    with poolsight.record(cut, stacks="python", max_depth=3) as rec:
        call_twice(poolsight.Pool(rec))
    kept = paths(report_json("lines", cut)["root"])
    # max_depth = 3 keeps 2 levels under _root: the two outermost frames of the full stack.
    assert max(len(p) for p in kept) == 2
    assert [f[0] for f in max(kept, key=len)] == [f[0] for f in deepest[:2]]


def test_scopes_stacks_are_the_open_scopes(trace):
    with poolsight.record(trace, stacks="scopes") as rec:
        pool = poolsight.Pool(rec)
        with rec.link("Net"):
            with rec.function("Conv", "forward"):
                pool.free(pool.malloc(4096))
    root = report_json("lines", trace)["root"]
    names = [f[0] for f in max(paths(root), key=len)]
    assert names == ["Net", "Conv"]


def test_python_frames_hang_under_the_open_scopes(trace):
    with poolsight.record(trace, stacks="python") as rec:
        pool = poolsight.Pool(rec)
        with rec.function("Outer"):
            call_twice(pool)
    rows = {r["name"]: r for r in report_json("functions", trace)["functions"]}
    assert rows["Outer"]["used_bytes"] == 1024 + 2048
