"""poolsight's native observer for :func:`poolsight.torch.track` and :func:`poolsight.torch.hook`:
``observer.cpp``, compiled against the installed PyTorch the first time it is needed and cached.

The library is built with the C++ compiler named by ``CXX``, else the first of ``c++``,
``g++``, ``clang++`` on ``PATH``, into ``$XDG_CACHE_HOME/poolsight`` (``~/.cache/poolsight``
when ``XDG_CACHE_HOME`` is unset), under a name made of the PyTorch version, the Python ABI and
a digest of the source and the build's flags: a new PyTorch, another Python or a changed source
builds anew, and every other run loads what is there. :func:`load` says why it cannot (no
compiler, a failed build, a library that does not load) with :class:`Unavailable`.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "observer.cpp")

#: The table layout ``observer.cpp`` reads (``TABLE_VERSION`` in ``torch_track/native.rs``).
TABLE_VERSION = 4


class Unavailable(Exception):
    """The native observer cannot be had here; the message says why, in one line."""


def cache_dir() -> str:
    """Where built observers are kept."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "poolsight")


def python_abi() -> str:
    """The running Python's ABI (``cpython-311-x86_64-linux-gnu``)."""
    return sysconfig.get_config_var("SOABI") or sys.implementation.cache_tag or "python"


def compiler() -> str:
    """The C++ compiler to build with: ``CXX`` (which must exist), else one on ``PATH``."""
    named = os.environ.get("CXX")
    if named:
        found = shutil.which(named)
        if found is None:
            raise Unavailable(f"CXX={named} names no compiler")
        return found
    for name in ("c++", "g++", "clang++"):
        found = shutil.which(name)
        if found is not None:
            return found
    raise Unavailable("no C++ compiler found (set CXX, or install g++ or clang++)")


def _torch_paths() -> tuple[str, list[str], str]:
    import torch

    root = os.path.dirname(torch.__file__)
    include = os.path.join(root, "include")
    return (
        root,
        [include, os.path.join(include, "torch", "csrc", "api", "include")],
        (os.path.join(root, "lib")),
    )


def build_command(cxx: str, source: str, out: str) -> list[str]:
    """The command that builds ``source`` into the shared library ``out``."""
    import torch

    _root, includes, lib = _torch_paths()
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    cmd = [cxx, "-O2", "-std=c++20", "-shared", "-fPIC", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]
    for inc in includes:
        cmd += ["-isystem", inc]
    cmd += [source, "-o", out, "-L", lib, "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{lib}"]
    return cmd


def cache_key(torch_version: str, abi: str, source: bytes) -> str:
    """The library's file name for a PyTorch version, a Python ABI and a source."""
    digest = hashlib.sha256(source + f"\0{TABLE_VERSION}".encode()).hexdigest()[:16]
    safe = re.sub(r"[^A-Za-z0-9.+_-]", "_", torch_version)
    return f"observer-torch{safe}-{abi}-{digest}.so"


def library_path() -> str:
    """Where the library for this PyTorch and Python is (or will be) cached."""
    import torch

    with open(SOURCE, "rb") as f:
        source = f.read()
    return os.path.join(cache_dir(), cache_key(torch.__version__, python_abi(), source))


def build(path: str) -> None:
    """Compiles ``observer.cpp`` into ``path`` (atomically: a half-written library is never
    there)."""
    import torch

    cxx = compiler()
    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise Unavailable(f"cannot create the cache folder {folder}: {e.strerror}") from None
    print(
        f"poolsight: building the native observer for torch {torch.__version__} "
        f"(once; cached in {folder})",
        file=sys.stderr,
    )
    fd, tmp = tempfile.mkstemp(prefix=".observer-", suffix=".so", dir=folder)
    os.close(fd)
    try:
        try:
            done = subprocess.run(
                build_command(cxx, SOURCE, tmp), capture_output=True, text=True, timeout=600
            )
        except (OSError, subprocess.SubprocessError) as e:
            raise Unavailable(f"the compiler {cxx} did not run: {e}") from None
        if done.returncode != 0:
            first = next(
                (ln for ln in done.stderr.splitlines() if "error" in ln),
                done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "no message",
            )
            raise Unavailable(f"building it with {cxx} failed: {first.strip()}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


_loaded: dict[str, ctypes.CDLL] = {}


def load() -> ctypes.CDLL:
    """The native observer for the installed PyTorch, built first if need be."""
    path = library_path()
    lib = _loaded.get(path)
    if lib is not None:
        return lib
    if not os.path.exists(path):
        build(path)
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise Unavailable(f"the built library {path} does not load: {e}") from None
    lib.poolsight_observer_version.restype = ctypes.c_uint32
    lib.poolsight_observer_install.argtypes = [ctypes.c_void_p]
    lib.poolsight_observer_install.restype = ctypes.c_int
    lib.poolsight_observer_remove.restype = None
    lib.poolsight_observer_enter.restype = ctypes.c_int
    lib.poolsight_observer_exit.restype = None
    lib.poolsight_observer_pause.restype = None
    lib.poolsight_observer_resume.restype = None
    if lib.poolsight_observer_version() != TABLE_VERSION:
        raise Unavailable(f"{path} was built from another version of poolsight")
    _loaded[path] = lib
    return lib
