"""fastai: epochs recorded as its ``PeakMemMetric`` sees them.

    learn = Learner(dls, model, cbs=[poolsight.fastai.PeakMemCallback()])

Each epoch becomes ``epoch_begin``/``epoch_end`` marks in the open recording, so
``poolsight epochs`` prints ``PeakMemMetric``'s columns (cpu used, peak, gpu used, peak, in MB,
with fastai's rules), the GPU figures exact from the pool's events instead of polled.
"""

from __future__ import annotations

from fastai.callback.core import Callback

from . import Recording, _recording
from .torch import empty_cache, memory_stats

__all__ = ["PeakMemCallback"]


class PeakMemCallback(Callback):
    """Marks every epoch of a fastai ``Learner`` in a poolsight recording; empties poolsight's
    cache at each epoch's beginning and end, as ``PeakMemMetric`` empties PyTorch's."""

    order = -10  # before metrics and the progress bar, as PeakMemMetric runs first

    def __init__(self, recorder: Recording | None = None, empty_cache: bool = True):
        self._recorder = recorder
        self._empty_cache = empty_cache

    def _empty(self) -> None:
        if self._empty_cache and memory_stats():
            empty_cache()

    def before_epoch(self) -> None:
        self._empty()
        _recording(self._recorder).epoch_begin(int(self.epoch))

    def after_epoch(self) -> None:
        self._empty()
        _recording(self._recorder).epoch_end(int(self.epoch))
