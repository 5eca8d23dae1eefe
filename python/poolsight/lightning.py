"""PyTorch Lightning: epochs recorded as fastai's ``PeakMemMetric`` sees them.

    trainer = lightning.Trainer(callbacks=[poolsight.lightning.PoolsightCallback()])

Each training epoch becomes ``epoch_begin``/``epoch_end`` marks in the open recording (or the
one given), so ``poolsight epochs`` prints fastai's columns: CPU and GPU used and peak per
epoch, the GPU figures exact from the pool's events.
"""

from __future__ import annotations

from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the older package name
    from pytorch_lightning.callbacks import Callback  # type: ignore[no-redef]

from . import Recording, _observed
from .torch import empty_cache, memory_stats

__all__ = ["PoolsightCallback"]


class PoolsightCallback(Callback):
    """Marks every training epoch in a poolsight recording (``recorder``, or the one open with
    :func:`poolsight.record` when training starts).

    ``empty_cache`` (default True) returns poolsight's cached blocks to the device at each
    epoch's beginning and end when poolsight's pool is PyTorch's allocator, as fastai's
    ``PeakMemMetric`` empties PyTorch's cache, so the epoch's figures start from what is live.

    It never raises into training: a run with no recording open is not recorded (it says so
    once), and one after the recording finished counts as that recording's dropped events.
    """

    def __init__(self, recorder: Recording | None = None, empty_cache: bool = True):
        super().__init__()
        self._recorder = recorder
        self._empty_cache = empty_cache
        self._rec: Recording | None = None

    def _empty(self, trainer: Any) -> None:
        if not self._empty_cache:
            return
        device = getattr(trainer.strategy, "root_device", None)
        if device is not None and device.type == "cuda" and memory_stats(device):
            empty_cache(device)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._rec = _observed(self._recorder, "poolsight.lightning.PoolsightCallback")

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
