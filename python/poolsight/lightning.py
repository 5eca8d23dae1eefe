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

from . import Recording, _recording
from .torch import empty_cache, memory_stats

__all__ = ["PoolsightCallback"]


class PoolsightCallback(Callback):
    """Marks every training epoch in a poolsight recording.

    ``empty_cache`` (default True) returns poolsight's cached blocks to the device at each
    epoch's beginning and end when poolsight's pool is PyTorch's allocator, as fastai's
    ``PeakMemMetric`` empties PyTorch's cache, so the epoch's figures start from what is live.
    """

    def __init__(self, recorder: Recording | None = None, empty_cache: bool = True):
        super().__init__()
        self._recorder = recorder
        self._empty_cache = empty_cache

    def _empty(self, trainer: Any) -> None:
        if not self._empty_cache:
            return
        device = getattr(trainer.strategy, "root_device", None)
        if device is not None and device.type == "cuda" and memory_stats(device):
            empty_cache(device)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._empty(trainer)
        _recording(self._recorder).epoch_begin(int(trainer.current_epoch))

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._empty(trainer)
        _recording(self._recorder).epoch_end(int(trainer.current_epoch))
