"""PyTorch on CPU: modules as links, operators as functions, tensor storages observed with a
category, epochs, the Lightning callback; what needs CUDA skips with a printed reason. Every
test runs with each backend of ``track()`` and ``hook()``."""

import sys

import pytest

torch = pytest.importorskip("torch")

from conftest import report_json  # noqa: E402

import poolsight  # noqa: E402
import poolsight.torch as pst  # noqa: E402

# Every test with each backend of track() and hook() (conftest's `backend`).
pytestmark = pytest.mark.usefixtures("backend")


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
        )

    def forward(self, x):
        return self.body(x)


def make_data(n=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 32, generator=g)
    y = (x[:, :10].argmax(dim=1)).long()
    return x, y


def train(model, opt, x, y, steps):
    losses = []
    for i in range(steps):
        xb, yb = x[(i * 32) % 256 :][:32], y[(i * 32) % 256 :][:32]
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_hook_turns_modules_into_links_and_ops_into_functions(trace):
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = make_data()
    with poolsight.record(trace) as rec:
        with pst.hook(model), pst.track(model, opt, scopes=False):
            train(model, opt, x, y, steps=3)
    links = {r["name"]: r for r in report_json("timers", trace)["links"]}
    # A module is named in its parent (siblings of one class stay apart), the model by class.
    assert links["0: Linear"]["occurrence"] == 3
    assert links["2: Linear"]["occurrence"] == 3
    assert links["1: ReLU"]["occurrence"] == 3
    assert links["body: Sequential"]["occurrence"] == 3
    assert links["MLP"]["occurrence"] == 3
    functions = {r["name"]: r for r in report_json("functions", trace)["functions"]}
    assert functions["aten::addmm"]["occurrence"] >= 2 * 3
    assert functions["aten::addmm"]["used_bytes"] > 0, "addmm's outputs are allocations"
    # Backward ops run as function scopes too (on CPU, on this thread).
    assert "aten::threshold_backward" in functions
    assert rec.closed


def _hook_count(model, opt):
    """Every hook track() may install: on modules, on parameters, on the optimizer, and the
    process-wide module and optimizer hooks."""
    from torch.nn.modules import module as nn_module
    from torch.optim import optimizer as optim

    n = sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())
    n += sum(len(getattr(p, "_post_accumulate_grad_hooks", None) or {}) for p in model.parameters())
    n += len(nn_module._global_forward_pre_hooks) + len(nn_module._global_forward_hooks)
    n += len(optim._global_optimizer_pre_hooks) + len(optim._global_optimizer_post_hooks)
    return n + len(opt._optimizer_step_pre_hooks) + len(opt._optimizer_step_post_hooks)


def test_track_refuses_wrong_arguments_and_leaves_no_hooks(trace):
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with poolsight.record(trace):
        with pytest.raises(TypeError, match="optimizer must be a torch.optim.Optimizer"):
            with pst.track(model, [opt, "adam"]):
                pass
        with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
            with pst.track(object(), opt):
                pass
    assert _hook_count(model, opt) == 0


def test_track_that_fails_while_installing_takes_its_hooks_back(trace, monkeypatch):
    from torch.optim import optimizer as optim

    def broken(hook):
        raise RuntimeError("no post hooks here")

    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with poolsight.record(trace):
        monkeypatch.setattr(optim, "register_optimizer_step_post_hook", broken)
        with pytest.raises(RuntimeError, match="no post hooks here"):
            with pst.track(model, opt):
                pass
        assert _hook_count(model, opt) == 0
        monkeypatch.undo()
        # And the recording can be tracked again.
        with pst.track(model, opt):
            model(torch.randn(4, 32))
    assert _hook_count(model, opt) == 0


def test_hook_is_removed_after_the_with(trace):
    model = MLP()
    with poolsight.record(trace):
        with pst.hook(model):
            model(torch.randn(4, 32))
        model(torch.randn(4, 32))  # outside: not recorded
    links = {r["name"]: r for r in report_json("timers", trace)["links"]}
    assert links["MLP"]["occurrence"] == 1


def test_track_records_each_category(trace):
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = make_data()
    param_bytes = sum(p.untyped_storage().nbytes() for p in model.parameters())
    with poolsight.record(trace) as rec:
        with pst.track(model, opt):
            with rec.epoch(1):
                losses = train(model, opt, x, y, steps=4)
    assert losses[-1] < losses[0], "training still trains"
    root = report_json("lines", trace)["root"]

    def totals(node, acc):
        for c in node.get("children", []):
            acc[c["function"]] = acc.get(c["function"], 0) + c["used_bytes"]
            totals(c, acc)
        return acc

    by_name = totals(root, {})
    assert by_name["parameter"] == param_bytes
    # Gradients and optimizer state are relabelled from what made them (backward operators,
    # the step's temporaries): `used` counts each allocation once, there.
    assert "gradient" not in by_name and "optimizer_state" not in by_name
    # set_to_none=True: every step makes new gradients; Adam's exp_avg and exp_avg_sq once.
    assert by_name["temporary"] >= 4 * param_bytes + 2 * param_bytes
    assert by_name["activation"] > 0
    live = {c["category"]: c for c in report_json("categories", trace)["categories"]}
    assert live["gradient"]["at_end_bytes"] == param_bytes
    assert live["optimizer_state"]["at_end_bytes"] >= 2 * param_bytes
    epochs = report_json("epochs", trace)["epochs"]
    assert len(epochs) == 1 and epochs[0]["gpu_peak_bytes"] > 0


def test_track_frees_what_pytorch_frees(trace):
    with poolsight.record(trace):
        with pst.track() as tracker:
            t = torch.empty(1 << 20, dtype=torch.uint8)
            tracker.track_tensor(t, "temporary")
            del t
    info = report_json("info", trace)
    assert info["events"]["malloc_post"] == info["events"]["free_post"]
    # Each storage is the device's too (alloc at first sight, release when freed): nothing
    # stays held once PyTorch freed everything it was seen to allocate.
    assert info["events"]["alloc_post"] == info["events"]["release"]
    assert info["pool"]["acquired_at_end_bytes"] == 0
    assert info["pool"]["peak_acquired_bytes"] >= 1 << 20


def test_track_with_python_stacks_names_the_line(trace):
    def make_activation():
        return torch.ones(1000, 250)  # 1,000,000 bytes

    with poolsight.record(trace, stacks="python"):
        with pst.track():
            kept = make_activation()
    del kept
    text = report_json("lines", trace)["root"]

    def find(node):
        if node.get("function") == "make_activation":
            return node
        for c in node.get("children", []):
            hit = find(c)
            if hit:
                return hit
        return None

    node = find(text)
    assert node is not None and node["used_bytes"] >= 1_000_000


def test_peak_matches_pytorch_mem_tracker(trace):
    mem_tracker = pytest.importorskip("torch.distributed._tools.mem_tracker")
    torch.manual_seed(0)
    x, y = make_data()

    model = MLP()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    train(model, opt, x, y, steps=1)  # optimizer state exists before measuring, in both runs
    mt = mem_tracker.MemTracker()
    mt.track_external(model, opt)
    with mt:
        train(model, opt, x, y, steps=1)
    theirs = mt.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]

    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    train(model, opt, x, y, steps=1)
    with poolsight.record(trace):
        with pst.track(model, opt) as tracker:
            for state in opt.state.values():
                for v in state.values():
                    tracker.track_tensor(v, "optimizer_state")
            train(model, opt, x, y, steps=1)
    ours = report_json("info", trace)["pool"]["peak_used_bytes"]
    print(f"peak live bytes: poolsight {ours}, MemTracker {theirs}", file=sys.stderr)
    assert abs(ours - theirs) <= 0.01 * theirs


def test_use_pool_needs_cuda_and_says_so():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: use_pool is exercised by the GPU check script")
    with pytest.raises(RuntimeError, match="needs CUDA"):
        pst.use_pool()
    with pytest.raises(ValueError, match="not one"):
        pst.use_pool("cpu")
    assert pst.memory_stats() == {}


def test_hook_refuses_what_is_not_a_module(trace):
    with poolsight.record(trace):
        with pytest.raises(TypeError, match="nn.Module"):
            with pst.hook("model"):
                pass


def test_without_a_recording_the_integrations_say_so():
    with pytest.raises(poolsight.PoolsightError, match="no recording"):
        with pst.hook(MLP()):
            pass


def test_lightning_callback_marks_epochs(trace):
    L = pytest.importorskip("lightning.pytorch", reason="lightning is not installed")
    from poolsight.lightning import PoolsightCallback

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = MLP()

        def training_step(self, batch, _):
            xb, yb = batch
            return torch.nn.functional.cross_entropy(self.net(xb), yb)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    x, y = make_data(128)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32)
    with poolsight.record(trace):
        trainer = L.Trainer(
            max_epochs=2,
            callbacks=[PoolsightCallback()],
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(Module(), loader)
    epochs = report_json("epochs", trace)["epochs"]
    assert [e["epoch"] for e in epochs] == [0, 1]


def test_the_example_trains_records_and_reports(tmp_path):
    import re
    import subprocess
    from pathlib import Path

    example = Path(__file__).parent.parent / "examples" / "train_mlp.py"
    out = tmp_path / "train.pstrace"
    proc = subprocess.run(
        [sys.executable, str(example), "--epochs", "2", "--steps", "20", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    losses = [float(m.group(1)) for m in re.finditer(r"^epoch \d+: loss (\S+)$", proc.stdout, re.M)]
    assert len(losses) == 2 and losses[1] < losses[0]
    assert "LinearFunction" not in proc.stdout  # PyTorch names, not Chainer's
    assert "aten::addmm" in proc.stdout and "Linear" in proc.stdout
    epochs = report_json("epochs", out)["epochs"]
    assert [e["epoch"] for e in epochs] == [1, 2]


class Flaky(torch.nn.Module):
    """Raises on the calls whose number is in `fail_on`, after allocating."""

    def __init__(self, fail_on):
        super().__init__()
        self.fail_on, self.calls = set(fail_on), 0
        self.lin = torch.nn.Linear(32, 32)

    def forward(self, x):
        self.calls += 1
        h = self.lin(x)
        if self.calls in self.fail_on:
            raise RuntimeError("bad batch")
        return h


class WithFlaky(torch.nn.Module):
    def __init__(self, fail_on):
        super().__init__()
        self.flaky = Flaky(fail_on)
        self.head = torch.nn.Linear(32, 10)

    def forward(self, x):
        return self.head(self.flaky(x))


def _line_depths(node, depth=1, out=None):
    out = [] if out is None else out
    for c in node["children"]:
        out.append((depth, c["function"]))
        _line_depths(c, depth + 1, out)
    return out


def test_a_module_call_that_raises_is_not_a_call(trace):
    """A batch that makes forward raise, caught by the training loop: the raising calls are no
    calls (no occurrence, no time), and nothing after them nests under them."""
    torch.manual_seed(0)
    model = WithFlaky(fail_on={2, 4})
    x, _ = make_data()
    done = 0
    with poolsight.record(trace):
        with pst.track(model), pst.hook(model, functions=False):
            for _ in range(6):
                try:
                    model(x[:32])
                    done += 1
                except RuntimeError:
                    pass
    assert done == 4
    links = {r["name"]: r["occurrence"] for r in report_json("timers", trace)["links"]}
    # lin: 6 calls inside Flaky (all completed); head, Flaky and WithFlaky: 4 each.
    assert links == {"lin: Linear": 6, "head: Linear": 4, "flaky: Flaky": 4, "WithFlaky": 4}
    depths = _line_depths(report_json("lines", trace)["root"])
    # Under the line of this test that called the model, always at the same depth.
    me = "test_a_module_call_that_raises_is_not_a_call"
    assert {d for d, name in depths if name == me} == {1}, depths
    assert {d for d, name in depths if name == "WithFlaky"} == {2}, depths
    assert {d for d, name in depths if name == "flaky: Flaky"} == {3}, depths


def test_hooking_a_model_twice_is_refused_and_track_and_hook_compose(trace):
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = make_data()
    with poolsight.record(trace) as rec:
        with pst.hook(model):
            with pytest.raises(poolsight.PoolsightError, match="already hooked"):
                with pst.hook(model):
                    pass
        # The README's way, in both orders: each module is one link scope per call.
        with pst.track(model, opt), pst.hook(model):
            train(model, opt, x, y, steps=2)
        with pst.hook(model), pst.track(model, opt):
            train(model, opt, x, y, steps=1)
        assert rec._torch.modules == {}, "every module hook is removed again"
    links = {r["name"]: r["occurrence"] for r in report_json("timers", trace)["links"]}
    assert links == {"0: Linear": 3, "2: Linear": 3, "1: ReLU": 3, "body: Sequential": 3, "MLP": 3}


@pytest.mark.parametrize("page", ["README.md", "docs/python.md"])
def test_the_documented_pytorch_example_counts_each_module_call_once(page, tmp_path, monkeypatch):
    """The example on the page, run as written (on the docs' small MLP): every module's
    occurrences in `poolsight timers` are its real calls, counted here by a hook of our own."""
    import textwrap

    from test_docs import PYTHON_SETUPS, REPO, blocks

    (example,) = [
        b
        for b in blocks(REPO / page)
        if b.lang == "python" and "poolsight.torch.track(model, optimizer)" in b.text
    ]
    assert example.setup == "torch_mlp", example.id
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(textwrap.dedent(PYTHON_SETUPS["torch_mlp"]), scope)
    calls = {}
    for name, module in scope["model"].named_modules():
        key = name.rsplit(".", 1)[-1] + ": " + type(module).__name__ if name else "Sequential"
        calls[key] = 0

        def count(*_, key=key):
            calls[key] += 1

        module.register_forward_pre_hook(count)
    exec(example.text, scope)
    links = {r["name"]: r["occurrence"] for r in report_json("timers", "train.pstrace")["links"]}
    assert links == calls and calls["Sequential"] == 3 * 4, (links, calls)


def test_track_tensor_refuses_what_is_not_a_tensor_or_a_category(trace):
    assert pst.CATEGORIES == (
        "parameter",
        "buffer",
        "gradient",
        "activation",
        "optimizer_state",
        "temporary",
        "input",
        "workspace",
    )
    t = torch.ones(4)  # made before tracking: only track_tensor records it
    with poolsight.record(trace):
        with pst.track() as tracker:
            with pytest.raises(TypeError, match="needs a torch.Tensor, not list"):
                tracker.track_tensor([1, 2], "input")
            with pytest.raises(ValueError, match="category must be one of parameter, "):
                tracker.track_tensor(t, "weights")
            assert tracker.recorded == 0
            tracker.track_tensor(t, "input")
            tracker.track_tensor(t, "input")  # once
            assert tracker.recorded == 1


def test_track_tensor_with_python_stacks_names_the_callers_line(trace):
    kept = torch.zeros(1000, 250)  # made before tracking: recorded where track_tensor is called

    def adopt(tracker):
        tracker.track_tensor(kept, "input")

    with poolsight.record(trace, stacks="python"):
        with pst.track() as tracker:
            adopt(tracker)
    folded = report_json("lines", trace)["root"]

    def names(node, acc):
        acc.add(node.get("function"))
        for c in node.get("children", []):
            names(c, acc)
        return acc

    seen = names(folded, set())
    assert "adopt" in seen and "track_tensor" not in seen


def test_the_recorders_torch_state_goes_with_the_recording(trace):
    """The native per-operator state and the Python state keep each other; once the recording
    is over and dropped, the garbage collector takes both (nothing of the recorder stays)."""
    import gc
    import weakref

    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = make_data()
    with poolsight.record(trace) as rec:
        with pst.track(model, opt), pst.hook(model):
            train(model, opt, x, y, steps=2)
    state = weakref.ref(rec._torch)
    del rec
    gc.collect()
    assert state() is None
    # The model and its optimizer go on without the recorder: no hook left behind.
    assert _hook_count(model, opt) == 0
    train(model, opt, x, y, steps=1)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_tensors_without_a_plain_storage_do_not_stop_the_training(trace):
    """Sparse, nested and meta tensors, complex numbers, operators returning tuples and named
    tuples: recorded where they have a storage, passed over where they do not, never an
    error in the program."""
    model = torch.nn.Linear(4, 4)
    with poolsight.record(trace), pst.track(model), pst.hook(model):
        s = torch.randn(4, 4).to_sparse()
        dense = (s * 2).to_dense()
        torch.sparse.mm(s, torch.randn(4, 2))
        nested = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)])
        nested + 1
        torch.empty(3, device="meta") + 1
        torch.randn(3, dtype=torch.complex64).abs()
        torch.split(torch.randn(6), 2)
        values, _ = torch.max(torch.randn(3, 3), dim=1)
        x = torch.randn(5, 4, requires_grad=True)
        model(x).sum().backward()
    assert dense.shape == (4, 4) and values.shape == (3,) and x.grad is not None
    info = report_json("info", trace)
    assert info["events"]["malloc_post"] > 10


def test_storages_that_hold_no_memory_are_not_recorded(trace):
    """A meta tensor's storage and an empty one have no address and no memory: no allocation,
    whether an operator made them or the user tracks them."""
    with poolsight.record(trace), pst.track() as tracker:
        torch.empty(3, device="meta") * 2
        torch.empty(0) + 1
        tracker.track_tensor(torch.empty(2, device="meta"), "input")
        assert tracker.recorded == 0
        kept = torch.ones(3) + 1
        assert tracker.recorded == 2  # ones, and the sum
    assert kept.sum().item() == 6
    assert report_json("info", trace)["events"]["malloc_post"] == 2


def test_an_operator_that_raises_keeps_its_error_and_is_not_a_call(trace):
    """The native path hands the operator's own exception back unchanged; the operator's scope
    is closed as aborted (no row, no occurrence), and what follows records as usual."""
    a, b = torch.randn(3, 4), torch.randn(5, 6)
    with pytest.raises(RuntimeError) as plain:
        torch.mm(a, b)
    model = MLP()
    with poolsight.record(trace), pst.track(model), pst.hook(model):
        with pytest.raises(RuntimeError) as recorded:
            torch.mm(a, b)
        ok = torch.mm(a, torch.randn(4, 2))
    assert str(recorded.value) == str(plain.value)
    assert ok.shape == (3, 2)
    rows = {r["name"]: r["occurrence"] for r in report_json("functions", trace)["functions"]}
    assert rows.get("aten::mm") == 1, rows


@pytest.mark.parametrize("how", ["torch.compile(model)", "model.compile()"])
def test_a_compiled_model_records_the_figures_of_the_model(tmp_path, how):
    # docs/python.md, "torch.compile": the same categories as the model uncompiled;
    # torch.compile(model)'s wrapper is a module of its own and PyTorch warns about the global
    # module hooks, model.compile() (in place) neither.
    import warnings

    def run(compile_how):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        if compile_how == "torch.compile(model)":
            model = torch.compile(model, backend="eager")
        elif compile_how == "model.compile()":
            model.compile(backend="eager")
        x = torch.randn(4, 8)
        path = tmp_path / f"{compile_how or 'plain'}.pstrace"
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with poolsight.record(path), pst.track(model, opt), pst.hook(model):
                for _ in range(2):
                    opt.zero_grad()
                    model(x).sum().backward()
                    opt.step()
        warned = any("global hooks on modules" in str(w.message) for w in seen)
        return report_json("categories", path), warned

    plain, _ = run(None)
    compiled, warned = run(how)

    def figures(report):  # the bytes of each category (not when: times differ run to run)
        return [{k: v for k, v in c.items() if k.endswith("_bytes")} for c in report["categories"]]

    assert figures(compiled) == figures(plain)
    assert compiled["peak_used_bytes"] == plain["peak_used_bytes"]
    top = compiled["modules"][0]["module"]
    if how == "torch.compile(model)":
        assert warned and top == "OptimizedModule"
    else:
        assert not warned and top == "Sequential"
