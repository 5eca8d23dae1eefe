"""poolsight: record what a training run does with memory and time, analyze it later.

Recording happens in the Rust core (``poolsight._native``): events go into a memory-mapped
trace file from per-thread buffers, so a crash or a kill loses nothing that was recorded.
Analysis is the ``poolsight`` command this package installs (``poolsight report run.pstrace``),
the same program as the Rust CLI.

    import poolsight

    with poolsight.record("run.pstrace") as rec:
        with rec.epoch(1):
            with rec.link("MLP"):
                ...
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import tracemalloc
from collections.abc import Iterator
from typing import Any, Callable

from . import _native
from ._native import Pool, PoolsightError

__all__ = [
    "Pool",
    "PoolsightError",
    "Recording",
    "Scope",
    "active",
    "main",
    "pack",
    "record",
    "whatif",
]

__version__ = _native.__version__

# The trace format's numbers for these (poolsight_schema::kinds, exported by the native module).
_KINDS = {"function": _native.FUNCTION, "link": _native.LINK, "scope": _native.SCOPE}
_PHASES = {
    None: _native.NONE,
    "none": _native.NONE,
    "forward": _native.FORWARD,
    "backward": _native.BACKWARD,
}
_STACKS = ("scopes", "python")

_active: list[Recording] = []


def active() -> Recording | None:
    """The innermost recording opened with :func:`record` that is still open, else ``None``.

    Framework integrations (``poolsight.torch``, ``poolsight.cupy``, ``poolsight.chainer``)
    record into it when no recording is passed to them.
    """
    return _active[-1] if _active else None


def _recording(rec: Recording | None) -> Recording:
    """``rec``, else the active recording; an integration's clear error when there is none or
    it is finished."""
    rec = rec if rec is not None else active()
    if rec is None:
        raise PoolsightError(
            "no recording is open: pass one, or call this inside `with poolsight.record(path):`"
        )
    if rec.closed:
        raise PoolsightError(f"the recording of {rec.path} is finished")
    return rec


_warned: set[str] = set()


def _observed(rec: Recording | None, who: str) -> Recording | None:
    """For an integration that observes training (a callback): ``rec``, else the active
    recording; ``None``, said once per integration, when there is none. Never raises: a
    finished recording is returned, and what is recorded into it is dropped and counted."""
    rec = rec if rec is not None else active()
    if rec is None and who not in _warned:
        _warned.add(who)
        print(
            f"poolsight: {who}: no recording is open, so this run is not recorded "
            "(open one with `with poolsight.record(path):`, or pass it)",
            file=sys.stderr,
        )
    return rec


def _phase(phase: str | None) -> int:
    try:
        return _PHASES[phase.lower() if isinstance(phase, str) else phase]
    except (KeyError, AttributeError):
        raise ValueError(f"phase must be 'forward', 'backward' or None, not {phase!r}") from None


def _caller_site(depth: int) -> tuple[str, int]:
    frame = sys._getframe(depth + 1)
    return frame.f_code.co_filename, frame.f_lineno


class Scope:
    """A named region, usable as a context manager or as a decorator.

    As a context manager it is one scope; as a decorator every call of the function is one
    scope. Scopes nest per thread, as Chainer's hooks do: what is allocated inside a scope is
    attributed to it and to every scope around it. A block or call left by an exception is
    not a completed call: it makes no row, occurrence or time of its own (its allocations
    count for the scopes around it), as Chainer's hooks never see a raising call return.
    """

    __slots__ = ("_guard", "_rec", "_kind", "_name", "_phase", "_file", "_line")

    def __init__(self, rec: Recording, kind: int, name: str, phase: int, file: str, line: int):
        self._rec = rec
        self._kind = kind
        self._name = name
        self._phase = phase
        self._file = file
        self._line = line
        self._guard = rec._native.scope(kind, name, phase, file, line)

    def __enter__(self) -> Scope:
        self._guard.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._guard.__exit__(*exc)

    def __call__(self, fn: Callable) -> Callable:
        code = getattr(fn, "__code__", None)
        file = code.co_filename if code else self._file
        line = code.co_firstlineno if code else self._line
        guard = self._rec._native.scope(self._kind, self._name, self._phase, file, line)
        enter, exit_ = guard.enter, guard.exit

        @functools.wraps(fn)
        def scoped(*args: Any, **kwargs: Any) -> Any:
            token = enter()
            try:
                out = fn(*args, **kwargs)
            except BaseException:
                # A call that raised is not a call (no row, no time), as in Chainer's hooks.
                exit_(token, True)
                raise
            exit_(token)
            return out

        return scoped

    def __repr__(self) -> str:
        kind = {v: k for k, v in _KINDS.items()}[self._kind]
        return f"<poolsight {kind} scope {self._name!r}>"


class Recording:
    """An open trace file. Made by :func:`record`; closed by :meth:`finish` or the ``with``."""

    def __init__(
        self,
        native: _native.Recorder,
        stacks: str,
        max_depth: int,
        cpu: str,
        pack: str | None = None,
        pack_level: int | None = None,
    ):
        self._native = native
        # Absolute, so that `pack=True` at finish names the copy after a change of directory.
        self._live = os.path.abspath(native.path)
        self._pack = pack
        self._pack_level = pack_level
        self.stacks = stacks
        self.max_depth = max_depth
        self._cpu = cpu
        # What framework integrations share per recording (poolsight.torch): the modules'
        # link scopes, and the models hook() holds.
        # poolsight.torch's state for this recording (modules, dispatch mode, hooks).
        self._torch: Any = None
        self._open_epoch: int | None = None
        self._started_tracing = False

    # -- scopes -------------------------------------------------------------------------------

    def function(self, name: str, phase: str | None = "forward") -> Scope:
        """A function scope (a row of ``poolsight functions``), forward or backward."""
        return Scope(self, _KINDS["function"], str(name), _phase(phase), *_caller_site(1))

    def link(self, name: str) -> Scope:
        """A link scope (a row of ``poolsight timers --links``): by convention a class name."""
        return Scope(self, _KINDS["link"], str(name), _native.NONE, *_caller_site(1))

    def scope(self, name: str) -> Scope:
        """A user scope: any region worth a name in the reports (a step, an update)."""
        return Scope(self, _KINDS["scope"], str(name), _native.NONE, *_caller_site(1))

    # -- epochs and CPU memory ----------------------------------------------------------------

    def epoch_begin(self, n: int) -> None:
        """Marks the start of epoch ``n`` (prefer ``with rec.epoch(n):``). Epochs do not nest:
        beginning one while another is open raises :class:`PoolsightError`.

        With ``cpu="tracemalloc"`` (the default) the epoch's CPU figures are what
        ``tracemalloc`` counts from here on, as fastai's ``PeakMemMetric`` measures them: this
        starts ``tracemalloc`` unless it is already tracing (and :meth:`epoch_end` stops it
        again); a program that traces already gets the change of its traced bytes instead."""
        n = _epoch_number(n)
        if self.closed:
            self._native.epoch_begin(n, 0)  # dropped and counted, never raised
            return
        if self._open_epoch is not None:
            raise PoolsightError(
                f"epoch {self._open_epoch} is still open: end it before beginning epoch {n} "
                "(epochs do not nest)"
            )
        if self._cpu == "tracemalloc":
            self._started_tracing = not tracemalloc.is_tracing()
            if self._started_tracing:
                tracemalloc.start()
            tracemalloc.reset_peak()
            self._native.epoch_begin(n, tracemalloc.get_traced_memory()[0])
        else:
            self._native.epoch_begin(n)
        self._open_epoch = n

    def epoch_end(self, n: int) -> None:
        """Marks the end of epoch ``n``, the one open; ending another raises
        :class:`PoolsightError`."""
        n = _epoch_number(n)
        if self.closed:
            self._native.epoch_end(n, 0, 0)  # dropped and counted, never raised
            return
        if self._open_epoch != n:
            open_ = "none is" if self._open_epoch is None else f"epoch {self._open_epoch} is"
            raise PoolsightError(f"cannot end epoch {n}: {open_} open")
        self._open_epoch = None
        if self._cpu == "tracemalloc":
            current, peak = tracemalloc.get_traced_memory()
            if self._started_tracing and tracemalloc.is_tracing():
                tracemalloc.stop()
            self._native.epoch_end(n, current, max(current, peak))
        else:
            self._native.epoch_end(n)

    @property
    def open_epoch(self) -> int | None:
        """The epoch begun and not yet ended, else ``None``."""
        return self._open_epoch

    @contextlib.contextmanager
    def epoch(self, n: int) -> Iterator[None]:
        """``with rec.epoch(n):`` brackets one epoch: the ``epochs`` report gets a row for it."""
        self.epoch_begin(n)
        try:
            yield
        finally:
            if self._open_epoch == n or self.closed:
                self.epoch_end(n)

    def cpu_sample(self) -> None:
        """Records the current CPU memory (RSS, or tracemalloc's figure while it traces) as a
        sample; an RSS sample also raises the epoch's CPU peak, which the epoch marks alone only
        see at the boundaries."""
        if self._cpu == "tracemalloc":
            if tracemalloc.is_tracing():
                self._native.cpu_sample(tracemalloc.get_traced_memory()[0])
        else:
            self._native.cpu_sample()

    # -- allocation stacks --------------------------------------------------------------------

    def stack(self, skip: int = 0) -> int:
        """The stack id an allocation made here gets, at the recording's ``stacks`` level.

        ``skip`` leaves out that many innermost Python frames (an integration's own frames).
        """
        if self.stacks == "python":
            return self._native.python_stack(self.max_depth, skip + 1)
        return self._native.scopes_stack()

    # -- lifetime -----------------------------------------------------------------------------

    @property
    def path(self) -> str:
        return self._native.path

    @property
    def closed(self) -> bool:
        return self._native.closed

    @property
    def dropped_events(self) -> int:
        """Events that could not be recorded (disk full, size limit, after finish)."""
        return self._native.dropped_events

    def finish(self, pack: str | os.PathLike[str] | bool | None = None) -> dict:
        """Seals the trace file. Returns what was written: events, chunks, dropped_events,
        file_bytes, and forked: True in a process forked from the one that started the
        recording (a ``DataLoader`` worker), which records nothing into it and leaves the file
        to its parent (nothing written, nothing packed). Raises :class:`PoolsightError` if it
        was already finished.

        ``pack`` (default: what :func:`record` was given) also writes a packed copy of the
        sealed file (see :func:`pack`): a path, or ``True`` for the trace's name with
        ``.packed.pstrace``; the result then has ``packed_path`` and ``packed_bytes``. The
        live file is kept. If only packing fails, :class:`PoolsightError` says so and the live
        file is sealed and complete. A ``with`` block that raises finishes without packing.
        """
        target = self._pack if pack is None else _pack_target(self._live, pack)
        if self in _active:
            _active.remove(self)
        try:
            return self._native.finish(pack=target, level=self._pack_level)
        finally:
            if self._torch is not None and self.closed:
                # Tensors that outlive the recording (a model's parameters) no longer carry
                # weakrefs of poolsight's.
                self._torch.hot.release()

    def __enter__(self) -> Recording:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if not self.closed:
            # When the block raised, the live file is sealed but not packed: packing then
            # would delay the error, and a packing error would stand in its place.
            self.finish(pack=False if exc_type is not None else None)

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<poolsight.Recording {self.path!r} {state}>"


def _epoch_number(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0 or n > 0xFFFFFFFF:
        raise ValueError(f"an epoch number is an int in 0..2**32-1, not {n!r}")
    return n


def record(
    path: str | os.PathLike[str],
    *,
    mode: str = "grow",
    ring_slots: int = 1024,
    chunk_size: int = 64 << 10,
    max_bytes: int | None = None,
    stacks: str = "scopes",
    max_depth: int = 0,
    cpu: str | None = "tracemalloc",
    rank: int | None = None,
    world_size: int | None = None,
    pack: str | os.PathLike[str] | bool | None = None,
    pack_level: int | None = None,
    overwrite: bool = False,
) -> Recording:
    """Opens a trace file for recording; use it as ``with poolsight.record(path) as rec:``.

    One recording per file: a ``path`` that exists raises :class:`PoolsightError`, unless
    ``overwrite=True``, and then the new recording is a new file that replaces it (whoever
    reads the old one keeps reading it whole). A file another recording is writing, in this
    process or another, is always refused, with that process's id.

    - ``mode``: ``"grow"`` (lossless; the file grows) or ``"ring"`` (a flight recorder:
      ``ring_slots`` chunks of ``chunk_size`` bytes, the oldest overwritten).
    - ``stacks``: what an allocation's stack is: ``"scopes"`` (the open scopes; cheap) or
      ``"python"`` (its Python call stack as ``file:line:function`` frames, as CuPy's
      ``LineProfileHook`` shows them; ``max_depth`` > 0 keeps the outermost ``max_depth - 1``
      frames, as ``LineProfileHook(max_depth=N)`` does).
    - ``cpu``: the CPU memory recorded per epoch (fastai's ``cpu used``/``peak`` columns):
      ``"tracemalloc"`` (the default: what ``tracemalloc``, started at each epoch's begin,
      counts, as fastai's ``PeakMemMetric`` measures it; it slows Python's allocations while
      an epoch runs), ``"rss"`` (the process's resident set size at the epoch's edges and at
      each :meth:`Recording.cpu_sample`) or ``None``.
    - ``rank``/``world_size``: for multi-process jobs; ``poolsight`` merges ranks.
    - ``pack``: also write a packed copy when the recording finishes (a path, or ``True`` for
      ``run.packed.pstrace`` beside ``run.pstrace``), at zstd level ``pack_level`` (1..22;
      by default the level of ``poolsight pack`` and :func:`pack`).
      The live file is written and kept as always: it is what survives a crash.

    A path that cannot be created raises :class:`PoolsightError` here; any later failure
    (disk full) stops recording and is counted in ``dropped_events``, never raised into
    training.
    """
    if mode not in ("grow", "ring"):
        raise ValueError(f"mode must be 'grow' or 'ring', not {mode!r}")
    if stacks not in _STACKS:
        raise ValueError(f"stacks must be 'scopes' or 'python', not {stacks!r}")
    if cpu not in (None, "rss", "tracemalloc"):
        raise ValueError(f"cpu must be 'rss', 'tracemalloc' or None, not {cpu!r}")
    if not isinstance(max_depth, int) or isinstance(max_depth, bool) or max_depth < 0:
        raise ValueError(f"max_depth must be an int >= 0, not {max_depth!r}")
    if pack_level is not None:
        _check_level(pack_level)
    if not isinstance(overwrite, bool):
        raise TypeError(f"overwrite is True or False, not {overwrite!r}")
    target = None if pack is None else _pack_target(os.fspath(path), pack)
    native = _native.Recorder(
        os.fspath(path),
        mode=mode,
        ring_slots=ring_slots,
        chunk_size=chunk_size,
        max_bytes=max_bytes,
        rank=rank,
        world_size=world_size,
        cpu_source="none" if cpu is None else cpu,
        command_line=list(sys.argv),
        overwrite=overwrite,
    )
    rec = Recording(native, stacks, max_depth, cpu or "none", target, pack_level)
    _active.append(rec)
    return rec


def _check_level(level: Any) -> None:
    if isinstance(level, bool) or not isinstance(level, int) or not 1 <= level <= 22:
        raise ValueError(f"a zstd level is an int in 1..22, not {level!r}")


def _pack_target(trace: str, pack: Any) -> str | None:
    """Where ``pack`` (``record``'s or ``finish``'s argument) puts the packed copy of ``trace``."""
    if pack is False:
        return None
    if pack is True:
        stem = trace[: -len(".pstrace")] if trace.endswith(".pstrace") else trace
        return os.path.abspath(stem + ".packed.pstrace")
    if isinstance(pack, (str, os.PathLike)):
        return os.path.abspath(os.fspath(pack))
    raise TypeError(f"pack is a path, True or False, not {type(pack).__name__}")


def pack(
    trace: str | os.PathLike[str], output: str | os.PathLike[str], level: int | None = None
) -> dict:
    """Writes a packed copy of the trace file ``trace`` to ``output`` (``poolsight pack``, at
    its zstd level unless ``level`` says otherwise, 1..22): event chunks encoded as columns
    and zstd-compressed, typically 5-10x smaller; every
    ``poolsight`` command reads it as it reads the original. Returns events, bytes_in,
    bytes_out and the reader's warnings (chunks of a damaged input that were left out).
    Raises :class:`PoolsightError` for a file that cannot be read or written."""
    if level is not None:
        _check_level(level)
    return _native.pack(trace, output, level)


def whatif(
    *paths: str | os.PathLike[str],
    settings: list[str] | tuple[str, ...] | str = (),
    capacity: int | str | None = None,
    min_capacity: bool = False,
    check: bool = False,
    allocator: str = "pytorch",
    frames: str | None = None,
) -> dict | list:
    """What would fit: the runs in ``paths`` (traces, PyTorch snapshots) replayed through a model
    of PyTorch's caching allocator under their recorded settings and ``settings`` (each a
    ``PYTORCH_CUDA_ALLOC_CONF`` string; a few sensible ones when empty), or through CuPy's pool
    (``allocator="cupy"``), on ``capacity`` bytes (an int, or ``"16GiB"``; default: what the
    file says), their stacks as ``--frames`` says (``None``: each file's default). Returns what
    ``poolsight whatif --format json`` prints: one report's dict (``allocator``,
    ``capacity_bytes``, ``runs`` with ``reserved_peak_bytes``, ``fits``, ``first_failure``,
    ``min_capacity_bytes``...), a list of them for several files or devices, or with
    ``check=True`` ``{"checks": [...]}``. Raises :class:`ValueError` for a bad argument,
    :class:`PoolsightError` for a file that cannot be read."""
    if not paths:
        raise TypeError("whatif() needs at least one trace or snapshot path")
    if isinstance(settings, str):
        settings = [settings]
    if not all(isinstance(s, str) for s in settings):
        raise TypeError("settings are PYTORCH_CUDA_ALLOC_CONF strings")
    if isinstance(capacity, bool) or not isinstance(capacity, (int, str, type(None))):
        raise TypeError(f"capacity is bytes (an int) or a size like '16GiB', not {capacity!r}")
    cap = str(capacity) if capacity is not None else None
    return _native.whatif_found(
        [os.fspath(p) for p in paths],
        list(settings),
        cap,
        bool(min_capacity),
        bool(check),
        allocator,
        frames,
    )


def main(argv: list[str] | None = None) -> int:
    """Runs the ``poolsight`` command (the Rust CLI) with ``argv`` (default: ``sys.argv``)."""
    args = list(sys.argv if argv is None else ["poolsight", *argv])
    # `poolsight predict` runs its command with this interpreter, which has this package.
    os.environ.setdefault("POOLSIGHT_PYTHON", sys.executable)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        return _native.cli(args)
    except KeyboardInterrupt:
        # Ctrl-C reached the command (and `predict`'s child, which says so itself).
        return 130
