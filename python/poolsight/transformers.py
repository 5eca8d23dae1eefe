"""Hugging Face ``Trainer``: what :func:`poolsight.torch.track` and :func:`poolsight.torch.hook`
record, epochs as fastai's ``PeakMemMetric`` sees them, and each optimizer step as a scope.

    trainer = transformers.Trainer(..., callbacks=[poolsight.transformers.PoolsightCallback()])

While ``train`` runs, every tensor is recorded with its category and stack (the trainer's
optimizer is known from the start, though the ``Trainer`` makes it inside ``train``), every
module call is a link scope and every operator a function scope; each epoch becomes
``epoch_begin``/``epoch_end`` marks, so ``poolsight epochs`` prints fastai's columns, and each
training step a ``step`` scope (``poolsight timers`` counts and times them).
"""

from __future__ import annotations

import math
import sys
from typing import Any

import torch
from transformers import TrainerCallback

from . import Recording, Scope, _observed
from ._training import TrainingRun
from .torch import empty_cache, memory_stats

__all__ = ["PoolsightCallback"]

_WHO = "poolsight.transformers.PoolsightCallback"


def _optimizer(opt: Any) -> torch.optim.Optimizer | None:
    """The optimizer that steps: accelerate's ``AcceleratedOptimizer`` wraps it."""
    inner = getattr(opt, "optimizer", None)
    if isinstance(inner, torch.optim.Optimizer):
        return inner
    return opt if isinstance(opt, torch.optim.Optimizer) else None


class PoolsightCallback(TrainerCallback):
    """Records a ``Trainer.train()`` into a poolsight recording (``recorder``, or the one open
    with :func:`poolsight.record` when training begins).

    ``track`` (default True): :func:`poolsight.torch.track` on the model and the trainer's
    optimizer for the whole ``train``, so allocations carry their category and module;
    ``functions`` (default True): :func:`poolsight.torch.hook` with operator scopes; ``steps``
    (default True): each training step is a ``step`` scope. Either composes with a
    ``track()``/``hook()`` of your own: a module call is one scope. ``empty_cache`` (default
    True) returns poolsight's cached blocks to the device at each epoch's beginning and end
    when poolsight's pool is PyTorch's allocator, as fastai's ``PeakMemMetric`` empties
    PyTorch's cache.

    It never raises into training: a run with no recording open is not recorded (it says so
    once), one after the recording finished counts as that recording's dropped events, and a
    ``train`` that recorded no allocation says so when it ends. The ``Trainer`` tells callbacks
    nothing of an exception: when ``train`` raises, the tracking ends with the recording (or
    with the next ``train``).
    """

    def __init__(
        self,
        recorder: Recording | None = None,
        empty_cache: bool = True,
        track: bool = True,
        functions: bool = True,
        steps: bool = True,
    ):
        super().__init__()
        for name, value in (
            ("empty_cache", empty_cache),
            ("track", track),
            ("functions", functions),
            ("steps", steps),
        ):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be True or False, not {value!r}")
        self._recorder = recorder
        self._empty_cache = empty_cache
        self._steps = steps
        self._rec: Recording | None = None
        self._run = TrainingRun(
            "PoolsightCallback", "this run", "its epochs and steps are", track, functions
        )
        self._epoch: int | None = None
        self._step: Scope | None = None

    def _empty(self, args: Any) -> None:
        if not self._empty_cache:
            return
        device = getattr(args, "device", None)
        if device is not None and device.type == "cuda" and memory_stats(device):
            empty_cache(device)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._stop()  # a train() that raised left its tracking open
        self._rec = rec = _observed(self._recorder, _WHO)
        self._epoch = None
        model = kwargs.get("model")
        if not isinstance(model, torch.nn.Module):
            model = None
        self._run.start(rec, model, _optimizer(kwargs.get("optimizer")))

    def _stop(self) -> None:
        self._end_step()
        rec = self._rec
        if rec is not None and not rec.closed and rec.open_epoch is not None:
            rec.epoch_end(rec.open_epoch)
        self._run.stop()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._stop()

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        rec = self._rec
        if rec is None:
            return
        self._empty(args)
        if rec.open_epoch is not None and not rec.closed:
            rec.epoch_end(rec.open_epoch)
        # The Trainer's epoch is a float (2.5: half-way through the third); one begins whole.
        self._epoch = int(math.floor((state.epoch or 0) + 1e-6))
        rec.epoch_begin(self._epoch)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        rec = self._rec
        if rec is None or self._epoch is None:
            return
        self._end_step()
        self._empty(args)
        if rec.open_epoch == self._epoch or rec.closed:
            rec.epoch_end(self._epoch)
        self._epoch = None

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        rec = self._rec
        if rec is None or not self._steps or not self._run.active:
            return
        self._end_step()
        step = rec.scope("step")
        step.__enter__()
        self._step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._end_step()

    def _end_step(self) -> None:
        step, self._step = self._step, None
        if step is not None:
            try:
                step.__exit__(None, None, None)
            except Exception as e:  # never into training
                print(f"poolsight: PoolsightCallback: {e}", file=sys.stderr)
