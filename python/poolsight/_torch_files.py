"""PyTorch's own memory files as poolsight traces, from Python.

- :func:`from_profile`: a ``torch.profiler`` run (``profile_memory=True``, CPU or CUDA) as a
  trace, with PyTorch's memory categories (parameter, gradient, activation, ...) as label
  frames, as :func:`poolsight.torch.track` writes them;
- :func:`record_history`: PyTorch's CUDA allocator history
  (``torch.cuda.memory._record_memory_history``) written as a trace when the block exits, and
  on an out-of-memory error;
- :func:`import_file`: a snapshot pickle or profiler JSON file already on disk.

Each converts through the one Rust implementation ``poolsight import`` runs
(``poolsight._native.import_file``); docs/pytorch-files.md gives the rules."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import tempfile
from collections.abc import Iterator
from typing import Any

from . import _native

__all__ = ["from_profile", "import_file", "record_history"]


def import_file(
    path: str | os.PathLike,
    out: str | os.PathLike,
    *,
    frames: str = "viewer",
    rank: int | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Converts a snapshot pickle or ``torch.profiler`` JSON file at ``path`` into a trace at
    ``out``, as ``poolsight import`` does; returns what was converted. A pickle is read
    without running anything in it; a bad file raises :class:`poolsight.PoolsightError`."""
    return _native.import_file(os.fspath(path), os.fspath(out), frames, rank, overwrite)


def _categories(prof: Any, base_ns: int) -> list[tuple[int, float, str]]:
    """(address, time in µs on the exported trace's clock, category) of each allocation
    PyTorch's memory profile classified, as ``_memory_viz._profile_to_snapshot`` derives
    them."""
    from torch.profiler._memory_profiler import Action, TensorKey

    profile = prof._memory_profile()
    out = []
    for t, action, (key, version), _size in profile.timeline:
        if not isinstance(key, TensorKey):
            continue
        if action in (Action.CREATE, Action.INCREMENT_VERSION):
            if action == Action.INCREMENT_VERSION:
                version += 1
            category = profile._categories.get(key, version)
            name = category.name.lower() if category is not None else "unknown"
            out.append((key.storage.ptr, (t - base_ns) / 1000.0, name))
    return out


def from_profile(
    prof: Any,
    path: str | os.PathLike,
    *,
    frames: str = "viewer",
    categories: bool = True,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Writes a finished ``torch.profiler.profile(profile_memory=True)`` run as a trace at
    ``path``: its memory events as allocations and frees, ATen operators as functions,
    modules as links, Python calls as scopes, ``ProfilerStep#N`` as epochs. With
    ``categories`` (and ``with_stack=True``, which PyTorch's memory profile needs), each
    allocation also carries PyTorch's memory category as its innermost frame (PyTorch's memory
    profile needs ``record_shapes=True`` too)."""
    with tempfile.TemporaryDirectory(prefix="poolsight-profile-") as tmp:
        trace_json = os.path.join(tmp, "profile.json")
        prof.export_chrome_trace(trace_json)
        cats: list[tuple[int, float, str]] = []
        if categories:
            with open(trace_json, "rb") as f:
                base_ns = int(json.load(f).get("baseTimeNanoseconds", 0))
            cats = _categories(prof, base_ns)
        return _native.import_file(trace_json, os.fspath(path), frames, None, overwrite, cats)


@contextlib.contextmanager
def record_history(
    path: str | os.PathLike,
    *,
    max_entries: int = 100_000,
    stacks: str = "python",
    frames: str = "viewer",
    overwrite: bool = False,
    device: Any = None,
) -> Iterator[None]:
    """Records PyTorch's CUDA caching-allocator history inside the block
    (``torch.cuda.memory._record_memory_history``, keeping the last ``max_entries`` entries)
    and writes it as a trace at ``path`` when the block exits — also when it raises, and on an
    out-of-memory error (through PyTorch's OOM observer), so the trace holds the moment of the
    OOM. Needs CUDA: without it, raises ``RuntimeError`` at once."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("record_history needs CUDA: torch.cuda.is_available() is False")
    out = os.fspath(path)
    written = False

    def write() -> None:
        nonlocal written
        snapshot = torch.cuda.memory._snapshot(device)
        with tempfile.TemporaryDirectory(prefix="poolsight-snapshot-") as tmp:
            pickled = os.path.join(tmp, "snapshot.pickle")
            with open(pickled, "wb") as f:
                pickle.dump(snapshot, f)
            _native.import_file(pickled, out, frames, None, overwrite or written)
        written = True

    active = True

    def on_oom(_device: int, _alloc: int, _device_alloc: int, _device_free: int) -> None:
        # PyTorch cannot detach an OOM observer: after the block, this one must do nothing
        # (an OOM later in the program would otherwise overwrite the trace).
        if active:
            write()

    torch.cuda.memory._record_memory_history("all", stacks=stacks, max_entries=max_entries)
    torch._C._cuda_attach_out_of_memory_observer(on_oom)
    try:
        yield
    finally:
        try:
            write()
        finally:
            active = False
            torch.cuda.memory._record_memory_history(None)
