"""PyTorch Lightning: what :func:`poolsight.torch.track` and :func:`poolsight.torch.hook`
record, and epochs as fastai's ``PeakMemMetric`` sees them.

    trainer = lightning.Trainer(callbacks=[poolsight.lightning.PoolsightCallback()])

While ``fit`` runs, every tensor is recorded with its category and stack (the trainer's
optimizers are known from the start, though Lightning makes them inside ``fit``), every module
call is a link scope and every operator a function scope; each training epoch becomes
``epoch_begin``/``epoch_end`` marks, so ``poolsight epochs`` prints fastai's columns.
"""

from __future__ import annotations

from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the older package name
    from pytorch_lightning.callbacks import Callback  # type: ignore[no-redef]

from . import Recording, _observed
from ._training import TrainingRun
from .torch import empty_cache, memory_stats

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
        self._rec: Recording | None = None
        self._run = TrainingRun("PoolsightCallback", "this fit", "its epochs are", track, functions)

    def _empty(self, trainer: Any) -> None:
        if not self._empty_cache:
            return
        device = getattr(trainer.strategy, "root_device", None)
        if device is not None and device.type == "cuda" and memory_stats(device):
            empty_cache(device)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._rec = rec = _observed(self._recorder, "poolsight.lightning.PoolsightCallback")
        self._run.start(rec, pl_module, list(getattr(trainer, "optimizers", None) or []))

    def _stop(self) -> None:
        self._run.stop()

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
