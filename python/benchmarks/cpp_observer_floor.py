"""The floor of a per-operator observer written in C++, beside the Python mode's and poolsight's.

poolsight's ``track()`` and ``hook()`` see every ATen operator through a Python
``TorchDispatchMode``, whose own cost (PyTorch handing each operator to Python) is 5–11 % of a
CPU training step on the development machine. This measures what an observer fed by PyTorch's
C++ ``RecordFunction`` callbacks costs instead: a global callback that stamps each operator's
start and end with the CPU's time-stamp counter and looks at each output tensor's storage (the
work a recorder's operator scopes and new-storage check need, without writing anything). It is
compiled here against the installed PyTorch (``g++``, C++20, its headers and
``libc10``/``libtorch_cpu``), loaded with ``ctypes``, and timed on ``torch_overhead.py``'s model
and epoch beside the plain epoch, an empty Python mode and ``track()`` + ``hook()``, in a fresh
order each repeat. ``C++ dispatch key`` is the same work fed another way: a boxed fallback
kernel on a dispatch key below autograd (PyTorch's ``Fake``, which nothing else uses in these
runs), included in the training thread's dispatch keys while it runs, so that each operator a
dispatch mode would see passes through it once and nothing else does (not the operators its
kernel calls, nor the autograd engine's named records, which a ``RecordFunction`` callback of
operator scope makes PyTorch build):

    python python/benchmarks/cpp_observer_floor.py [--repeats 7] [--steps 16] [--seed S]

It is a measurement for planning (issue 26's 1.15x), not a part of poolsight: it records no
trace and sees no frees. Nothing is asserted; without ``g++`` it says so and exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_overhead import epoch, make, orders, positive, variants  # noqa: E402

SOURCE = r"""
#include <ATen/record_function.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <optional>
#include <ATen/core/Tensor.h>
#include <atomic>
#include <unordered_set>
#include <vector>
#include <x86intrin.h>

namespace {
struct Span { const char* name; uint64_t start, end; };
thread_local std::vector<Span> spans;
thread_local std::vector<uint64_t> starts;
std::unordered_set<const void*> storages;
std::atomic<uint64_t> operators{0}, new_storages{0};
at::CallbackHandle handle = 0;

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction&) {
  starts.push_back(__rdtsc());
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  uint64_t end = __rdtsc();
  uint64_t start = end;
  if (!starts.empty()) { start = starts.back(); starts.pop_back(); }
  spans.push_back({fn.name(), start, end});
  operators++;
  for (const auto& v : fn.outputs()) {
    if (!v.isTensor()) continue;
    const auto& t = v.toTensor();
    if (t.defined() && t.has_storage() &&
        storages.insert(t.storage().unsafeGetStorageImpl()).second) {
      new_storages++;
    }
  }
}

// The same work fed by a boxed fallback kernel on a dispatch key below autograd instead: the
// key is included in the training thread's dispatch keys (PyTorch hands them to autograd's
// work with the rest of the thread's state), so every operator a dispatch mode would see
// passes through `on_operator` once, boxed; the operators its kernel calls do not (the key is
// excluded while it runs), nor does anything else PyTorch wraps in a RecordFunction.
constexpr auto kKey = c10::DispatchKey::Fake;
std::optional<c10::RegistrationHandleRAII> fallback;
std::unordered_set<const void*> key_storages;
std::atomic<uint64_t> key_operators{0}, key_new_storages{0};

void on_operator(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                 torch::jit::Stack* stack) {
  const uint64_t start = __rdtsc();
  {
    c10::impl::ExcludeDispatchKeyGuard guard(kKey);
    op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kKey), stack);
  }
  spans.push_back({op.schema().name().c_str(), start, __rdtsc()});
  key_operators++;
  for (const auto& v : *stack) {
    if (!v.isTensor()) continue;
    const auto& t = v.toTensor();
    if (t.defined() && t.has_storage() &&
        key_storages.insert(t.storage().unsafeGetStorageImpl()).second) {
      key_new_storages++;
    }
  }
}
}  // namespace

extern "C" void key_observer_install() {
  if (!fallback) {
    fallback.emplace(c10::Dispatcher::singleton().registerFallback(
        kKey, c10::KernelFunction::makeFromBoxedFunction<&on_operator>(), "cpp_observer_floor"));
  }
  c10::impl::tls_set_dispatch_key_included(kKey, true);
}
extern "C" void key_observer_remove() { c10::impl::tls_set_dispatch_key_included(kKey, false); }
extern "C" uint64_t key_observer_operators() { return key_operators.load(); }
extern "C" uint64_t key_observer_new_storages() { return key_new_storages.load(); }

extern "C" void observer_install() {
  handle = at::addGlobalCallback(
      at::RecordFunctionCallback(on_start, on_end)
          .needsOutputs(true)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
}
extern "C" void observer_remove() { at::removeCallback(handle); handle = 0; }
extern "C" uint64_t observer_operators() { return operators.load(); }
extern "C" uint64_t observer_new_storages() { return new_storages.load(); }
"""


def build(folder: str) -> ctypes.CDLL | None:
    """The observer compiled against the installed PyTorch, or None (the reason printed)."""
    cxx = shutil.which("g++")
    if cxx is None:
        print("no g++ on PATH: the C++ observer cannot be built here")
        return None
    root = os.path.dirname(torch.__file__)
    src, lib = os.path.join(folder, "observer.cpp"), os.path.join(folder, "observer.so")
    with open(src, "w") as f:
        f.write(SOURCE)
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    cmd = [
        cxx, "-O2", "-std=c++20", "-shared", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        "-I", os.path.join(root, "include"), src, "-o", lib,
        "-L", os.path.join(root, "lib"), "-lc10", "-ltorch_cpu",
        f"-Wl,-rpath,{os.path.join(root, 'lib')}",
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        print("the C++ observer did not compile:\n" + done.stderr[-2000:])
        return None
    observer = ctypes.CDLL(lib)
    observer.observer_operators.restype = ctypes.c_uint64
    observer.observer_new_storages.restype = ctypes.c_uint64
    observer.key_observer_operators.restype = ctypes.c_uint64
    observer.key_observer_new_storages.restype = ctypes.c_uint64
    return observer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=positive, default=7)
    ap.add_argument("--steps", type=positive, default=16)
    ap.add_argument("--seed", type=int, default=0, help="draws each repeat's order (default 0)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        observer = build(tmp)
        if observer is None:
            return
        table = variants(tmp)

        @contextlib.contextmanager
        def cpp(model, optimizer):
            observer.observer_install()
            try:
                yield
            finally:
                observer.observer_remove()

        @contextlib.contextmanager
        def key(model, optimizer):
            observer.key_observer_install()
            try:
                yield
            finally:
                observer.key_observer_remove()

        table["C++ observer"] = cpp
        table["C++ dispatch key"] = key
        names = [
            "plain",
            "empty bound",
            "C++ observer",
            "C++ dispatch key",
            "track+hook (native)",
            "track+hook (python)",
        ]
        cpu: dict[str, list[float]] = {n: [] for n in names}
        for order in orders(names, args.repeats, args.seed):
            for n in order:
                model, optimizer, images, labels = make()
                epoch(model, optimizer, images, labels, 1)
                with table[n](model, optimizer):
                    c0 = time.process_time()
                    epoch(model, optimizer, images, labels, args.steps)
                    cpu[n].append(time.process_time() - c0)
        base = statistics.median(cpu["plain"])
        print(
            f"torch {torch.__version__}, one epoch of {args.steps} steps, medians of "
            f"{args.repeats} shuffled repeats (seed {args.seed}), 1 intra-op thread"
        )
        print(f"{'variant':<20} {'CPU s':>8} {'x plain':>8}")
        for n in names:
            c = statistics.median(cpu[n])
            print(f"{n:<20} {c:>8.3f} {c / base:>8.3f}")
        print(
            f"the C++ observer saw {observer.observer_operators():,} operator calls "
            f"(RecordFunction's: nested and autograd's own included) and "
            f"{observer.observer_new_storages():,} new storages"
        )
        print(
            f"the dispatch-key observer saw {observer.key_observer_operators():,} operator "
            f"calls (those a dispatch mode sees) and {observer.key_observer_new_storages():,} "
            "new storages"
        )


if __name__ == "__main__":
    main()
