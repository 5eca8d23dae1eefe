"""poolsight.transformers.PoolsightCallback on a real Hugging Face ``Trainer`` (CPU): a tiny
GPT-2 made from its config (nothing downloaded) trained for two epochs on synthetic token ids.
The trace has an epoch row per epoch, a ``step`` scope per optimizer step, the model's modules
as link scopes, and exact figures for the parameters and AdamW's state; a ``track()``/``hook()``
of the user's own is kept, and a run that records nothing says so."""

from __future__ import annotations

import json

import pytest
from conftest import report_json, run_cli

torch = pytest.importorskip("torch")
transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (python/requirements-test.txt)"
)
pytest.importorskip("accelerate", reason="the Trainer needs accelerate")

import poolsight  # noqa: E402
import poolsight.torch  # noqa: E402
import poolsight.transformers  # noqa: E402
from poolsight.transformers import PoolsightCallback  # noqa: E402

SAMPLES, BATCH, EPOCHS = 8, 4, 2


def trainer(tmp_path, callbacks, **args):
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=128, n_positions=32, n_embd=64, n_layer=2, n_head=2)
    model = transformers.GPT2LMHeadModel(config)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (SAMPLES, 16), generator=g)
    data = [{"input_ids": row, "labels": row} for row in ids]
    training = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        num_train_epochs=EPOCHS,
        per_device_train_batch_size=BATCH,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        **args,
    )
    return transformers.Trainer(model=model, args=training, train_dataset=data, callbacks=callbacks)


def nbytes(tensors) -> int:
    return sum(t.untyped_storage().nbytes() for t in tensors)


def test_two_epochs_of_a_tiny_gpt2(tmp_path, trace):
    t = trainer(tmp_path, [PoolsightCallback()])
    with poolsight.record(trace):
        t.train()
    steps = SAMPLES // BATCH * EPOCHS
    assert t.state.global_step == steps

    epochs = report_json("epochs", trace)["epochs"]
    assert [r["epoch"] for r in epochs] == [0, 1]
    assert all(r["complete"] for r in epochs)

    # One `step` scope per optimizer step (JSON Lines of every event: its stack, its calls).
    events = [
        json.loads(line)
        for line in run_cli("export", "--format", "json", "-o", "-", trace).stdout.splitlines()
    ]
    step = {
        e["id"]
        for e in events
        if e["type"] == "stack" and e["kind"] == "scope" and e["name"] == "step"
    }
    assert len(step) == 1, step
    assert sum(1 for e in events if e["type"] == "scope" and e["stack"] in step) == steps
    links = {r["name"]: r["occurrence"] for r in report_json("timers", trace)["links"]}
    # Each step runs the model's forward once: its modules are link scopes.
    assert links["GPT2LMHeadModel"] == steps, links

    # Exact figures: every parameter (the tied embedding once) and AdamW's state.
    params = nbytes({p.untyped_storage().data_ptr(): p for p in t.model.parameters()}.values())
    state = nbytes(v for s in t.optimizer.state.values() for v in s.values() if torch.is_tensor(v))
    assert state >= 2 * params
    cats = {c["category"]: c for c in report_json("categories", trace)["categories"]}
    assert cats["parameter"]["at_end_bytes"] == params
    assert cats["optimizer_state"]["at_end_bytes"] == state
    assert cats["gradient"]["max_bytes"] == params


def test_a_track_and_hook_of_your_own_are_kept(tmp_path, trace):
    alone = tmp_path / "alone.pstrace"
    t = trainer(tmp_path, [PoolsightCallback()])
    with poolsight.record(alone):
        t.train()
    t = trainer(tmp_path, [PoolsightCallback()])
    with poolsight.record(trace):
        with poolsight.torch.track(t.model), poolsight.torch.hook(t.model):
            t.train()
    # A module call is one scope whoever asked for it: the same rows as the callback alone.
    links = [(r["name"], r["occurrence"]) for r in report_json("timers", trace)["links"]]
    assert links == [(r["name"], r["occurrence"]) for r in report_json("timers", alone)["links"]]
    assert report_json("report", trace)["summary"]["peak_used_bytes"] > 0


def test_a_run_that_records_nothing_says_so(tmp_path, trace, capfd):
    t = trainer(tmp_path, [PoolsightCallback(track=False)])
    with poolsight.record(trace):
        t.train()
    err = capfd.readouterr().err
    assert "this run recorded no allocation (track=False" in err, err
    assert [r["epoch"] for r in report_json("epochs", trace)["epochs"]] == [0, 1]


def test_no_recording_open_is_said_once_and_never_raises(tmp_path, capfd):
    poolsight._warned.discard("poolsight.transformers.PoolsightCallback")
    t = trainer(tmp_path, [PoolsightCallback()])
    t.train()
    t.train()
    err = [line for line in capfd.readouterr().err.splitlines() if "poolsight" in line]
    assert len(err) == 1 and "no recording is open" in err[0], err


def test_wrong_arguments_raise_where_they_are_made():
    with pytest.raises(TypeError, match="track must be True or False"):
        PoolsightCallback(track="yes")
