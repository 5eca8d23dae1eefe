"""Memory categories in every training style, checked on the same steps against PyTorch's own
``MemTracker`` and ``torch.profiler``'s memory profile (docs/python.md, "Categories").

Each style trains the same CNN + Transformer-encoder model two steps with AdamW (so the
second step's peak holds optimizer state), three times from the same seed: under poolsight's
``track()`` + ``hook()``, under ``MemTracker``, under ``torch.profiler``. poolsight's figures
are read twice: from ``poolsight categories --format json``, and by replaying the trace's own
events from ``poolsight export --format json`` here, independently of the analyzer. Every test
runs with each backend of ``track()`` (the native observer and the Python dispatch mode), which
must give the same figures."""

import json
import os
import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import report_json, run_cli
from torch import nn

import poolsight
import poolsight.torch as pst

mem_tracker = pytest.importorskip(
    "torch.distributed._tools.mem_tracker", reason="this torch has no MemTracker"
)


# Every test with each backend of track() and hook() (conftest's `backend`).
pytestmark = pytest.mark.usefixtures("backend")


class Net(nn.Module):
    def __init__(self, checkpoint=False, dict_out=False):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.BatchNorm2d(8)
        self.enc = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0)
        self.head = nn.Linear(32, 10)
        self.checkpoint, self.dict_out = checkpoint, dict_out

    def forward(self, x, y=None):
        h = F.relu(self.norm(self.conv(x))).flatten(2).reshape(x.shape[0], 64, 32)
        if self.checkpoint:
            h = torch.utils.checkpoint.checkpoint(self.enc, h, use_reentrant=False)
        else:
            h = self.enc(h)
        logits = self.head(h.mean(1))
        if self.dict_out:  # a Hugging Face-style output: the loss computed inside the model
            return {"loss": F.cross_entropy(logits, y), "logits": logits}
        return logits


STYLES = ["plain", "dict", "accumulate", "autocast", "checkpoint", "dataset", "closure"]
DESCRIBED = {
    "plain": "plain loop",
    "dict": "Hugging Face-style dict output, loss inside",
    "accumulate": "gradient accumulation, 2 micro-batches",
    "autocast": "torch.autocast, bfloat16",
    "checkpoint": "activation checkpointing",
    "dataset": "batch made from raw uint8 data",
    "closure": "optimizer.step(closure), as Lightning",
}


def setup(style, micro=lambda: None):
    """The model, its optimizer, and one training step of ``style`` (``micro`` runs after
    each micro-batch's backward)."""
    torch.manual_seed(0)
    model = Net(checkpoint=style == "checkpoint", dict_out=style == "dict")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data, labels = torch.randn(64, 3, 16, 16), torch.randint(0, 10, (64,))
    pixels = (torch.rand(64, 3, 16, 16) * 255).to(torch.uint8)

    def step(i):
        x, y = data[i * 16 : (i + 1) * 16], labels[i * 16 : (i + 1) * 16]
        if style == "accumulate":  # two micro-batches per optimizer step
            opt.zero_grad()
            for j in (2 * i, 2 * i + 1):
                xb, yb = data[j * 8 : (j + 1) * 8], labels[j * 8 : (j + 1) * 8]
                (F.cross_entropy(model(xb), yb) / 2).backward()
                micro()
            opt.step()
            return
        if style == "closure":  # Lightning's way: forward and backward inside optimizer.step

            def closure():
                opt.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                return loss

            opt.step(closure)
            return
        if style == "dataset":  # the batch made from raw data outside the model
            x = (pixels[i * 16 : (i + 1) * 16].float() / 255 - 0.5) / 0.25
        opt.zero_grad()
        if style == "dict":
            loss = model(x, y)["loss"]
        elif style == "autocast":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
        else:
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    return model, opt, step


def record(style, trace):
    model, opt, step = setup(style)
    with poolsight.record(trace):
        with pst.track(model, opt), pst.hook(model):
            for i in range(2):
                step(i)
    return model


def replay(trace):
    """poolsight's trace read from its JSON Lines export (relabels move a block to another
    stack): the live blocks when used bytes were highest, each as (bytes, category, whether
    inside an optimizer step)."""
    out = run_cli("export", "--format", "json", trace, "-o", "-").stdout
    stacks, live, used, peak, at_peak = {}, {}, 0, -1, {}
    for line in out.splitlines():
        e = json.loads(line)
        if e["type"] == "stack":
            stacks[e["id"]] = e
        elif e["type"] == "malloc_post":
            live[e["ptr"]] = (e["bytes"], e["stack"])
            used += e["bytes"]
            if used > peak:
                peak, at_peak = used, dict(live)
        elif e["type"] == "free_post" and e["ptr"] in live:
            used -= live.pop(e["ptr"])[0]
        elif e["type"] == "relabel" and e["ptr"] in live:
            # The block moves to its category's stack; live bytes do not change.
            live[e["ptr"]] = (live[e["ptr"]][0], e["stack"])
    blocks = []
    for nbytes, s in at_peak.values():
        assert stacks[s]["kind"] == "label", stacks[s]
        category, names = stacks[s]["name"], []
        while s:
            names.append(stacks[s]["name"])
            s = stacks[s]["parent"]
        blocks.append((nbytes, category, any(n.endswith(".step") for n in names)))
    return peak, blocks


# poolsight's categories as MemTracker's: it counts inputs as activations, and everything an
# optimizer step allocates as optimizer state.
AS_MEMTRACKER = {
    "parameter": "Parameter",
    "buffer": "Buffer",
    "gradient": "Gradient",
    "optimizer_state": "Optstate",
    "activation": "Activation",
    "input": "Activation",
    "temporary": "Temp",
}


def by_category(blocks, mapping=None, optimizer=None):
    out = {}
    for nbytes, category, in_step in blocks:
        name = optimizer if (in_step and optimizer and category == "temporary") else category
        name = mapping.get(name, name) if mapping else name
        out[name] = out.get(name, 0) + nbytes
    return out


def memtracker(style):
    """MemTracker's categories at its peak, and each module's last forward (FQN -> pre, post,
    peak), MemTracker's own figures."""
    mt = mem_tracker.MemTracker()
    model, opt, step = setup(style, micro=mt.reset_mod_stats)
    mt.track_external(model, opt)
    with mt:
        for i in range(2):
            if style != "accumulate":
                mt.reset_mod_stats()
            step(i)
    (snap,) = mt.get_tracker_snapshot("peak").values()
    cats = {str(k.value if hasattr(k, "value") else k): v for k, v in snap.items() if v}
    states = mem_tracker._ModState
    modules = {}
    for stats in mt.memory_tracking.values():

        def total(state, stats=stats):
            (dev,) = stats.snapshots[state][-1].values()
            return dev["Total"]

        modules[stats.mod_fqn] = (
            total(states.PRE_FW),
            total(states.POST_FW),
            total(states.PEAK_FW),
        )
    return cats, modules


def profiled(style):
    """torch.profiler's memory timeline (what its memory_timeline plot draws) at its peak:
    bytes by the profiler's category."""
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX, MemoryProfileTimeline

    _model, _opt, step = setup(style)
    with profile(
        activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True
    ) as prof:
        for i in range(2):
            step(i)
    timeline = MemoryProfileTimeline(prof._memory_profile())
    _times, sizes = timeline._coalesce_timeline(torch.device("cpu"))
    names = {i + 1: (c.name if c is not None else "unknown") for c, i in _CATEGORY_TO_INDEX.items()}
    totals = [sum(s) for s in sizes]
    at = max(range(len(totals)), key=totals.__getitem__)
    return totals[at], {names[i]: v for i, v in enumerate(sizes[at]) if v and i in names}


@pytest.mark.parametrize("style", STYLES)
def test_categories_at_the_peak_equal_memtrackers(style, trace):
    record(style, trace)
    peak, blocks = replay(trace)
    ours = by_category(blocks, AS_MEMTRACKER, optimizer="optimizer_state")
    cli = report_json("categories", trace)
    # The analyzer's table says what the events say.
    assert cli["peak_used_bytes"] == peak
    assert {c["category"]: c["at_peak_bytes"] for c in cli["categories"] if c["at_peak_bytes"]} == (
        by_category(blocks)
    )
    theirs, _modules = memtracker(style)
    assert theirs.pop("Total") == peak
    if style == "closure":
        # MemTracker counts all that optimizer.step allocates as optimizer state, the closure's
        # forward and backward included; poolsight follows the profiler (next test).
        assert theirs["Optstate"] > ours["Optstate"] and sum(theirs.values()) == peak
        return
    assert ours == theirs


@pytest.mark.parametrize("style", [s for s in STYLES if s != "checkpoint"])
def test_categories_at_the_peak_equal_the_profilers(style, trace):
    record(style, trace)
    peak, blocks = replay(trace)
    ours = by_category(blocks)
    total, theirs = profiled(style)
    if style == "autocast" and total != peak:
        # The profiler sees every block PyTorch's CPU allocator hands out, MemTracker and
        # poolsight see tensor storages. Where bfloat16 kernels allocate memory of their own
        # (seen on a CPU with AVX512-BF16, not on one without), the profiler's timeline holds
        # blocks of no tensor ("unknown" to it) and peaks elsewhere, higher by at most those;
        # MemTracker's peak is still poolsight's (the test above).
        assert peak < total <= peak + theirs.get("unknown", 0), (total, peak, theirs)
        return
    assert total == peak
    # The profiler has no buffer category: buffers read as inputs (a BatchNorm's running
    # statistics) or unknown (its batch counter).
    assert ours.get("input", 0) + ours.get("buffer", 0) == theirs.get("INPUT", 0) + theirs.get(
        "unknown", 0
    )
    assert ours.get("parameter", 0) == theirs.get("PARAMETER", 0)
    assert ours.get("gradient", 0) == theirs.get("GRADIENT", 0)
    assert ours.get("optimizer_state", 0) == theirs.get("OPTIMIZER_STATE", 0)
    assert ours.get("activation", 0) == theirs.get("ACTIVATION", 0)
    # Backward's temporaries are the profiler's "autograd detail"; what an optimizer step
    # allocates and frees, its "temporary".
    assert ours.get("temporary", 0) == theirs.get("AUTOGRAD_DETAIL", 0) + theirs.get("TEMPORARY", 0)


def test_checkpointing_recomputation_is_activation_and_costs_no_memory_of_its_own(trace):
    """The profiler calls recomputed tensors autograd detail (they are made in backward);
    poolsight and MemTracker call them activations. Either way the peak is the same as
    without checkpointing here, and the recorder keeps nothing alive: its peak is
    MemTracker's, within what the profiler adds for checkpointing's own bookkeeping."""
    record("checkpoint", trace)
    peak, blocks = replay(trace)
    total, _ = profiled("checkpoint")
    assert peak <= total < peak + 16 * 1024
    plain = trace.with_name("plain.pstrace")
    record("plain", plain)
    assert replay(plain)[0] == peak


def _fqn(path):
    """poolsight's module path (``Net/enc: TransformerEncoderLayer/norm1: LayerNorm``) as
    MemTracker names it (``Net.enc.norm1``)."""
    parts = path.split("/")
    return ".".join([parts[0]] + [p.split(": ")[0] for p in parts[1:]])


@pytest.mark.parametrize("style", ["plain", "dict", "dataset", "autocast"])
def test_module_figures_equal_memtrackers(style, trace):
    record(style, trace)
    ours = {
        _fqn(m["module"]): (m["before_bytes"], m["after_bytes"], m["peak_bytes"], m["calls"])
        for m in report_json("categories", trace)["modules"]
    }
    _, theirs = memtracker(style)
    assert set(ours) == set(theirs)
    for fqn, (pre, post, peak) in theirs.items():
        # The highest call is the second step's (optimizer state is live by then).
        assert ours[fqn] == (pre, post, peak, 2), fqn


def test_stacks_read_user_line_module_op_category(trace):
    record("plain", trace)
    folded = run_cli("export", "--format", "folded", trace, "-o", "-").stdout
    lines = [line.rsplit(" ", 1)[0] for line in folded.splitlines()]
    # The line of setup() that called the model, the model, its module, the op, the category.
    convolution = [s for s in lines if "aten::convolution " in s.replace(";", " ") + " "]
    assert convolution, lines[:20]
    frames = convolution[0].split(";")
    assert frames[0].startswith("step (") and "test_torch_categories.py:" in frames[0]
    assert frames[1].startswith("Net (") and frames[2].startswith("conv: Conv2d (")
    assert frames[3] == "aten::convolution" and frames[4] == "activation"
    # Backward under the module whose forward made the node, never at the root.
    backward = [s for s in lines if "aten::convolution_backward" in s]
    assert backward and all(";conv: Conv2d (" in s for s in backward), backward
    # Operators outside every module (the loss, its backward) under the line that called them.
    source = open(__file__).read().splitlines()

    def called_from(op):
        stack = next(s for s in lines if f";{op};" in s)
        first = stack.split(";")[0]
        assert first.startswith("step (") and first.endswith(")"), stack
        return source[int(first[:-1].rsplit(":", 1)[1]) - 1]

    assert "F.cross_entropy(" in called_from("aten::_log_softmax")
    assert "loss.backward()" in called_from("aten::nll_loss_backward")


try:
    import lightning.pytorch as lightning
except ImportError:
    lightning = None

needs_lightning = pytest.mark.skipif(lightning is None, reason="lightning is not installed")


def lit_net():
    """A LightningModule around Net, counting Net's calls."""

    class LitNet(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = Net()
            self.calls = 0
            self.net.register_forward_pre_hook(lambda *_: setattr(self, "calls", self.calls + 1))

        def training_step(self, batch, _):
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    return LitNet()


def fit(trace, callback, own_track=False):
    from contextlib import ExitStack

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 3, 16, 16), torch.randint(0, 10, (64,)))
    module = lit_net()
    trainer = lightning.Trainer(
        max_epochs=1,
        limit_train_batches=2,
        callbacks=[callback],
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with poolsight.record(trace), ExitStack() as stack:
        if own_track:
            stack.enter_context(pst.track(module))
            stack.enter_context(pst.hook(module))
        trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=16))
    return module


@needs_lightning
def test_lightning_callback_tracks_with_the_trainers_optimizer(trace):
    from poolsight.lightning import PoolsightCallback

    module = fit(trace, PoolsightCallback())
    cats = {c["category"]: c for c in report_json("categories", trace)["categories"]}
    params = sum(p.untyped_storage().nbytes() for p in module.parameters())
    assert cats["parameter"]["at_end_bytes"] == params
    # AdamW keeps two moments per parameter (and a step counter each): known though
    # Lightning made the optimizer inside fit().
    assert cats["optimizer_state"]["at_end_bytes"] >= 2 * params
    assert cats["activation"]["max_bytes"] > 0 and cats["temporary"]["max_bytes"] > 0
    # Lightning runs training_step inside optimizer.step: the line of training_step is there.
    folded = run_cli("export", "--format", "folded", trace, "-o", "-").stdout
    assert any(";training_step (" in s and ";net: Net (" in s for s in folded.splitlines())
    links = {r["name"]: r["occurrence"] for r in report_json("timers", trace)["links"]}
    assert links["net: Net"] == module.calls == 2


@needs_lightning
def test_lightning_callback_composes_with_your_own_track_and_hook(trace, capsys):
    from poolsight.lightning import PoolsightCallback

    module = fit(trace, PoolsightCallback(), own_track=True)
    links = {r["name"]: r["occurrence"] for r in report_json("timers", trace)["links"]}
    assert links["net: Net"] == module.calls == 2, links
    assert "not tracking" not in capsys.readouterr().err


@needs_lightning
def test_lightning_callback_says_when_it_recorded_no_allocation(trace, capsys):
    from poolsight.lightning import PoolsightCallback

    fit(trace, PoolsightCallback(track=False, functions=False))
    assert "recorded no allocation" in capsys.readouterr().err
    with pytest.raises(TypeError, match="track must be True or False"):
        PoolsightCallback(track="yes")


def side_by_side(backend="auto"):
    """The README's table: each style's peak and categories, poolsight's next to MemTracker's
    and the profiler's (``python python/tests/test_torch_categories.py [native|python]``)."""
    pst._AUTO = "native" if backend == "auto" else backend
    order = ["input", "activation", "temporary", "gradient", "optimizer_state", "parameter"]
    print("| training style | peak | " + " | ".join(order) + " | MemTracker | torch.profiler |")
    print("|---" * (len(order) + 4) + "|")
    import tempfile

    path = os.path.join(tempfile.mkdtemp(), "side_by_side.pstrace")
    for style in STYLES:
        if os.path.exists(path):
            os.remove(path)
        record(style, path)
        peak, blocks = replay(path)
        raw = by_category(blocks)
        mapped = by_category(blocks, AS_MEMTRACKER, optimizer="optimizer_state")
        mt, _ = memtracker(style)
        mt_peak = mt.pop("Total")
        differs = sorted(k for k in set(mt) | set(mapped) if mt.get(k, 0) != mapped.get(k, 0))
        mt_says = (
            "same"
            if not differs
            else "differs: " + ", ".join(f"{k} {mt.get(k, 0):,}" for k in differs)
        )
        if mt_peak != peak:
            mt_says += f"; peak {mt_peak:,}"
        total, prof = profiled(style)
        prof_says = "same" if total == peak else f"peak {total:,}"
        if prof.get("ACTIVATION", 0) != raw.get("activation", 0):
            prof_says += f"; activation {prof.get('ACTIVATION', 0):,}"
        cells = [f"{raw.get(k, 0):,}" for k in order]
        print(
            f"| {DESCRIBED[style]} | {peak:,} | "
            + " | ".join(cells)
            + f" | {mt_says} | {prof_says} |"
        )
    os.remove(path)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(__file__))
    side_by_side(*sys.argv[1:2])
