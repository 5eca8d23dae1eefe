"""PyTorch Lightning: what :func:`poolsight.torch.track` and :func:`poolsight.torch.hook`
record, and epochs as fastai's ``PeakMemMetric`` sees them.

    trainer = lightning.Trainer(callbacks=[poolsight.lightning.PoolsightCallback()])

While ``fit`` runs, every tensor is recorded with its category and stack (the trainer's
optimizers are known from the start, though Lightning makes them inside ``fit``), every module
call is a link scope and every operator a function scope; each training epoch becomes
``epoch_begin``/``epoch_end`` marks, so ``poolsight epochs`` prints fastai's columns.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the older package name
    from pytorch_lightning.callbacks import Callback  # type: ignore[no-redef]

from . import Recording, _observed
from .torch import _hooked, _tracking, empty_cache, hook, memory_stats, track

__all__ = ["PoolsightCallback"]


class PoolsightCallback(Callback):
    """Records a ``fit`` into a poolsight recording (``recorder``, or the one open with
    :func:`poolsight.record` when training starts).

    ``track`` (default True): :func:`poolsight.torch.track` on the LightningModule and the
    trainer's optimizers for the whole ``fit``, so allocations carry their category and
    module; ``functions`` (default True): :func:`poolsight.torch.hook` with operator scopes.
    Either composes with a ``track()``/``hook()`` of your own: a module call is one scope.
    ``empty_cache`` (default True) returns poolsight's cached blocks to the device at each
    epoch's beginning and end when poolsight's pool is PyTorch's allocator, as fastai's
    ``PeakMemMetric`` empties PyTorch's cache, so the epoch's figures start from what is live.

    It never raises into training: a run with no recording open is not recorded (it says so
    once), one after the recording finished counts as that recording's dropped events, and a
    ``fit`` that recorded no allocation says so when it ends (with ``track=False`` and no
    poolsight pool, only the epochs are recorded).
    """

    def __init__(
        self,
        recorder: Recording | None = None,
        empty_cache: bool = True,
        track: bool = True,
        functions: bool = True,
    ):
        super().__init__()
        for name, value in (
            ("empty_cache", empty_cache),
            ("track", track),
            ("functions", functions),
        ):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be True or False, not {value!r}")
        self._recorder = recorder
        self._empty_cache = empty_cache
        self._track = track
        self._functions = functions
        self._rec: Recording | None = None
        self._stack: contextlib.ExitStack | None = None
        self._tracker: Any = None
        self._fitting = False
        self._yours = False

    def _empty(self, trainer: Any) -> None:
        if not self._empty_cache:
            return
        device = getattr(trainer.strategy, "root_device", None)
        if device is not None and device.type == "cuda" and memory_stats(device):
            empty_cache(device)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._rec = rec = _observed(self._recorder, "poolsight.lightning.PoolsightCallback")
        self._tracker = None
        self._fitting = rec is not None and not rec.closed
        # A track() of your own already records this recording's tensors: it is kept.
        self._yours = self._fitting and _tracking(rec)
        if not self._fitting:
            return
        stack = contextlib.ExitStack()
        try:
            if self._track and not self._yours:
                optimizers = list(getattr(trainer, "optimizers", None) or [])
                self._tracker = stack.enter_context(track(pl_module, optimizers, rec))
            # As a hook() of your own on the module, if there is one.
            if self._functions and not _hooked(rec, pl_module):
                stack.enter_context(hook(pl_module, rec))
        except Exception as e:  # never into training: say it, train unrecorded
            stack.close()
            self._tracker = None
            print(f"poolsight: PoolsightCallback: not tracking this fit: {e}", file=sys.stderr)
            return
        self._stack = stack

    def _stop(self) -> None:
        if not self._fitting:
            return
        self._fitting = False
        stack, self._stack = self._stack, None
        tracker, self._tracker = self._tracker, None
        try:
            if stack is not None:
                stack.close()
            pool = bool(memory_stats())
        except Exception:
            pool = False
        if self._yours or pool or (tracker is not None and tracker.recorded):
            return
        why = (
            "track=False and poolsight's pool is not PyTorch's allocator"
            if not self._track
            else "did training run in another process or thread?"
        )
        print(
            f"poolsight: PoolsightCallback: this fit recorded no allocation ({why}); "
            "only its epochs are in the trace",
            file=sys.stderr,
        )

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._stop()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._stop()

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._stop()

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        rec = self._rec
        if rec is None:
            return
        self._empty(trainer)
        if rec.open_epoch is not None:
            rec.epoch_end(rec.open_epoch)
        rec.epoch_begin(int(trainer.current_epoch))

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        rec = self._rec
        if rec is None:
            return
        self._empty(trainer)
        rec.epoch_end(int(trainer.current_epoch))
