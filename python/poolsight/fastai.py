"""fastai: epochs recorded as its ``PeakMemMetric`` sees them.

    learn = Learner(dls, model, cbs=[poolsight.fastai.PeakMemCallback()])

Each epoch becomes ``epoch_begin``/``epoch_end`` marks in the open recording, so
``poolsight epochs`` prints ``PeakMemMetric``'s columns (cpu used, peak, gpu used, peak, in MB,
with fastai's rules), the GPU figures exact from the pool's events instead of polled, the CPU
figures ``tracemalloc``'s as fastai takes them (with the recording's default ``cpu``). Each
``fit`` is its own table, as fastai prints one per fit: ``fine_tune`` (one epoch frozen, then
the epochs unfrozen) gives two.
"""

from __future__ import annotations

from fastai.callback.core import Callback

from . import Recording, _observed
from .torch import empty_cache, memory_stats

__all__ = ["PeakMemCallback"]


class PeakMemCallback(Callback):
    """Marks every epoch of a fastai ``Learner`` in a poolsight recording (``recorder``, or the
    one open with :func:`poolsight.record` when a fit starts); empties poolsight's cache at
    each epoch's beginning and end, as ``PeakMemMetric`` empties PyTorch's.

    It never raises into training: a fit with no recording open is not recorded (it says so
    once), and one after the recording finished counts as that recording's dropped events."""

    order = -10  # before metrics and the progress bar, as PeakMemMetric runs first

    def __init__(self, recorder: Recording | None = None, empty_cache: bool = True):
        self._recorder = recorder
        self._empty_cache = empty_cache
        self._rec: Recording | None = None

    def _empty(self) -> None:
        if self._empty_cache and memory_stats():
            empty_cache()

    def before_fit(self) -> None:
        self._rec = _observed(self._recorder, "poolsight.fastai.PeakMemCallback")

    def before_epoch(self) -> None:
        rec = self._rec
        if rec is None:
            return
        self._empty()
        if rec.open_epoch is not None:
            # The last epoch ended by an exception that fastai let through.
            rec.epoch_end(rec.open_epoch)
        rec.epoch_begin(int(self.epoch))

    def after_epoch(self) -> None:
        rec = self._rec
        if rec is None:
            return
        self._empty()
        rec.epoch_end(int(self.epoch))
