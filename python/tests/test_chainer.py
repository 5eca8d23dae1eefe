"""poolsight.chainer against Chainer's own hooks, in one process.

Chainer 7.8.1 needs numpy < 2, so it lives in its own environment (scripts/test.sh makes
.venv-chainer from python/requirements-chainer.txt and exports POOLSIGHT_CHAINER_PYTHON); these
tests run Chainer programs in that interpreter and analyze their traces here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter

import pytest

CHAINER_PYTHON = os.environ.get("POOLSIGHT_CHAINER_PYTHON")

if not CHAINER_PYTHON:
    reason = (
        "POOLSIGHT_CHAINER_PYTHON is unset: Chainer needs its own environment "
        "(scripts/test.sh makes .venv-chainer and sets it)"
    )
    print(f"\ntest_chainer.py skipped: {reason}", file=sys.stderr)
    pytest.skip(reason, allow_module_level=True)

# Chainer's documented TimerHook example (`with hook: trainer.run()`) on a small MLP classifier,
# with Chainer's link and function TimerHooks AND poolsight's hooks registered together, plus a
# hook counting (function, phase) as Chainer reports them.
PROGRAM = textwrap.dedent(
    """
    import json, sys
    from collections import Counter

    import numpy as np
    import chainer
    import chainer.functions as F
    import chainer.links as L
    from chainer import training
    from chainer.function_hooks import TimerHook as FunctionTimerHook
    from chainer.link_hooks import TimerHook as LinkTimerHook

    import poolsight
    import poolsight.chainer


    class MLP(chainer.Chain):
        def __init__(self):
            super().__init__()
            with self.init_scope():
                self.l1 = L.Linear(None, 32)
                self.l2 = L.Linear(None, 32)
                self.l3 = L.Linear(None, 4)

        def forward(self, x):
            h = F.relu(self.l1(x))
            h = F.relu(self.l2(h))
            return self.l3(h)


    class Phases(chainer.FunctionHook):
        name = "Phases"

        def __init__(self):
            self.counts = Counter()

        def forward_postprocess(self, function, in_data):
            self.counts[function._impl_name, "forward"] += 1

        def backward_postprocess(self, function, in_data, out_grad):
            self.counts[function._impl_name, "backward"] += 1


    rng = np.random.RandomState(0)
    x = rng.rand(96, 8).astype(np.float32)
    t = rng.randint(0, 4, size=96).astype(np.int32)
    model = L.Classifier(MLP())
    optimizer = chainer.optimizers.SGD()
    optimizer.setup(model)
    it = chainer.iterators.SerialIterator(
        chainer.datasets.TupleDataset(x, t), 16, shuffle=False
    )
    updater = training.StandardUpdater(it, optimizer)
    trainer = training.Trainer(updater, (2, "epoch"), out=sys.argv[2])

    link_timer, function_timer, phases = LinkTimerHook(), FunctionTimerHook(), Phases()
    with poolsight.record(sys.argv[1]) as rec:
        with link_timer, function_timer, phases, poolsight.chainer.FunctionHook(
            rec
        ), poolsight.chainer.LinkHook(rec):
            trainer.run()
        # An extra call: Add's label is "_ + _"; Chainer's hooks print its class name.
        with function_timer, poolsight.chainer.FunctionHook(rec):
            chainer.Variable(x) + chainer.Variable(x)

    def rows(summary):
        return [[name, v["occurrence"]] for name, v in summary.items()]

    link_timer.print_report()
    function_timer.print_report()
    print(json.dumps({
        "links": rows(link_timer.summary()),
        "functions": rows(function_timer.summary()),
        "phases": [[n, p, c] for (n, p), c in phases.counts.items()],
    }))
    """
)


def _run_chainer(tmp_path):
    trace = tmp_path / "chainer.pstrace"
    script = tmp_path / "chainer_program.py"
    script.write_text(PROGRAM)
    out = subprocess.run(
        [CHAINER_PYTHON, str(script), str(trace), str(tmp_path / "result")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    return trace, out.stdout.splitlines()


def _poolsight_json(*args) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "poolsight", *args, "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def test_timer_tables_match_chainers_timer_hooks_and_phases_are_right(tmp_path):
    trace, lines = _run_chainer(tmp_path)
    chainer_result = json.loads(lines[-1])
    print("\n".join(lines[:-1]))  # Chainer's own reports, for the log

    timers = _poolsight_json("timers", str(trace))
    ours_links = [[r["name"], r["occurrence"]] for r in timers["links"]]
    ours_functions = [[r["name"], r["occurrence"]] for r in timers["functions"]]
    # Same rows, same order (first return), same occurrences; only the times differ.
    assert ours_links == chainer_result["links"]
    assert ours_functions == chainer_result["functions"]
    assert [n for n, _ in ours_links] == ["Linear", "MLP", "Classifier"]
    assert "Add" in [n for n, _ in ours_functions], "named by class, not label ('_ + _')"
    assert all(r["elapsed_ns"] > 0 for r in timers["links"] + timers["functions"])

    # Phases: each function scope's phase, counted from the trace's events, equals what
    # Chainer's forward/backward callbacks saw (the extra Add call was outside `Phases`).
    export = tmp_path / "chainer.jsonl"
    subprocess.run(
        [sys.executable, "-m", "poolsight", "export", str(trace), "--format", "json"]
        + ["-o", str(export)],
        check=True,
        capture_output=True,
    )
    stacks, counts = {}, Counter()
    for line in export.read_text().splitlines():
        e = json.loads(line)
        if e["type"] == "stack":
            stacks[e["id"]] = e
        elif e["type"] == "function":
            s = stacks[e["stack"]]
            counts[s["name"], s["phase"]] += 1
    counts["Add", "forward"] -= 1
    counts += Counter()  # drops the zero
    expected = Counter({(n, p): c for n, p, c in chainer_result["phases"]})
    assert counts == expected
    assert ("LinearFunction", "backward") in expected and ("ReLU", "forward") in expected


def test_function_scopes_nest_under_link_scopes(tmp_path):
    trace, _ = _run_chainer(tmp_path)
    functions = _poolsight_json("functions", str(trace))["functions"]
    names = [r["name"] for r in functions]
    assert "LinearFunction" in names and "SoftmaxCrossEntropy" in names
    # No CuPy memory here (Chainer on CPU): every row is 0 bytes, with Chainer's occurrences.
    assert all(r["used_bytes"] == 0 and r["acquired_bytes"] == 0 for r in functions)
    timers = _poolsight_json("timers", str(trace))
    by_name = {r["name"]: r["occurrence"] for r in timers["functions"]}
    assert {r["name"]: r["occurrence"] for r in functions} == by_name


# Chainer programs where calls raise, with Chainer's own link and function TimerHooks beside
# poolsight's hooks: a function that raises inside another function's forward (caught there:
# reentrancy), and one that raises out of the model into the training loop (caught there).
# Memory comes from poolsight's host pool inside the functions' forward, as CuPy's would.
RAISING = textwrap.dedent(
    """
    import json, sys

    import numpy as np
    import chainer
    import chainer.functions as F
    import chainer.links as L
    from chainer.function_hooks import TimerHook as FunctionTimerHook
    from chainer.link_hooks import TimerHook as LinkTimerHook

    import poolsight
    import poolsight.chainer

    MB = 1 << 20
    rec = poolsight.record(sys.argv[1])
    pool = poolsight.Pool(rec)
    fail = [False]


    def take(n):
        pool.free(pool.malloc(n))


    class Flaky(chainer.FunctionNode):
        def forward(self, inputs):
            take(3 * MB)
            if fail[0]:
                raise RuntimeError("bad index")
            return inputs[0] * 2,


    class Inner(chainer.FunctionNode):
        def forward(self, inputs):
            take(1 * MB)
            return inputs[0] + 1,


    class Outer(chainer.FunctionNode):
        def forward(self, inputs):
            x, = inputs
            y, = Inner().apply((x,))
            fail[0] = True
            try:
                Flaky().apply((x,))
            except RuntimeError:
                pass
            finally:
                fail[0] = False
            return y.array,


    class Model(chainer.Chain):
        def __init__(self):
            super().__init__()
            with self.init_scope():
                self.l1 = L.Linear(None, 8)

        def forward(self, x, explode):
            h = self.l1(x)
            h, = Outer().apply((h,))
            fail[0] = explode
            try:
                h, = Flaky().apply((h,))
            finally:
                fail[0] = False
            return F.sum(h)


    x = np.ones((4, 8), np.float32)
    model = Model()
    link_timer, function_timer = LinkTimerHook(), FunctionTimerHook()
    completed = 0
    with link_timer, function_timer, poolsight.chainer.FunctionHook(rec), \\
            poolsight.chainer.LinkHook(rec):
        for i in range(6):
            try:
                model(x, explode=i in (1, 3))
                completed += 1
            except RuntimeError:
                pass
    rec.finish()

    def rows(summary):
        return [[name, v["occurrence"]] for name, v in summary.items()]

    print(json.dumps({
        "links": rows(link_timer.summary()),
        "functions": rows(function_timer.summary()),
        "completed": completed,
    }))
    """
)


def test_calls_that_raise_are_not_calls_as_in_chainers_hooks(tmp_path):
    trace = tmp_path / "raising.pstrace"
    script = tmp_path / "raising.py"
    script.write_text(RAISING)
    out = subprocess.run(
        [CHAINER_PYTHON, str(script), str(trace)], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr
    chainer_result = json.loads(out.stdout.splitlines()[-1])
    assert chainer_result["completed"] == 4

    # The same rows and occurrences as Chainer's TimerHooks: raising calls are no calls.
    timers = _poolsight_json("timers", str(trace))
    assert [[r["name"], r["occurrence"]] for r in timers["links"]] == chainer_result["links"]
    ours = sorted([r["name"], r["occurrence"]] for r in timers["functions"])
    assert ours == sorted(chainer_result["functions"])

    mb = 1 << 20
    rows = {r["name"]: r for r in _poolsight_json("functions", str(trace))["functions"]}
    # Flaky: 6 calls inside Outer raised, 2 at the model level raised, 4 completed.
    assert rows["Flaky"]["occurrence"] == 4
    assert rows["Flaky"]["used_bytes"] == 4 * 3 * mb
    # Outer (6 calls, all completed) keeps its Inner call and the Flaky call that raised in it.
    assert rows["Outer"]["occurrence"] == 6
    assert rows["Outer"]["used_bytes"] == 6 * (1 + 3) * mb
    # Outer's exclusive bytes include what the raising call allocated directly.
    assert rows["Outer"]["self_used_bytes"] == 6 * 3 * mb
    assert rows["Inner"]["used_bytes"] == 6 * mb

    # Nothing after an exception nests under the call that raised: every frame keeps its depth.
    depths = {}

    def walk(node, depth):
        for c in node["children"]:
            depths.setdefault(c["function"], set()).add(depth)
            walk(c, depth + 1)

    walk(_poolsight_json("lines", str(trace))["root"], 1)
    assert depths["Model"] == {1}, depths
    assert depths["Outer"] == {2}, depths
    assert depths["Flaky"] == {2, 3}, depths
