// poolsight's native observer for `poolsight.torch.track()` and `hook()`: PyTorch's own C++
// callbacks in place of a Python `TorchDispatchMode`. Compiled against the installed PyTorch on
// first use (see `__init__.py`), loaded with ctypes, and fed a table of functions by
// poolsight's native module, which writes the trace: no Python call per operator.
//
// - Operators: a `RecordFunction` callback on the threads that track (PyTorch carries
//   thread-local callbacks into autograd's worker threads). The operator a dispatch mode sees
//   is the outermost dispatcher operator that is not CompositeImplicitAutograd (those decompose
//   before PyTorch's Python key: `aten::linear` into `aten::t` and `aten::addmm`); operators
//   called inside it are its kernel's own, as inside a dispatch mode. Each such operator opens a
//   scope, and the storages of its outputs not seen before are recorded at its end.
// - Frees: the allocator's reports (`c10::reportMemoryUsage`, what `profile_memory` uses),
//   through a profiler state that reads as "no profiler" to PyTorch's own checks.

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/Tensor.h>
#include <ATen/record_function.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/profiler/orchestration/observer.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

// One output storage, as poolsight's side reads it (`torch_track.rs`, `NativeOutput`).
struct Output {
  uint64_t key;  // the StorageImpl's address: `UntypedStorage._cdata`
  uint64_t ptr;
  uint64_t bytes;
  int32_t device_type;
  int32_t device_index;
};

// What poolsight's native module hands over (`torch_track.rs`, `NativeTable`).
struct Table {
  uint32_t version;
  void* ctx;
  // An operator the mode would see begins: returns a handle for `op_end` (0: none).
  uint32_t (*op_begin)(void* ctx, const char* name, uint32_t view, uint32_t in_backward,
                       int64_t node_sequence);
  void (*op_end)(void* ctx, uint32_t handle, const Output* outputs, size_t n, uint32_t raised);
  void (*freed)(void* ctx, uint64_t ptr, int32_t device_type, int32_t device_index);
};

constexpr uint32_t kTableVersion = 1;

std::atomic<const Table*> table{nullptr};
at::CallbackHandle handle = 0;
std::atomic<uint64_t> shadowed{0};

// The allocator's reports on the threads that track: a profiler state that is not a profiler
// (disabled, `ActiveProfilerType::NONE`), so PyTorch's checks and a profiler started inside
// read it as none; while such a profiler runs, its own state hides this one.
struct Reporter final : torch::profiler::impl::ProfilerStateBase {
  Reporter()
      : ProfilerStateBase(torch::profiler::impl::ProfilerConfig(
            torch::profiler::impl::ProfilerState::Disabled, false, true)) {}

  bool memoryProfilingEnabled() const override { return active.load(std::memory_order_relaxed); }

  void reportMemoryUsage(void* ptr, int64_t alloc_size, size_t, size_t, c10::Device device)
      override {
    if (alloc_size >= 0 || !active.load(std::memory_order_relaxed)) return;
    const Table* t = table.load(std::memory_order_acquire);
    if (t == nullptr) return;
    t->freed(t->ctx, reinterpret_cast<uint64_t>(ptr), static_cast<int32_t>(device.type()),
             device.index());
  }

  torch::profiler::impl::ActiveProfilerType profilerType() override {
    return torch::profiler::impl::ActiveProfilerType::NONE;
  }

  std::atomic<bool> active{true};
};

std::shared_ptr<Reporter> reporter;

// This thread's reporter is off its debug info while a profiler runs (see `pause`).
thread_local bool paused = false;

// Takes the reporter off this thread's debug info when it is the last pushed; whether it was.
bool pop_reporter() {
  try {
    if (reporter && c10::ThreadLocalDebugInfo::_peek(c10::DebugInfoKind::PROFILER_STATE).get() ==
                        reporter.get()) {
      c10::ThreadLocalDebugInfo::_pop(c10::DebugInfoKind::PROFILER_STATE);
      return true;
    }
  } catch (...) {
  }
  return false;
}

// What an operator is, learnt once per name (per thread: no lock on the way).
struct OpKind {
  bool composite;  // CompositeImplicitAutograd: decomposes before the mode's key
  bool view;       // its outputs alias its inputs
};

OpKind learn(const at::RecordFunction& fn) {
  OpKind kind{false, false};
  auto name = fn.operator_name();
  if (!name.has_value()) return kind;
  auto op = c10::Dispatcher::singleton().findOp(*name);
  if (!op.has_value()) return kind;
  using K = c10::DispatchKey;
  // The rule PyTorch's dispatcher follows for an autograd key (`AutogradCPU`): a kernel
  // registered for it comes first, then the CompositeImplicitAutograd one unless the backend
  // (`CPU`) or CompositeExplicitAutograd has a kernel; only then the `Autograd` alias's (which
  // `aten::linear` has, for nested tensors).
  kind.composite = op->hasKernelForDispatchKey(K::CompositeImplicitAutograd) &&
                   !op->hasKernelForDispatchKey(K::CompositeExplicitAutograd) &&
                   !op->hasKernelForDispatchKey(K::CompositeExplicitAutogradNonFunctional) &&
                   !op->hasKernelForDispatchKey(K::AutogradCPU) &&
                   !op->hasKernelForDispatchKey(K::AutogradCUDA) &&
                   !op->hasKernelForDispatchKey(K::CPU) && !op->hasKernelForDispatchKey(K::CUDA);
  if (op->hasSchema()) {
    for (const auto& r : op->schema().returns()) {
      if (r.alias_info() != nullptr) kind.view = true;
    }
  }
  return kind;
}

struct PerThread {
  std::unordered_map<const char*, OpKind> kinds;
  // Dispatcher operators open inside the operator the mode sees (0: none is open).
  uint32_t inside = 0;
};
thread_local PerThread local;

struct Open final : at::ObserverContext {
  explicit Open(uint32_t h, bool v) : handle(h), view(v) {}
  uint32_t handle;
  bool view;
};

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  const Table* t = table.load(std::memory_order_acquire);
  if (t == nullptr) return nullptr;
  if (c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE) != reporter.get()) {
    // A profiler started inside track() hides the allocator's reports from it.
    shadowed.fetch_add(1, std::memory_order_relaxed);
  }
  if (local.inside > 0) {
    // Inside the operator the mode sees: its kernel's own (no context: nothing to allocate).
    local.inside++;
    return nullptr;
  }
  if (!fn.operator_name().has_value()) return nullptr;  // not a dispatcher operator
  const char* name = fn.name();
  auto it = local.kinds.find(name);
  if (it == local.kinds.end()) it = local.kinds.emplace(name, learn(fn)).first;
  if (it->second.composite) return nullptr;
  local.inside = 1;
  const bool in_backward = torch::autograd::get_current_graph_task_id() != -1;
  int64_t node = -1;
  if (in_backward) {
    // A raw pointer in older PyTorch, an intrusive pointer in newer.
    auto n = torch::autograd::get_current_node();
    if (n) node = static_cast<int64_t>(n->sequence_nr());
  }
  uint32_t h = t->op_begin(t->ctx, name, it->second.view, in_backward, node);
  return std::make_unique<Open>(h, it->second.view);
}

void on_end(const at::RecordFunction& fn, at::ObserverContext* ctx) {
  if (ctx == nullptr) {
    // A kernel's own operator (the one the mode sees holds `inside` at 1 until its end), or
    // one passed over outside (a composite, not a dispatcher operator): `inside` is 0 then.
    if (local.inside > 1) local.inside--;
    return;
  }
  auto* open = static_cast<Open*>(ctx);
  local.inside = 0;
  const Table* t = table.load(std::memory_order_acquire);
  if (t == nullptr || open->handle == 0) return;
  // Ended by an exception unwinding through the dispatcher: a call that raised.
  const bool raised = std::uncaught_exceptions() > 0;
  std::vector<Output> outs;
  if (!raised) {
    for (const auto& v : fn.outputs()) {
      auto add = [&](const at::Tensor& x) {
        if (!x.defined() || !x.has_storage()) return;
        const auto& st = x.storage();
        auto* impl = st.unsafeGetStorageImpl();
        if (impl == nullptr || st.data() == nullptr) return;
        auto dev = st.device();
        outs.push_back({reinterpret_cast<uint64_t>(impl), reinterpret_cast<uint64_t>(st.data()),
                        static_cast<uint64_t>(st.nbytes()), static_cast<int32_t>(dev.type()),
                        dev.index()});
      };
      if (v.isTensor()) {
        add(v.toTensor());
      } else if (v.isTensorList()) {
        for (const at::Tensor& x : v.toTensorVector()) add(x);
      } else if (v.isList()) {
        for (const auto& e : v.toListRef()) {
          if (e.isTensor()) add(e.toTensor());
        }
      }
    }
  }
  t->op_end(t->ctx, open->handle, outs.data(), outs.size(), raised ? 1 : 0);
}

}  // namespace

extern "C" {

// The table's layout this file was compiled for.
uint32_t poolsight_observer_version() { return kTableVersion; }

// Starts observing with `t` (kept until `poolsight_observer_remove`): 0 when started, else 1
// (another table is installed) or 2 (a wrong table version).
int poolsight_observer_install(const Table* t) {
  if (t == nullptr || t->version != kTableVersion) return 2;
  const Table* none = nullptr;
  if (!table.compare_exchange_strong(none, t)) return 1;
  shadowed.store(0);
  return 0;
}

// Stops calling the table; returns the operator calls seen while a profiler's own state hid
// the allocator's reports.
uint64_t poolsight_observer_remove() {
  table.store(nullptr, std::memory_order_release);
  return shadowed.exchange(0);
}

// On the thread that tracks: the operator callback and the allocator's reports on (they reach
// autograd's threads from it). Returns 0, or 1 when a profiler is running on this thread.
int poolsight_observer_enter() {
  if (c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE) != nullptr) return 1;
  if (!reporter) reporter = std::make_shared<Reporter>();
  reporter->active.store(true);
  c10::ThreadLocalDebugInfo::_push(c10::DebugInfoKind::PROFILER_STATE, reporter);
  handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback(on_start, on_end)
          .needsOutputs(true)
          .scopes({at::RecordScope::FUNCTION}));
  return 0;
}

// Undoes `poolsight_observer_enter` on the same thread. The reporter comes off the thread's
// debug info when it is the last pushed; else (something pushed after it and still there) it
// stays, inactive.
void poolsight_observer_exit() {
  if (handle != 0) {
    at::removeCallback(handle);
    handle = 0;
  }
  if (!reporter) return;
  reporter->active.store(false);
  if (!paused) pop_reporter();
  paused = false;
}

// A profiler is about to start on this thread (PyTorch refuses to start one over another
// profiler state): the reporter steps aside, and the allocator reports to the profiler.
void poolsight_observer_pause() {
  if (!paused && pop_reporter()) paused = true;
}

// The profiler has stopped: the reporter is back.
void poolsight_observer_resume() {
  if (!paused) return;
  paused = false;
  if (reporter && c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE) == nullptr) {
    c10::ThreadLocalDebugInfo::_push(c10::DebugInfoKind::PROFILER_STATE, reporter);
  }
}

}  // extern "C"
