"""A tensor ``track()`` saw made by an operator and learns later to be a gradient or an
optimizer's state is moved by one relabel event: cumulative figures (``functions``, folded
``used``) count its bytes once, under the operator that made it; what is live (categories, the
peak's stacks) shows it under its category. An LSTM tagger trained with momentum SGD, with each
backend of ``track()`` and ``hook()``."""

import pytest

torch = pytest.importorskip("torch")

from conftest import report_json, run_cli  # noqa: E402

import poolsight  # noqa: E402
import poolsight.torch as pst  # noqa: E402

pytestmark = pytest.mark.usefixtures("backend")

VOCAB, TAGS, EMBED, HIDDEN, LENGTH, BATCH = 50, 7, 16, 32, 12, 8


class Tagger(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, EMBED)
        self.lstm = torch.nn.LSTM(EMBED, HIDDEN, batch_first=True)
        self.out = torch.nn.Linear(HIDDEN, TAGS)

    def forward(self, words):
        h, _ = self.lstm(self.embed(words))
        return self.out(h)


def train(trace, steps=3):
    torch.manual_seed(0)
    model = Tagger()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    words = torch.randint(0, VOCAB, (BATCH, LENGTH), generator=g)
    tags = torch.randint(0, TAGS, (BATCH, LENGTH), generator=g)
    with poolsight.record(trace):
        with pst.hook(model), pst.track(model, opt):
            for _ in range(steps):
                opt.zero_grad(set_to_none=True)
                scores = model(words)
                loss = torch.nn.functional.cross_entropy(scores.reshape(-1, TAGS), tags.reshape(-1))
                loss.backward()
                opt.step()
    return sum(p.numel() * p.element_size() for p in model.parameters())


def folded(trace, metric):
    """(frames, value) of ``export --format folded --metric metric``."""
    out = run_cli("export", trace, "--format", "folded", "--metric", metric, "-o", "-").stdout
    rows = []
    for line in out.splitlines():
        stack, value = line.rsplit(" ", 1)
        rows.append((stack.split(";"), int(value)))
    return rows


def test_momentum_buffers_and_gradients_count_once_where_they_were_made(trace):
    params = train(trace)
    info = report_json("info", trace)
    assert info["events"].get("relabel", 0) > 0

    used = folded(trace, "used")
    # Nothing is ever allocated as a gradient or as optimizer state: those are relabels.
    assert sum(v for frames, v in used if frames[-1] == "optimizer_state") == 0
    assert sum(v for frames, v in used if frames[-1] == "gradient") == 0
    # Each momentum buffer once: the step's clone of each gradient, at its first step.
    cloned = sum(
        v
        for frames, v in used
        if any(f.startswith("SGD.step") for f in frames)
        and any(f.startswith("aten::clone") for f in frames)
    )
    assert cloned == params

    # Live: the buffers are the optimizer's state, the last step's gradients are gradients.
    categories = {c["category"]: c for c in report_json("categories", trace)["categories"]}
    assert categories["optimizer_state"]["at_end_bytes"] == params
    assert categories["gradient"]["at_end_bytes"] == params
    assert categories["parameter"]["at_end_bytes"] == params
