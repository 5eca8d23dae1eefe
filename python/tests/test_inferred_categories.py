"""Categories inferred from a snapshot that records none, against PyTorch's own: each style
trains the same CNN + Transformer-encoder model three steps with AdamW under
``torch.profiler``, ``_memory_viz._profile_to_snapshot`` makes PyTorch's snapshot of it (each
allocation with the profiler's category), and poolsight reads it twice: as PyTorch wrote it
(the profiler's categories) and with every ``category`` removed (poolsight's inference,
docs/pytorch-files.md "Categories without track()").

Two names differ for the same thing, and are compared as one: the profiler's
``autograd_detail`` (what a backward function makes that is no gradient) is an inferred
``temporary``, and a block live from before the profile, which the profiler's snapshot gives no
category, is ``before recording``."""

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F
from conftest import report_json
from test_snapshots import snapshot_of
from torch import nn

pytest.importorskip("torch.cuda._memory_viz", reason="this torch has no _memory_viz")

SAME = {"autograd_detail": "temporary", "(unlabelled)": "before recording"}


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
        out = self.head(h.mean(1))
        if self.dict_out:
            return {"logits": out, "loss": F.cross_entropy(out, y)}
        return out


def plain(m, opt, batches):
    for x, y in batches:
        opt.zero_grad()
        F.cross_entropy(m(x), y).backward()
        opt.step()


def dict_output(m, opt, batches):
    for x, y in batches:
        opt.zero_grad()
        m(x, y)["loss"].backward()
        opt.step()


def accumulation(m, opt, batches):
    for x, y in batches:
        opt.zero_grad()
        for xx, yy in zip(x.chunk(2), y.chunk(2)):
            (F.cross_entropy(m(xx), yy) / 2).backward()
        opt.step()


def autocast(m, opt, batches):
    for x, y in batches:
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(m(x), y)
        loss.backward()
        opt.step()


def closure(m, opt, batches):
    for x, y in batches:

        def step(x=x, y=y):
            opt.zero_grad()
            loss = F.cross_entropy(m(x), y)
            loss.backward()
            return loss

        opt.step(step)


STYLES = {
    "plain loop": (plain, {}),
    "dict output (Hugging Face style)": (dict_output, {"dict_out": True}),
    "gradient accumulation": (accumulation, {}),
    "autocast": (autocast, {}),
    "activation checkpointing": (plain, {"checkpoint": True}),
    "optimizer.step(closure)": (closure, {}),
}


def snapshot(train, kw) -> dict:
    """PyTorch's snapshot of a profile of three steps of `train` (test_snapshots.py's)."""
    torch.manual_seed(0)
    model = Net(**kw)
    opt = torch.optim.AdamW(model.parameters())
    batches = [(torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))) for _ in range(3)]

    def run():
        train(model, opt, batches)
        return model, opt

    return snapshot_of(run)


def by_category(path) -> tuple[dict, int, bool]:
    j = report_json("categories", path)
    rows = {}
    for c in j["categories"]:
        name = SAME.get(c["category"], c["category"])
        at, most = rows.get(name, (0, 0))
        rows[name] = (at + c["at_peak_bytes"], most + c["max_bytes"])
    return rows, j["peak_used_bytes"], j["inferred"]


@pytest.mark.parametrize("style", list(STYLES))
def test_inferred_categories_agree_with_the_profilers(style, tmp_path):
    train, kw = STYLES[style]
    snap = snapshot(train, kw)
    theirs_path = tmp_path / "profiler.pickle"
    theirs_path.write_bytes(pickle.dumps(snap))
    bare = copy.deepcopy(snap)
    for trace in bare["device_traces"]:
        for e in trace:
            e.pop("category", None)
    ours_path = tmp_path / "bare.pickle"
    ours_path.write_bytes(pickle.dumps(bare))

    theirs, peak, recorded_inferred = by_category(theirs_path)
    ours, our_peak, inferred = by_category(ours_path)
    assert (recorded_inferred, inferred) == (False, True)
    assert our_peak == peak > 0
    # At least 95 % of the bytes live at the peak in the same category.
    agree = sum(min(b, ours.get(c, (0, 0))[0]) for c, (b, _) in theirs.items())
    assert agree >= 0.95 * peak, (style, theirs, ours)
    # Parameters, gradients and optimizer state exactly, at the peak.
    for c in ("parameter", "gradient", "optimizer_state"):
        assert ours.get(c, (0, 0))[0] == theirs.get(c, (0, 0))[0], (style, c, theirs, ours)
