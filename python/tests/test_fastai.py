"""poolsight.fastai.PeakMemCallback on a real fastai Learner (CPU): one epoch row per
(fit, epoch), as fastai prints a table per fit, and a fit after the recording finished never
raises into training."""

import pytest
from conftest import report_json

pytest.importorskip("fastai", reason="fastai is not installed (python/requirements-test.txt)")
torch = pytest.importorskip("torch")

import fastai.callback.progress  # noqa: E402, F401  (Learner.no_bar)
import fastai.callback.schedule  # noqa: E402, F401  (Learner.fine_tune)
from fastai.data.core import DataLoaders  # noqa: E402
from fastai.learner import Learner  # noqa: E402

import poolsight  # noqa: E402
import poolsight.fastai  # noqa: E402


def learner(cbs):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 16, generator=g)
    y = x[:, :4].argmax(dim=1)
    train = list(zip(x[:192], y[:192]))
    valid = list(zip(x[192:], y[192:]))
    dls = DataLoaders.from_dsets(train, valid, bs=32, device="cpu")
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    return Learner(dls, model, loss_func=torch.nn.functional.cross_entropy, cbs=cbs)


def test_fine_tune_gives_a_row_per_fit_and_epoch(trace):
    learn = learner([poolsight.fastai.PeakMemCallback()])
    with poolsight.record(trace):
        with learn.no_logging(), learn.no_bar():
            # fastai's fine_tune: one fit of the frozen epoch 0, then a fit of epochs 0 and 1.
            learn.fine_tune(2, freeze_epochs=1)
    rows = report_json("epochs", trace)["epochs"]
    assert [(r["fit"], r["epoch"]) for r in rows] == [(0, 0), (1, 0), (1, 1)]
    assert all(r["complete"] for r in rows)
    # tracemalloc's figures (fastai's CPU columns) are never negative.
    assert all(
        r["cpu_used_bytes"] >= 0 and r["cpu_peak_bytes"] >= r["cpu_used_bytes"] for r in rows
    )


def test_a_fit_after_the_recording_finished_never_raises(trace, capfd):
    rec = poolsight.record(trace)
    learn = learner([poolsight.fastai.PeakMemCallback(rec)])
    with learn.no_logging(), learn.no_bar():
        learn.fit(1)
    rec.finish()
    capfd.readouterr()
    with learn.no_logging(), learn.no_bar():
        learn.fit(1)  # the recording is finished: dropped and counted, not raised
    assert rec.dropped_events >= 2
    err = [line for line in capfd.readouterr().err.splitlines() if "poolsight" in line]
    assert len(err) == 1 and "is finished" in err[0], err
    assert [r["epoch"] for r in report_json("epochs", trace)["epochs"]] == [0]
    # With no recording given and none open: not recorded, and said once.
    learn2 = learner([poolsight.fastai.PeakMemCallback()])
    for _ in range(2):
        with learn2.no_logging(), learn2.no_bar():
            learn2.fit(1)
    err = capfd.readouterr().err
    assert err.count("no recording is open") == 1, err
