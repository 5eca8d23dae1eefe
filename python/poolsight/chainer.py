"""Chainer integration: hooks that open poolsight scopes where Chainer's own hooks measure.

- :class:`FunctionHook` (a ``chainer.FunctionHook``): every function call, forward and
  backward, is a function scope named as Chainer's ``TimerHook`` and ``CupyMemoryProfileHook``
  name it (``LinearFunction``, ``ReLU``), with its phase.
- :class:`LinkHook` (a ``chainer.LinkHook``): every link's forward call is a link scope named
  by the link's class (``Linear``, ``Classifier``), as Chainer's link ``TimerHook`` names it.

    import poolsight, poolsight.chainer

    with poolsight.record("run.pstrace") as rec:
        with poolsight.chainer.FunctionHook(rec), poolsight.chainer.LinkHook(rec):
            trainer.run()

Then ``poolsight timers`` prints both of Chainer's ``TimerHook`` tables and, with CuPy memory
recorded (``poolsight.cupy.TraceHook``), ``poolsight functions`` prints
``CupyMemoryProfileHook``'s table.
"""

from __future__ import annotations

import sys

import chainer

from . import Recording, _native, _recording
from ._calls import OpenCalls

__all__ = ["FunctionHook", "LinkHook"]

_KIND_FUNCTION, _KIND_LINK = _native.FUNCTION, _native.LINK
_FORWARD, _BACKWARD = _native.FORWARD, _native.BACKWARD


class FunctionHook(chainer.FunctionHook):
    """``with FunctionHook(rec):`` records every Chainer function call as a function scope:
    forward calls with phase forward, backward calls with phase backward, named by the
    function's implementation class (``function._impl_name``, what Chainer's ``TimerHook`` and
    ``CupyMemoryProfileHook`` print). Scopes nest as the calls do. A call that raises is not a
    call, as in Chainer's hooks (whose post hook never runs): no row, no occurrence, no time,
    its memory counted in the calls around it, and nothing after it nested under it. Register
    it on one function with ``function.add_hook`` as any Chainer function hook."""

    name = "PoolsightFunctionHook"

    def __init__(self, recorder: Recording | None = None):
        rec = _recording(recorder)
        self.recording = rec
        self._native = rec._native
        self._calls = OpenCalls()

    def _enter(self, function, phase: int) -> None:
        # The caller of the pre hook: FunctionNode.apply, or the backward step.
        frame = sys._getframe(2)
        self._calls.enter(self._native, frame, _KIND_FUNCTION, function._impl_name, phase, "", 0)

    def forward_preprocess(self, function, in_data):
        self._enter(function, _FORWARD)

    def forward_postprocess(self, function, in_data):
        self._calls.exit(self._native, sys._getframe(1))

    def backward_preprocess(self, function, in_data, out_grad):
        self._enter(function, _BACKWARD)

    def backward_postprocess(self, function, in_data, out_grad):
        self._calls.exit(self._native, sys._getframe(1))


class LinkHook(chainer.LinkHook):
    """``with LinkHook(rec):`` records every link's forward call as a link scope named by the
    link's class name, as Chainer's link ``TimerHook`` names it (``Linear``, ``MLP``,
    ``Classifier``); a call that raises is not a call (see :class:`FunctionHook`). Register it
    on one link with ``link.add_hook`` as any Chainer link hook."""

    name = "PoolsightLinkHook"

    def __init__(self, recorder: Recording | None = None):
        rec = _recording(recorder)
        self.recording = rec
        self._native = rec._native
        self._calls = OpenCalls()
        self._sites: dict[type, tuple[str, int]] = {}

    def _site(self, cls: type) -> tuple[str, int]:
        site = self._sites.get(cls)
        if site is None:
            code = getattr(getattr(cls, "forward", None), "__code__", None)
            site = (code.co_filename, code.co_firstlineno) if code else ("", 0)
            self._sites[cls] = site
        return site

    def forward_preprocess(self, args):
        cls = type(args.link)
        file, line = self._site(cls)
        # The caller: Link.__call__.
        self._calls.enter(self._native, sys._getframe(1), _KIND_LINK, cls.__name__, 0, file, line)

    def forward_postprocess(self, args):
        self._calls.exit(self._native, sys._getframe(1))
