"""``torch.cuda`` while ``fake_cuda`` is active: the functions a training script, PyTorch and
its libraries call, answered for the GPU predicted for (its properties) and from the caching
allocator model that serves the fake tensors (the memory figures), with no call into CUDA.

Everything here is put in place by :class:`Patches` when ``fake_cuda`` begins and taken back
when it ends; what is not listed is PyTorch's own (``torch.cuda.amp``, ``torch.backends``).
"""

from __future__ import annotations

import contextlib
import itertools
import pickle
import threading
from collections.abc import Iterator
from typing import Any

import torch

MiB = 1 << 20


class DeviceProperties:
    """What ``torch.cuda.get_device_properties`` says of the GPU predicted for."""

    def __init__(self, gpu: Any):
        self.name = gpu.model
        self.major = gpu.major
        self.minor = gpu.minor
        self.total_memory = gpu.total_memory
        self.multi_processor_count = gpu.multi_processor_count
        self.is_integrated = 0
        self.is_multi_gpu_board = 0
        self.warp_size = 32
        self.max_threads_per_multi_processor = (
            2048 if gpu.major in (8, 9, 10) and gpu.minor == 0 else 1536
        )
        self.max_threads_per_block = 1024
        self.regs_per_multiprocessor = 65536
        self.shared_memory_per_block = 48 << 10
        self.shared_memory_per_block_optin = 227 << 10 if gpu.major >= 9 else 163 << 10
        self.shared_memory_per_multiprocessor = 228 << 10 if gpu.major >= 9 else 164 << 10
        self.L2_cache_size = 50 * MiB if gpu.major >= 9 else 40 * MiB
        self.uuid = "00000000-0000-0000-0000-000000000000"
        self.pci_bus_id = 0
        self.pci_device_id = 0
        self.pci_domain_id = 0
        self.gcnArchName = "NVIDIA"

    def __repr__(self) -> str:
        return (
            f"_CudaDeviceProperties(name='{self.name}', major={self.major}, "
            f"minor={self.minor}, total_memory={self.total_memory // MiB}MB, "
            f"multi_processor_count={self.multi_processor_count}, "
            f"uuid={self.uuid}, L2_cache_size={self.L2_cache_size // MiB}MB) "
            "(predicted by poolsight's fake_cuda)"
        )


class FakeStream:
    """A CUDA stream of the fake device: an id for the allocator's per-stream pools."""

    _ids = itertools.count(1)

    def __init__(self, device: Any = None, priority: int = 0, stream_id: int | None = None, **_):
        self.stream_id = next(FakeStream._ids) if stream_id is None else stream_id
        self.device = torch.device("cuda", 0)
        self.device_index = 0
        self.device_type = 1
        self.priority = priority
        self.cuda_stream = self.stream_id

    def wait_stream(self, stream: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> FakeEvent:
        event = event if event is not None else FakeEvent()
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def __enter__(self) -> FakeStream:
        _CURRENT.stack.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _CURRENT.stack.pop()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FakeStream) and other.stream_id == self.stream_id

    def __hash__(self) -> int:
        return hash(("fake-stream", self.stream_id))

    def __repr__(self) -> str:
        return f"<torch.cuda.Stream device=cuda:0 cuda_stream={self.stream_id:#x} (fake)>"


class FakeEvent:
    """A CUDA event of the fake device: no time passes on it."""

    def __init__(
        self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False
    ):
        self.enable_timing = enable_timing

    def record(self, stream: Any = None) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end_event: Any) -> float:
        return 0.0


_DEFAULT = FakeStream(stream_id=0)


class _Current(threading.local):
    def __init__(self) -> None:
        self.stack: list[FakeStream] = []


_CURRENT = _Current()


def current_stream(device: Any = None) -> FakeStream:
    return _CURRENT.stack[-1] if _CURRENT.stack else _DEFAULT


def current_stream_id() -> int:
    return _CURRENT.stack[-1].stream_id if _CURRENT.stack else 0


@contextlib.contextmanager
def stream(s: Any) -> Iterator[None]:
    if s is None:
        yield
        return
    if not isinstance(s, FakeStream):
        raise TypeError(f"fake_cuda: torch.cuda.stream() needs a torch.cuda.Stream, not {s!r}")
    with s:
        yield


def _index(device: Any) -> int:
    """The CUDA device index ``device`` names; the fake device is the only one."""
    if device is None:
        return 0
    if isinstance(device, int) and not isinstance(device, bool):
        index = device
    else:
        d = torch.device(device)
        if d.type != "cuda":
            raise ValueError(f"Expected a cuda device, but got: {d}")
        index = d.index if d.index is not None else 0
    if index != 0:
        raise ValueError(
            f"fake_cuda predicts one GPU (cuda:0); cuda:{index} does not exist "
            "(predict one process of a multi-GPU job)"
        )
    return 0


class Api:
    """The functions, bound to one fake run (its GPU and allocator model)."""

    def __init__(self, run: Any):
        self.run = run
        self.props = DeviceProperties(run.gpu)

    # -- the device ------------------------------------------------------------------------

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def current_device(self) -> int:
        return 0

    def set_device(self, device: Any) -> None:
        _index(device)

    def get_device_properties(self, device: Any = None) -> DeviceProperties:
        _index(device)
        return self.props

    def get_device_name(self, device: Any = None) -> str:
        return self.get_device_properties(device).name

    def get_device_capability(self, device: Any = None) -> tuple[int, int]:
        p = self.get_device_properties(device)
        return p.major, p.minor

    def get_arch_list(self) -> list[str]:
        return [f"sm_{self.props.major}{self.props.minor}"]

    def is_bf16_supported(self, including_emulation: bool = True) -> bool:
        return self.props.major >= 8 or including_emulation

    def is_initialized(self) -> bool:
        return True

    def init(self) -> None:
        pass

    def synchronize(self, device: Any = None) -> None:
        _index(device)

    def exchange_device(self, device: int) -> int:
        if device >= 0:
            _index(device)
        return 0

    # -- memory, from the allocator model ------------------------------------------------------

    def _stat(self, key: str, device: Any) -> int:
        _index(device)
        return int(self.run.memory.stats()[key])

    def memory_allocated(self, device: Any = None) -> int:
        return self._stat("allocated_bytes.all.current", device)

    def max_memory_allocated(self, device: Any = None) -> int:
        return self._stat("allocated_bytes.all.peak", device)

    def memory_reserved(self, device: Any = None) -> int:
        return self._stat("reserved_bytes.all.current", device)

    def max_memory_reserved(self, device: Any = None) -> int:
        return self._stat("reserved_bytes.all.peak", device)

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        _index(device)
        self.run.memory.reset_peaks()

    def empty_cache(self) -> None:
        self.run.memory.empty_cache()

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        _index(device)
        gpu = self.run.gpu
        reserved = self.memory_reserved()
        return max(gpu.total_memory - gpu.context_bytes - reserved, 0), gpu.total_memory

    def memory_stats(self, device: Any = None) -> dict[str, int]:
        _index(device)
        s = dict(self.run.memory.stats())
        for name in ("allocated_bytes", "reserved_bytes"):
            s.setdefault(f"{name}.all.allocated", s[f"{name}.all.peak"])
        return dict(sorted(s.items()))

    def memory_summary(self, device: Any = None, abbreviated: bool = False) -> str:
        s = self.memory_stats(device)
        return (
            f"poolsight fake_cuda: predicted memory on {self.run.gpu.model}\n"
            f"  allocated: {s['allocated_bytes.all.current'] / MiB:,.1f} MiB "
            f"(peak {s['allocated_bytes.all.peak'] / MiB:,.1f} MiB)\n"
            f"  reserved:  {s['reserved_bytes.all.current'] / MiB:,.1f} MiB "
            f"(peak {s['reserved_bytes.all.peak'] / MiB:,.1f} MiB)\n"
        )

    # -- the random number generators: nothing to seed ---------------------------------------

    def no_op(self, *args: Any, **kwargs: Any) -> None:
        return None

    def initial_seed(self) -> int:
        return torch.initial_seed()

    def get_rng_state(self, device: Any = "cuda") -> torch.Tensor:
        return torch.zeros(16, dtype=torch.uint8)

    def get_rng_state_all(self) -> list[torch.Tensor]:
        return [self.get_rng_state()]

    # -- memory history and snapshots --------------------------------------------------------------

    def record_memory_history(
        self,
        enabled: Any = "all",
        context: Any = "all",
        stacks: str = "all",
        max_entries: int = 2**31 - 1,
        **_: Any,
    ) -> None:
        if enabled is None or enabled is False:
            self.run.memory.record_history(None)
            self.run.history_stacks = False
            return
        self.run.memory.record_history(int(max_entries))
        self.run.history_stacks = stacks in ("all", "python", True) or context is not None

    def snapshot(self, device: Any = None) -> dict:
        return self.run.snapshot()

    def dump_snapshot(self, filename: str = "dump_snapshot.pickle") -> None:
        with open(filename, "wb") as f:
            pickle.dump(self.run.snapshot(), f)


def _pin_memory(self: torch.Tensor, device: Any = None) -> torch.Tensor:
    # No host memory is pinned for a fake device: the copy a DataLoader would make.
    return self if self.device.type == "cuda" else self.clone()


def _is_pinned(self: torch.Tensor, device: Any = None) -> bool:
    return False


def _never() -> bool:
    return False


class Patches:
    """Puts the fake ``torch.cuda`` in place, and takes it back."""

    def __init__(self, api: Api):
        a = api
        cuda = torch.cuda
        memory = torch.cuda.memory
        self._saved: list[tuple[Any, str, Any]] = []
        table: dict[Any, dict[str, Any]] = {
            cuda: {
                "is_available": a.is_available,
                "device_count": a.device_count,
                "current_device": a.current_device,
                "set_device": a.set_device,
                "get_device_properties": a.get_device_properties,
                "get_device_name": a.get_device_name,
                "get_device_capability": a.get_device_capability,
                "get_arch_list": a.get_arch_list,
                "is_bf16_supported": a.is_bf16_supported,
                "is_initialized": a.is_initialized,
                "init": a.init,
                "_lazy_init": a.init,
                "synchronize": a.synchronize,
                # No stream is ever captured into a CUDA graph (optimizers ask before a step).
                "is_current_stream_capturing": _never,
                "_exchange_device": a.exchange_device,
                "_maybe_exchange_device": a.exchange_device,
                "memory_allocated": a.memory_allocated,
                "max_memory_allocated": a.max_memory_allocated,
                "memory_reserved": a.memory_reserved,
                "max_memory_reserved": a.max_memory_reserved,
                "memory_cached": a.memory_reserved,
                "max_memory_cached": a.max_memory_reserved,
                "reset_peak_memory_stats": a.reset_peak_memory_stats,
                "reset_max_memory_allocated": a.reset_peak_memory_stats,
                "reset_max_memory_cached": a.reset_peak_memory_stats,
                "memory_stats": a.memory_stats,
                "memory_summary": a.memory_summary,
                "empty_cache": a.empty_cache,
                "mem_get_info": a.mem_get_info,
                "manual_seed": a.no_op,
                "manual_seed_all": a.no_op,
                "seed": a.no_op,
                "seed_all": a.no_op,
                "initial_seed": a.initial_seed,
                "get_rng_state": a.get_rng_state,
                "get_rng_state_all": a.get_rng_state_all,
                "set_rng_state": a.no_op,
                "set_rng_state_all": a.no_op,
                "current_stream": current_stream,
                "default_stream": lambda device=None: _DEFAULT,
                "stream": stream,
                "Stream": FakeStream,
                "Event": FakeEvent,
            },
            memory: {
                "memory_allocated": a.memory_allocated,
                "max_memory_allocated": a.max_memory_allocated,
                "memory_reserved": a.memory_reserved,
                "max_memory_reserved": a.max_memory_reserved,
                "reset_peak_memory_stats": a.reset_peak_memory_stats,
                "memory_stats": a.memory_stats,
                "memory_summary": a.memory_summary,
                "empty_cache": a.empty_cache,
                "mem_get_info": a.mem_get_info,
                "_record_memory_history": a.record_memory_history,
                "_snapshot": a.snapshot,
                "_dump_snapshot": a.dump_snapshot,
            },
            torch.cuda.random: {
                "manual_seed": a.no_op,
                "manual_seed_all": a.no_op,
                "seed": a.no_op,
                "seed_all": a.no_op,
            },
            torch.Tensor: {"pin_memory": _pin_memory, "is_pinned": _is_pinned},
        }
        accelerator = getattr(torch, "accelerator", None)
        if accelerator is not None:
            table[accelerator] = {
                "device_count": a.device_count,
                "is_available": a.is_available,
                "synchronize": a.synchronize,
                "current_device_index": a.current_device,
                "current_device_idx": a.current_device,
                "set_device_index": a.set_device,
                "set_device_idx": a.set_device,
            }
        self._table = table

    def apply(self) -> None:
        for owner, names in self._table.items():
            for name, value in names.items():
                if name not in vars(owner) and not hasattr(owner, name):
                    continue
                self._saved.append((owner, name, vars(owner).get(name, _MISSING)))
                setattr(owner, name, value)

    def undo(self) -> None:
        while self._saved:
            owner, name, old = self._saved.pop()
            if old is _MISSING:
                with contextlib.suppress(AttributeError):
                    delattr(owner, name)
            else:
                setattr(owner, name, old)


_MISSING = object()
