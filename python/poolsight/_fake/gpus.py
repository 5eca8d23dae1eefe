"""The GPUs a fake CUDA run can be predicted for (docs/predict.md has the same table).

Each entry says what ``torch.cuda.get_device_properties(0)`` reports on that GPU (its name,
``total_memory``, compute capability, SM count) and how much of its memory the CUDA context
takes outside PyTorch's caching allocator. The usable capacity, what the allocator may hold
before it runs out of memory, is ``total_memory - context``.

The context's size is an estimate: the memory ``torch.cuda.mem_get_info()`` shows taken right
after PyTorch initialised CUDA on that kind of GPU with lazy module loading (the default since
CUDA 11.7), before any tensor. It grows with the kernels a run loads (cuDNN, NCCL, Triton), so
it is a floor; ``context_bytes=`` (``--context-bytes``) gives your own figure.
"""

from __future__ import annotations

import dataclasses
import re

MiB = 1 << 20


@dataclasses.dataclass(frozen=True)
class Gpu:
    """One GPU: what PyTorch reports of it, and the CUDA context's estimated bytes."""

    #: The name ``--gpu`` takes (``H100-80GB``).
    key: str
    #: ``torch.cuda.get_device_properties(0).name`` on it.
    model: str
    #: ``total_memory``, bytes.
    total_memory: int
    major: int
    minor: int
    multi_processor_count: int
    #: Bytes the CUDA context takes outside the caching allocator.
    context_bytes: int

    @property
    def capacity(self) -> int:
        """The bytes the caching allocator may hold."""
        return max(self.total_memory - self.context_bytes, 0)

    @property
    def compute_capability(self) -> int:
        return self.major * 10 + self.minor


def _gpu(key, model, total_mib, cc, sms, context_mib) -> Gpu:
    return Gpu(key, model, total_mib * MiB, cc[0], cc[1], sms, context_mib * MiB)


#: The table, by ``key``. ``total_memory`` (MiB) is what CUDA reports of each board
#: (``cudaDeviceProp.totalGlobalMem``, the "total capacity" of PyTorch's out-of-memory
#: message), a little below nvidia-smi's total; it moves by a few MiB between drivers.
GPUS: dict[str, Gpu] = {
    g.key: g
    for g in (
        _gpu("B200", "NVIDIA B200", 182630, (10, 0), 148, 640),
        _gpu("H200", "NVIDIA H200", 143165, (9, 0), 132, 560),
        _gpu("H100-80GB", "NVIDIA H100 80GB HBM3", 81008, (9, 0), 132, 530),
        _gpu("H100-PCIE", "NVIDIA H100 PCIe", 81008, (9, 0), 114, 530),
        _gpu("A100-80GB", "NVIDIA A100-SXM4-80GB", 81152, (8, 0), 108, 420),
        _gpu("A100-40GB", "NVIDIA A100-SXM4-40GB", 40441, (8, 0), 108, 420),
        _gpu(
            "RTX-PRO-6000",
            "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
            97249,
            (12, 0),
            188,
            500,
        ),
        _gpu("L40S", "NVIDIA L40S", 45596, (8, 9), 142, 450),
        _gpu("A6000", "NVIDIA RTX A6000", 48681, (8, 6), 84, 400),
        _gpu("L4", "NVIDIA L4", 22692, (8, 9), 58, 380),
        _gpu("A10G", "NVIDIA A10G", 22723, (8, 6), 80, 380),
        _gpu("RTX-4090", "NVIDIA GeForce RTX 4090", 24207, (8, 9), 128, 400),
        _gpu("RTX-3090", "NVIDIA GeForce RTX 3090", 24259, (8, 6), 82, 380),
        _gpu("V100-32GB", "Tesla V100-SXM2-32GB", 32511, (7, 0), 80, 330),
        _gpu("V100-16GB", "Tesla V100-SXM2-16GB", 16149, (7, 0), 80, 330),
        _gpu("T4", "Tesla T4", 15110, (7, 5), 40, 300),
    )
}

#: What ``gpu=None`` predicts for.
DEFAULT = "H100-80GB"


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def table() -> str:
    """The table as text, one GPU a line (what an unknown ``--gpu`` lists)."""
    lines = [f"{'GPU':<12} {'memory':>10} {'usable':>10}  {'arch':<6}  model"]
    for g in GPUS.values():
        lines.append(
            f"{g.key:<12} {g.total_memory / 2**30:>6.2f} GiB {g.capacity / 2**30:>6.2f} GiB  "
            f"{'sm_' + str(g.major) + str(g.minor):<6}  {g.model}"
        )
    return "\n".join(lines)


def lookup(name: str) -> Gpu:
    """The GPU called ``name`` (``H100-80GB``; case, dashes and spaces do not matter, and a
    model name such as ``NVIDIA A100-SXM4-40GB`` is found too). ``ValueError`` listing the
    table for a name it does not know."""
    if not isinstance(name, str):
        raise TypeError(f"gpu is a name from poolsight's GPU table, not {name!r}")
    want = _norm(name)
    for g in GPUS.values():
        if want in (_norm(g.key), _norm(g.model)):
            return g
    raise ValueError(f"unknown GPU {name!r}; the GPUs poolsight knows:\n{table()}")


def custom(capacity: int, like: Gpu) -> Gpu:
    """A GPU of ``capacity`` usable bytes, otherwise ``like`` (its architecture and SMs)."""
    return dataclasses.replace(
        like,
        key="custom",
        model=like.model,
        total_memory=capacity + like.context_bytes,
    )
