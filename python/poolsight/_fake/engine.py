"""The one thing in PyTorch's autograd engine that stops a backward pass over fake CUDA tensors
on a machine without a GPU, and how ``fake_cuda`` gets past it.

What the engine does with CUDA tensors, read from ``torch/csrc/autograd/engine.cpp``:
``compute_dependencies`` sees nodes with a stream on the accelerator (their inputs' metadata
say ``cuda``) and calls ``GraphTask::stash_current_streams``, which, for every device index
the CUDA device guard counts, asks the CUDA hooks ``hasPrimaryContext(index)``, to sync the
caller's streams with the leaf streams when the backward ends. ``FakeTensorMode`` installs a
fake CUDA device guard (``torch._C._ensureCUDADeviceGuardSet``: 8 devices, fake streams,
events that do nothing), so everything else in the engine runs; but on PyTorch's CUDA build
the hooks are the real ones, whose ``hasPrimaryContext`` checks the index against the real
device count (0) and raises ``hasPrimaryContext expects a valid device index``.

So while ``fake_cuda`` is active, and only on a CUDA build with no GPU, the hooks object's
``hasPrimaryContext`` answers ``False`` (the true answer there: no device has a context):
the hooks object's virtual table is swapped for a copy whose one entry differs, and put back
when ``fake_cuda`` exits. Found through the shared library's symbol table (the vtable of
``at::cuda::detail::CUDAHooks`` and its ``hasPrimaryContext``), checked to match before
anything is written; where they are not found, ``fake_cuda`` says so and does not start.
Everything else is PyTorch's own engine: its order (a priority queue by sequence number),
its freeing of saved tensors, hooks, ``retain_graph``, ``create_graph``, reentrant backward.

``fake_cuda`` also runs backward with ``torch.autograd.set_multithreading_enabled(False)``:
the engine then runs every node on the calling thread, in the same order as a GPU's device
thread would (one device). Without it, a process that ran a backward before ``fake_cuda``
began (a test session) has started no device thread for CUDA and refuses a CUDA node.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
from typing import Any

import torch

_VTABLE = "_ZTVN2at4cuda6detail9CUDAHooksE"
_HAS_PRIMARY_CONTEXT = "_ZNK2at4cuda6detail9CUDAHooks17hasPrimaryContextEa"


class Unavailable(Exception):
    """The engine cannot be got past here; the message says why."""


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def needed() -> bool:
    """Whether the hooks must answer for fake devices: a CUDA build of PyTorch, no GPU."""
    if not torch.backends.cuda.is_built():
        return False
    try:
        return torch._C._cuda_getDeviceCount() == 0
    except Exception:  # noqa: BLE001 - no driver: no device
        return True


def _symbols(path: str, names: list[str]) -> dict[str, tuple[int, int]]:
    """``(value, size)`` of each of ``names`` in the ELF symbol table of ``path``."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        if m[:4] != b"\x7fELF" or m[4] != 2 or m[5] != 1:
            raise Unavailable(f"{path} is not a 64-bit little-endian ELF library")
        (shoff,) = struct.unpack_from("<Q", m, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", m, 0x3A)
        sections = [
            struct.unpack_from("<IIQQQQIIQQ", m, shoff + i * shentsize) for i in range(shnum)
        ]
        found: dict[str, tuple[int, int]] = {}
        for sec in sections:
            if sec[1] != 2 or sec[6] >= len(sections):  # SHT_SYMTAB, and its string table
                continue
            strtab = sections[sec[6]]
            stroff, strsize = strtab[4], strtab[5]
            wanted = {}
            for name in names:
                at = m.find(b"\0" + name.encode() + b"\0", stroff, stroff + strsize)
                if at >= 0:
                    wanted[at + 1 - stroff] = name
            off, size, entsize = sec[4], sec[5], sec[9] or 24
            for at in range(off, off + size, entsize):
                st_name, _, _, _, value, sym_size = struct.unpack_from("<IBBHQQ", m, at)
                name = wanted.get(st_name)
                if name is not None:
                    found[name] = (value, sym_size)
                    if len(found) == len(wanted):
                        break
        return found


class HooksPatch:
    """The CUDA hooks' ``hasPrimaryContext`` answering ``False`` while applied."""

    def __init__(self) -> None:
        lib = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
        try:
            get = ctypes.CDLL(lib)._ZN2at6detail12getCUDAHooksEv
        except (OSError, AttributeError) as e:
            raise Unavailable(f"at::detail::getCUDAHooks is not in {lib}: {e}") from None
        get.restype = ctypes.c_void_p
        self._object = get()
        self._vptr = ctypes.c_void_p.from_address(self._object).value
        libc = ctypes.CDLL(None)
        libc.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
        info = _DlInfo()
        if not libc.dladdr(self._vptr, ctypes.byref(info)) or not info.dli_fname:
            raise Unavailable("the CUDA hooks' virtual table is in no loaded library")
        path = info.dli_fname.decode()
        syms = _symbols(path, [_VTABLE, _HAS_PRIMARY_CONTEXT])
        if _VTABLE not in syms or _HAS_PRIMARY_CONTEXT not in syms:
            raise Unavailable(
                f"{os.path.basename(path)} has no symbol table naming the CUDA hooks "
                "(a stripped build of PyTorch)"
            )
        base = info.dli_fbase
        table, table_size = syms[_VTABLE]
        # The object's vptr points past the vtable's offset-to-top and type-info slots.
        if self._vptr != base + table + 16:
            raise Unavailable("the CUDA hooks object is not an at::cuda::detail::CUDAHooks")
        slots = table_size // 8
        entries = (ctypes.c_void_p * slots).from_address(self._vptr - 16)
        target = base + syms[_HAS_PRIMARY_CONTEXT][0]
        at = [i for i in range(slots) if entries[i] == target]
        if len(at) != 1:
            raise Unavailable("hasPrimaryContext is not in the CUDA hooks' virtual table")
        self._copy = (ctypes.c_void_p * slots)()
        ctypes.memmove(self._copy, self._vptr - 16, table_size)
        self._answer = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_int8)(
            lambda _self, _index: False
        )
        self._copy[at[0]] = ctypes.cast(self._answer, ctypes.c_void_p).value
        self._applied = 0

    def apply(self) -> None:
        if self._applied == 0:
            ctypes.c_void_p.from_address(self._object).value = ctypes.addressof(self._copy) + 16
        self._applied += 1

    def undo(self) -> None:
        self._applied -= 1
        if self._applied == 0:
            ctypes.c_void_p.from_address(self._object).value = self._vptr


_patch: Any = None


def patch() -> HooksPatch:
    """The process's one patch (made on first use; ``Unavailable`` says why it cannot be)."""
    global _patch
    if _patch is None:
        _patch = HooksPatch()
    return _patch
