"""``--frames`` on poolsight's own traces recorded with Python stacks: a script started through
a launcher (``python -m``, whose runpy frames are under the user's) reads from the user's first
line, PyTorch's module-call plumbing is dropped, the scopes poolsight records (modules,
operators) and the categories are kept; ``--frames all`` shows every frame as recorded. The user's
frames are the default of a trace that observes PyTorch's allocator (``track()``); a pool's trace
reads as recorded by default (CuPy's ``LineProfileHook`` tree) and asks for them with
``--frames user``."""

import json
import subprocess
import sys
import textwrap

import pytest
from conftest import report_json, run_cli

LAUNCH = """
    import sys

    import poolsight
    from net import allocate


    def main(path):
        with poolsight.record(path, stacks="python") as rec:
            pool = poolsight.Pool(rec)
            for _ in range(2):
                allocate(pool)


    if __name__ == "__main__":
        main(sys.argv[1])
"""

NET = """
    def allocate(pool):
        a = pool.malloc(1 << 20)
        b = pool.malloc(1 << 21)
        pool.free(a)
        pool.free(b)
"""

TRAIN = """
    import sys

    import torch

    import poolsight
    import poolsight.torch as pst
    from model import Net


    def main(path):
        torch.manual_seed(0)
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(32, 16)
        with poolsight.record(path, stacks="python"):
            with pst.track(model, opt), pst.hook(model):
                for _ in range(2):
                    opt.zero_grad()
                    model(x).sum().backward()
                    opt.step()


    if __name__ == "__main__":
        main(sys.argv[1])
"""

MODEL = """
    import torch


    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(16, 64)
            self.fc2 = torch.nn.Linear(64, 4)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))
"""


def run_module(tmp_path, files: dict, module: str):
    """Writes ``files`` into ``tmp_path`` and runs ``python -m module trace`` there: the
    interpreter's launcher calls the user's code, as for any ``python -m`` or ``torchrun``."""
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    trace = tmp_path.resolve() / "run.pstrace"
    subprocess.run(
        [sys.executable, "-m", module, str(trace)],
        cwd=tmp_path,
        check=True,
        timeout=300,
    )
    return trace


def frames(node, prefix=()):
    """Every root-to-node path of a ``lines`` JSON tree, as tuples of ``file:line:function``."""
    out = []
    for child in node.get("children", []):
        here = (*prefix, f"{child['file']}:{child['line']}:{child['function']}")
        out.append(here)
        out.extend(frames(child, here))
    return out


def shown(trace, *extra):
    root = report_json("lines", trace, *extra)["root"]
    return root, {f for path in frames(root) for f in path}


def test_a_script_run_through_a_launcher_reads_from_the_users_first_line(tmp_path):
    trace = run_module(tmp_path, {"launch.py": LAUNCH, "net.py": NET}, "launch")
    root, user = shown(trace, "--frames", "user")
    all_root, every = shown(trace, "--frames", "all")
    # A pool's trace: every frame as recorded unless asked, as LineProfileHook prints it.
    assert shown(trace)[1] == every
    # What was recorded: the launcher's frames under the user's.
    assert any("runpy" in f for f in every), every
    # What is shown: the user's own lines, their paths from the directory they share.
    assert not any("runpy" in f or "<frozen" in f for f in user), user
    where = str(tmp_path.resolve())
    assert not any(where in f for f in user), user
    paths = [p for p in frames(root) if p[-1].startswith("net.py:")]
    assert {p[-1].rsplit(":", 1)[0] for p in paths} == {"net.py:3", "net.py:4"}
    # The outermost frame is the script's own line; the two lines of `allocate` stay two.
    assert all(p[0].startswith("launch.py:") and p[0].endswith(":<module>") for p in paths)
    assert len(paths) == 2
    # Every line of the user's recorded is one of the view's, and no other is.
    mine = {f.replace(f"{where}/", "") for f in every if f.startswith(where)}
    assert mine == user
    # No byte is lost or counted twice by dropping frames.
    assert (root["used_bytes"], root["acquired_bytes"]) == (
        all_root["used_bytes"],
        all_root["acquired_bytes"],
    )
    assert root["used_bytes"] == 2 * (3 << 20)


def test_a_tracked_pytorch_model_reads_as_its_lines_modules_and_operators(tmp_path):
    pytest.importorskip("torch")
    trace = run_module(tmp_path, {"train.py": TRAIN, "model.py": MODEL}, "train")
    root, user = shown(trace)
    all_root, every = shown(trace, "--frames", "all")
    where = str(tmp_path.resolve())
    # Recorded: the launcher's and the standard library's frames (the parameters are made
    # under runpy and `contextlib`), the user's files by their absolute paths.
    assert any("runpy" in f for f in every), every
    assert any("/lib/python3" in f for f in every), every
    # Shown: those dropped, the user's paths from their common directory, nothing else changed.
    for f in every - user:
        assert "runpy" in f or "/lib/python3" in f or f.startswith(f"{where}/"), f
    for f in user - every:
        assert f"{where}/{f}" in every, f
    assert not any(where in f for f in user), user
    # The user's lines, the modules and the operators under them, the categories.
    for kept in ("train.py:25:<module>", ":0:aten::addmm", ":0:activation", ":0:parameter"):
        assert kept in user, (kept, user)
    assert any(f.endswith("fc1: Linear") for f in user), user
    # The scopes poolsight records — modules, operators — and the categories are not frames
    # a caller handed in: every one is kept, with the same figures.
    for command in ("functions", "timers", "categories"):
        mine = report_json(command, trace)
        theirs = report_json(command, trace, "--frames", "all")
        if command == "timers":
            for t in (mine, theirs):
                for row in t["links"] + t["functions"]:
                    row.pop("elapsed_ns")
        assert mine == theirs, command
    assert report_json("functions", trace)["functions"], "operators are recorded"
    assert (root["used_bytes"], root["acquired_bytes"]) == (
        all_root["used_bytes"],
        all_root["acquired_bytes"],
    )
    # The peak's stacks as `pytest --poolsight` names them: the user's frames too.
    import poolsight

    at_peak = poolsight._native.peak(str(trace))["at_peak"]
    assert at_peak and not any(
        "runpy" in f or "contextlib" in f for frames_, _ in at_peak for f in frames_
    ), at_peak


def test_a_profile_made_snapshots_builtins_read_the_same_in_every_run(tmp_path):
    """`_profile_to_snapshot` names a C function called from Python with the address of the
    object it is bound to (`<built-in method dropout of type object at 0x7f…>`), which differs
    from process to process: the user's view leaves the address out, so that the same line of
    two runs is one `lines` row and `diff` finds nothing changed."""
    pytest.importorskip("torch.cuda._memory_viz", reason="this torch has no _memory_viz")
    import pickle
    import re

    import torch
    from test_snapshots import snapshot_of
    from torch import nn

    def train():
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 4))
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        for _ in range(2):
            m(torch.randn(8, 16)).t().contiguous().sum().backward()
            opt.step()
            opt.zero_grad()
        return m, opt

    snap = snapshot_of(train)
    names = {
        f["name"]
        for e in snap["device_traces"][0]
        for f in e.get("frames", [])
        if f["name"].startswith("<built-in method")
    }
    assert any(" at 0x" in n for n in names), names
    # The same run as another process would write it: every object at another address.
    moved = pickle.loads(pickle.dumps(snap))
    for e in moved["device_traces"][0]:
        for f in e.get("frames", []):
            f["name"] = re.sub(r" at 0x[0-9a-f]+>$", " at 0xdeadbeef00>", f["name"])
    paths = []
    for name, s in (("a", snap), ("b", moved)):
        p = tmp_path / f"{name}.pickle"
        p.write_bytes(pickle.dumps(s))
        paths.append(p)

    lines = run_cli("lines", paths[0]).stdout
    assert "<built-in method" in lines and "0x" not in lines, lines
    assert "<built-in method Tensor.contiguous>" in lines, lines
    args = ("--section", "lines", "--section", "peak", "--format", "json")
    diff = json.loads(run_cli("diff", *paths, *args).stdout)
    assert any(r["section"] == "headline" for r in diff["rows"]), diff
    changed = [r["key"] for r in diff["rows"] if r["key"].startswith(("line:", "peak.line."))]
    assert changed == [], changed[:5]
    # As PyTorch's viewer shows them, they keep their addresses.
    assert "0x" in run_cli("lines", paths[0], "--frames", "viewer").stdout
