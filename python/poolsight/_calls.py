"""The scopes that framework hooks open for calls (a Chainer function or link, a PyTorch
module), and the one rule they share for a call that raised.

Frameworks call a pre hook before a call and a post hook after it, from the frame that makes
the call (``FunctionNode.apply``, ``Link.__call__``, ``Module._call_impl``). When the call
raises, the post hook never runs (Chainer), or runs from an ``except`` block (PyTorch's
``always_call`` hooks). Either way the call did not complete: its scope is closed as aborted
(``Recorder.abort``), so it is not a call of its function (no row, no occurrence, no time) and
nothing recorded afterwards nests under it.

Each open scope remembers the frame that made the call. A later hook on the same thread finds
the calls that are over without their post hook: those whose frame is no longer among the
caller's frames. The post hook of a call closes it by its frame, aborting any call still open
inside it. The frame is held while the call is open, as the call stack holds it anyway; a frame
left by an exception is let go at the next hook of its thread.
"""

from __future__ import annotations

import sys
import threading
from typing import Any


class OpenCalls(threading.local):
    """The calls one hook opened on this thread, innermost last: (frame, token)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, Any]] = []

    def settle(self, native: Any, frame: Any) -> None:
        """Closes as aborted the calls that ended without their post hook (a call made by
        ``frame`` is about to open)."""
        calls = self.calls
        if calls and not _is_caller(calls[-1][0], frame):
            self._abort_dead(native, frame)

    def enter(self, native: Any, frame: Any, *scope: Any) -> None:
        """Opens a scope for the call made by ``frame`` (``scope``: what :meth:`open` takes
        after the frame), after closing as aborted the calls that ended without their post
        hook."""
        self.settle(native, frame)
        self.open(native, frame, *scope)

    def open(
        self,
        native: Any,
        frame: Any,
        kind: int,
        name: str,
        phase: int,
        file: str,
        line: int,
        parent: int | None = None,
    ) -> None:
        """Opens a scope for the call made by ``frame``, under the open scopes or under the
        stack ``parent``: :meth:`enter` for a hook that has just settled the calls itself (to
        read them)."""
        if parent is None:
            token = native.enter(kind, name, phase, file, line)
        else:
            token = native.enter_under(parent, kind, name, phase, file, line)
        self.calls.append((frame, token))

    def exit(self, native: Any, frame: Any, raised: bool = False) -> None:
        """Closes the innermost call made by ``frame`` (as aborted when ``raised``); calls still
        open inside it raised without their post hook, and are aborted first."""
        calls = self.calls
        for i in range(len(calls) - 1, -1, -1):
            opener = calls[i][0]
            # PyTorch runs a module's hooks from an inner function of ``_call_impl``, but its
            # ``always_call`` hooks after an exception from ``_call_impl`` itself: the frame
            # that called the opener. Left open, the call would keep its frame, and with it
            # the tensors that frame held, alive until the next call settles it.
            if opener is frame or opener.f_back is frame:
                for _, token in reversed(calls[i + 1 :]):
                    native.abort(token)
                token = calls[i][1]
                del calls[i:]
                if raised:
                    native.abort(token)
                else:
                    native.exit(token)
                return

    def _abort_dead(self, native: Any, frame: Any) -> None:
        alive = set()
        f = frame
        while f is not None:
            alive.add(id(f))
            f = f.f_back
        calls = self.calls
        while calls and id(calls[-1][0]) not in alive:
            native.abort(calls.pop()[1])


def _is_caller(outer: Any, frame: Any) -> bool:
    """Whether ``outer`` is ``frame`` or one of its callers: the usual case, a call made
    inside an open one, a few frames down."""
    f = frame
    while f is not None:
        if f is outer:
            return True
        f = f.f_back
    return False


def raised_in(frame: Any) -> bool:
    """Whether ``frame`` is handling an exception that came out of the call it made: a post
    hook run from an ``except`` block of the caller (PyTorch's ``always_call`` hooks). The
    traceback of an exception being handled starts at the frame that caught it; one handled
    further out (the call made inside some caller's ``except`` block) does not."""
    tb = sys.exc_info()[2]
    return tb is not None and tb.tb_frame is frame
