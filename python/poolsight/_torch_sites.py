"""The user's line of a PyTorch call: which Python frames are the user's code and which a
library's, each code object judged once (``poolsight.torch``'s ``track()`` and ``hook()``; the
native path asks ``_Sites._judge`` for the same verdict)."""

from __future__ import annotations

import os
import sysconfig
from typing import Any

import torch


def _library_roots(library_dirs: list[str]) -> tuple[str, ...]:
    roots = set(library_dirs)
    paths = sysconfig.get_paths()
    for key in ("stdlib", "platstdlib"):
        if paths.get(key):
            roots.add(paths[key])
    roots.add(os.path.dirname(os.path.abspath(__file__)))  # poolsight itself
    return tuple(os.path.join(os.path.abspath(r), "") for r in roots if r)


_PACKAGE_DIRS = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")


def _short_path(file: str, cwd: str) -> str:
    """``file`` as a person reads it: relative to the working directory when under it, else
    from the package folder on (``torch/nn/modules/linear.py``), else as it is."""
    if file.startswith(cwd):
        return file[len(cwd) :]
    for marker in _PACKAGE_DIRS:
        i = file.rfind(marker)
        if i >= 0:
            return file[i + len(marker) :]
    return file


class _Sites:
    """The user's line of a call, as a frame under a stack: the innermost Python frame whose
    code is not a library's (see :data:`poolsight.torch.LIBRARY_DIRS`). Each code object is
    judged once."""

    def __init__(self, native: Any, library_dirs: list[str]):
        self._native = native
        self._roots = _library_roots(library_dirs)
        self._cwd = os.path.join(os.getcwd(), "")
        # code -> (short file, function) for the user's code, None for a library's.
        self._codes: dict[Any, tuple[str, str] | None] = {}
        self._stacks: dict[tuple[int, Any, int], int] = {}

    def _judge(self, code: Any) -> tuple[str, str] | None:
        file = code.co_filename
        library = (
            file.startswith(self._roots)
            or any(m in file for m in _PACKAGE_DIRS)
            or file.startswith("<frozen")
        )
        verdict = None if library else (_short_path(file, self._cwd), code.co_name)
        self._codes[code] = verdict
        return verdict

    def user_frame(self, frame: Any) -> Any:
        """The innermost frame from ``frame`` out whose code is the user's (None: none is)."""
        codes = self._codes
        while frame is not None:
            code = frame.f_code
            site = codes.get(code, False)
            if site is False:
                site = self._judge(code)
            if site is not None:
                return frame
            frame = frame.f_back
        return None

    def stack(self, parent: int, frame: Any, skip: Any = None) -> int:
        """``parent`` plus the user's line of the call made from ``frame`` (``parent`` alone
        when every frame is a library's, or when the user's frame is ``skip``)."""
        frame = self.user_frame(frame)
        if frame is None or frame is skip:
            return parent
        code = frame.f_code
        key = (parent, code, frame.f_lineno)
        stack = self._stacks.get(key)
        if stack is None:
            site = self._codes[code]
            stack = self._native.frame_under(parent, site[0], frame.f_lineno, site[1])
            self._stacks[key] = stack
        return stack

    def link_site(self, module: torch.nn.Module) -> tuple[str, int]:
        """Where ``module``'s class defines ``forward``: its link frame's file and line."""
        code = getattr(type(module).forward, "__code__", None)
        if code is None:
            return "", 0
        return _short_path(code.co_filename, self._cwd), code.co_firstlineno
