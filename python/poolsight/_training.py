"""What a framework's callback does around one training run (the Lightning and Hugging Face
callbacks share it): ``track()`` and ``hook()`` the model, keeping a ``track()`` or ``hook()``
of the user's own; at the end, close them and say when the run recorded no allocation."""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from . import Recording
from .torch import _hooked, _tracking, hook, memory_stats, track


class TrainingRun:
    """One training run's tracking. ``who`` names the callback, ``run`` the run (``this fit``)
    and ``kept`` what the trace holds without allocations, in their messages."""

    def __init__(self, who: str, run: str, kept: str, track: bool, functions: bool):
        self.who, self.run, self.kept = who, run, kept
        self.track, self.functions = track, functions
        self.active = False
        self._yours = False
        self._stack: contextlib.ExitStack | None = None
        self._tracker: Any = None

    def start(self, rec: Recording | None, model: Any, optimizers: Any) -> None:
        """Tracks and hooks `model` in `rec` (nothing when `rec` is closed or absent, or
        `model` is None); never raises into training."""
        self._tracker = None
        self.active = rec is not None and not rec.closed
        # A track() of your own already records this recording's tensors: it is kept.
        self._yours = self.active and _tracking(rec)
        if not self.active or model is None:
            return
        stack = contextlib.ExitStack()
        try:
            if self.track and not self._yours:
                self._tracker = stack.enter_context(track(model, optimizers, rec))
            # As a hook() of your own on the model, if there is one.
            if self.functions and not _hooked(rec, model):
                stack.enter_context(hook(model, rec))
        except Exception as e:  # never into training: say it, train unrecorded
            stack.close()
            self._tracker = None
            print(f"poolsight: {self.who}: not tracking {self.run}: {e}", file=sys.stderr)
            return
        self._stack = stack

    def stop(self) -> None:
        """Ends the tracking; says so once when the run recorded no allocation."""
        if not self.active:
            return
        self.active = False
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
            if not self.track
            else "did training run in another process or thread?"
        )
        print(
            f"poolsight: {self.who}: {self.run} recorded no allocation ({why}); "
            f"only {self.kept} in the trace",
            file=sys.stderr,
        )
