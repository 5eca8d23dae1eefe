// poolsight's native observer for `poolsight.torch.track()` and `hook()`: PyTorch's own C++
// callbacks in place of a Python `TorchDispatchMode`. Compiled against the installed PyTorch on
// first use (see `__init__.py`), loaded with ctypes, and fed a table of functions by
// poolsight's native module, which writes the trace: no Python call per operator.
//
// - Operators: a global `RecordFunction` callback that passes over at once on threads that do
//   not track. The threads that track are the one that entered and those that carry its
//   profiler state (PyTorch hands a thread's debug info to autograd's workers). A global
//   callback, not a thread-local one: with one, every thread-local state PyTorch sets (each
//   autograd task's) rebuilds the thread's callback lists, which cost 2-3 % of a CPU training
//   epoch in `python/benchmarks/torch_overhead.py`. The operator a dispatch mode sees
//   is the outermost dispatcher operator that is not CompositeImplicitAutograd (those decompose
//   before PyTorch's Python key: `aten::linear` into `aten::t` and `aten::addmm`); operators
//   called inside it are its kernel's own, as inside a dispatch mode. Each such operator opens a
//   scope, and the storages of its outputs not seen before are recorded at its end.
// - Frees: each storage recorded gets the observer's deleter in front of its allocator's (the
//   `DataPtr`'s deleter swapped, its context kept), which tells the free and then frees as
//   before: on whichever thread lets the storage go, at the moment it does, whoever made it and
//   whatever runs beside (a `torch.profiler` started inside `track()`). The allocator is not
//   asked to report memory: PyTorch's per-allocation bookkeeping for memory reports (a size
//   table under a lock, for every block) is not paid, and every other block's free costs
//   nothing. A storage whose deleter cannot be swapped (its context is not its data: memory
//   shared with NumPy, a lazy clone's) is watched instead, through a weak reference, and its
//   free told when that is found expired (a few operators late at most).
// - The threads that track are marked by a profiler state that reads as "no profiler" to
//   PyTorch's own checks and reports no memory: PyTorch hands it to autograd's workers with the
//   rest of a thread's debug info.

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/Tensor.h>
#include <ATen/record_function.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/profiler/orchestration/observer.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <pthread.h>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

// One output storage, as poolsight's side reads it (`torch_track.rs`, `NativeOutput`).
struct Output {
  uint64_t key;  // the StorageImpl's address: `UntypedStorage._cdata`
  uint64_t ptr;
  uint64_t bytes;
  int32_t device_type;
  int32_t device_index;
  // Set by `op_end` (1) for a storage it recorded.
  uint32_t recorded;
  // Set by `op_end` (nonzero) for a storage it recorded: the number `unwatched` gives back when
  // the storage is gone, if it is watched (no deleter of the observer's can tell its free).
  uint64_t watch;
};

// What poolsight's native module hands over (`torch_track.rs`, `NativeTable`).
struct Table {
  uint32_t version;
  void* ctx;
  // An operator the mode would see begins: returns a handle for `op_end` (0: none).
  uint32_t (*op_begin)(void* ctx, const char* name, uint32_t view, uint32_t in_backward,
                       int64_t node_sequence);
  void (*op_end)(void* ctx, uint32_t handle, Output* outputs, size_t n, uint32_t raised);
  // A free told by the observer's deleter: the block at `ptr`.
  void (*freed)(void* ctx, uint64_t ptr);
  // A watched storage (see `Output::watch`) is gone.
  void (*unwatched)(void* ctx, uint64_t key, uint64_t watch);
};

constexpr uint32_t kTableVersion = 4;

// What an operator is, learnt once per name (per thread: no lock on the way).
struct OpKind {
  bool composite;  // CompositeImplicitAutograd: decomposes before the mode's key
  bool view;       // its outputs alias its inputs
};

struct PerThread {
  std::unordered_map<const char*, OpKind> kinds;
  // 1 while the operator the mode sees is open, plus the dispatcher operators open inside it
  // (0: none is open).
  uint32_t inside = 0;
  // The open operator's handle from `op_begin` (0: none). Kept here, not in a context object
  // PyTorch would own: one heap allocation less per operator, and the allocator's small-block
  // bins, which the operators' own tensors share, churn less.
  uint32_t handle = 0;
  // An operator's outputs and their storages, kept between operators so that their memory is
  // reused (an `on_end` inside another's, from a Python callback, finds them empty and uses
  // its own).
  std::vector<Output> outs;
  std::vector<c10::StorageImpl*> impls;
};
thread_local PerThread local;

// Storages recorded whose frees no deleter of the observer's tells, until they are gone.
struct Watch {
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  uint64_t key;
  uint64_t watch;
};
std::mutex watch_mutex;
std::vector<Watch> watches;
std::atomic<size_t> watched{0};

// How many watched storages one sweep looks at, at most: with more watched (thousands of
// tensors made before tracking, each seen through a view), a sweep per operator would cost
// more than the operator. Past it, a free is told up to watched / kSweepBatch sweeps late.
constexpr size_t kSweepBatch = 32;
// Where the next sweep begins (guarded by `watch_mutex`).
size_t sweep_at = 0;

using Weak = c10::weak_intrusive_ptr<c10::StorageImpl>;

// Tells the storages watched that are gone (their data freed): before an operator begins and
// before one's outputs are recorded, so that a free comes before what is allocated after it.
// `all`: every storage watched (when tracking ends), else the next kSweepBatch.
void sweep(const Table* t, bool all) {
  if (watched.load(std::memory_order_relaxed) == 0) return;
  std::vector<std::pair<uint64_t, uint64_t>> gone;
  // Let go of once `watch_mutex` is released (a weak reference can be the last of a storage's
  // references, whose release deletes it).
  std::vector<Weak> dropped;
  {
    std::lock_guard<std::mutex> guard(watch_mutex);
    const size_t todo = all ? watches.size() : std::min(watches.size(), kSweepBatch);
    for (size_t k = 0; k < todo && !watches.empty(); k++) {
      if (sweep_at >= watches.size()) sweep_at = 0;
      auto& w = watches[sweep_at];
      if (w.storage.expired()) {
        gone.emplace_back(w.key, w.watch);
        dropped.push_back(std::move(w.storage));
        w = std::move(watches.back());
        watches.pop_back();
      } else {
        sweep_at++;
      }
    }
    watched.store(watches.size(), std::memory_order_relaxed);
  }
  for (const auto& [key, watch] : gone) t->unwatched(t->ctx, key, watch);
}

std::atomic<const Table*> table{nullptr};
at::CallbackHandle handle = 0;

// A process forked while tracking (a DataLoader's workers, multiprocessing's fork) inherits the
// callback and the tracking thread's state. There the observer does nothing: the recorder drops
// what a forked child records anyway, and a lock another thread held at the fork would never be
// let go.
std::atomic<bool> forked{false};

void in_child() { forked.store(true, std::memory_order_relaxed); }

// Frees in flight through the observer's deleter: `poolsight_observer_remove` waits for them
// before the table (and the recording behind it) may go.
std::atomic<uint32_t> telling{0};

// A free of a storage recorded (the observer's deleter, any thread): told before the block
// goes back, so that a block the allocator gives out again at that address is recorded after.
void tell_free(void* data) {
  if (forked.load(std::memory_order_relaxed)) return;
  telling.fetch_add(1);
  if (const Table* t = table.load()) {
    t->freed(t->ctx, reinterpret_cast<uint64_t>(data));
  }
  telling.fetch_sub(1);
}

// The observer's deleters: slot i tells the free, then calls the allocator's deleter it took
// the place of (`originals[i]`). A few allocators' deleters are met in a process (the CPU's, the
// CUDA caching allocator's, pinned memory's); past kDeleters distinct ones, a storage is watched
// instead. A slot, once given, is never given to another deleter: storages that carry it may
// outlive every recording.
constexpr size_t kDeleters = 16;
std::atomic<c10::DeleterFnPtr> originals[kDeleters];
std::mutex originals_mutex;

template <size_t I>
void deleter(void* ctx) {
  tell_free(ctx);
  originals[I].load(std::memory_order_acquire)(ctx);
}

template <size_t... I>
constexpr std::array<c10::DeleterFnPtr, sizeof...(I)> make_deleters(std::index_sequence<I...>) {
  return {&deleter<I>...};
}
constexpr auto deleters = make_deleters(std::make_index_sequence<kDeleters>{});

// Whether `d` is one of the observer's deleters.
bool is_ours(c10::DeleterFnPtr d) {
  for (auto ours : deleters) {
    if (ours == d) return true;
  }
  return false;
}

// The slot whose deleter stands in front of `d`, given it now if none does (-1: all taken).
int slot_of(c10::DeleterFnPtr d) {
  for (size_t i = 0; i < kDeleters; i++) {
    const auto o = originals[i].load(std::memory_order_acquire);
    if (o == d) return static_cast<int>(i);
    if (o == nullptr) break;
  }
  std::lock_guard<std::mutex> guard(originals_mutex);
  for (size_t i = 0; i < kDeleters; i++) {
    const auto o = originals[i].load(std::memory_order_acquire);
    if (o == d) return static_cast<int>(i);
    if (o == nullptr) {
      originals[i].store(d, std::memory_order_release);
      return static_cast<int>(i);
    }
  }
  return -1;
}

// Puts the observer's deleter in front of storage `impl`'s (recorded): whether its free will be
// told by one of the observer's (false: it is to be watched).
bool tell_frees_of(c10::StorageImpl* impl) {
  auto& data = impl->_mutable_data_ptr_no_checks();
  // The deleter is given the context, and its free is told by the data's address: only where
  // they are the same (the CPU and CUDA caching allocators').
  if (data.get() == nullptr || data.get_context() != data.get()) return false;
  const auto d = data.get_deleter();
  if (d == nullptr) return false;
  if (is_ours(d)) return true;
  const int i = slot_of(d);
  return i >= 0 && data.compare_exchange_deleter(d, deleters[static_cast<size_t>(i)]);
}

// The mark of the threads that track: a profiler state that is not a profiler (disabled,
// `ActiveProfilerType::NONE`) and reports no memory, so PyTorch's checks and a profiler started
// inside read it as none; while such a profiler runs, its own state hides this one.
struct Marker final : torch::profiler::impl::ProfilerStateBase {
  Marker()
      : ProfilerStateBase(torch::profiler::impl::ProfilerConfig(
            torch::profiler::impl::ProfilerState::Disabled, false, false)) {}

  bool memoryProfilingEnabled() const override { return false; }

  void reportMemoryUsage(void*, int64_t, size_t, size_t, c10::Device) override {}

  torch::profiler::impl::ActiveProfilerType profilerType() override {
    return torch::profiler::impl::ActiveProfilerType::NONE;
  }
};

std::shared_ptr<Marker> marker;

// This thread's marker is off its debug info while a profiler runs (see `pause`).
thread_local bool paused = false;
// This thread entered (see `poolsight_observer_enter`).
thread_local bool tracks = false;
// Threads whose marker stepped aside for a profiler.
std::atomic<uint32_t> pauses{0};

// Takes the marker off this thread's debug info when it is the last pushed; whether it was.
bool pop_marker() {
  try {
    if (marker && c10::ThreadLocalDebugInfo::_peek(c10::DebugInfoKind::PROFILER_STATE).get() ==
                      marker.get()) {
      c10::ThreadLocalDebugInfo::_pop(c10::DebugInfoKind::PROFILER_STATE);
      return true;
    }
  } catch (...) {
  }
  return false;
}

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

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  const Table* t = table.load(std::memory_order_acquire);
  if (t == nullptr || forked.load(std::memory_order_relaxed)) return nullptr;
  auto& here = local;
  if (here.inside > 0) {
    // Inside the operator the mode sees (this thread tracks): its kernel's own.
    here.inside++;
    return nullptr;
  }
  auto* state = c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE);
  if (state != marker.get()) {
    // Not a thread that tracks, unless it entered, or works for one that did, while a profiler
    // started inside track() holds its state.
    if (!tracks && (state == nullptr || pauses.load(std::memory_order_relaxed) == 0)) {
      return nullptr;
    }
  }
  const char* name = fn.name();
  auto it = here.kinds.find(name);
  if (it == here.kinds.end()) {
    // A dispatcher operator's name lives as long as the dispatcher: its address is its key,
    // and no other name shares it. Other names (not operators) are not kept, and asked anew
    // (`operator_name` copies the name: not on every operator's way).
    if (!fn.operator_name().has_value()) return nullptr;
    it = here.kinds.emplace(name, learn(fn)).first;
  }
  if (it->second.composite) return nullptr;
  // The frees of watched storages found since the last operator, before this one begins.
  sweep(t, false);
  here.inside = 1;
  const bool in_backward = torch::autograd::get_current_graph_task_id() != -1;
  int64_t node = -1;
  if (in_backward) {
    // A raw pointer in older PyTorch, an intrusive pointer in newer.
    auto n = torch::autograd::get_current_node();
    if (n) node = static_cast<int64_t>(n->sequence_nr());
  }
  // Set after `op_begin`, which may call Python: an operator run from there is a kernel's own
  // (`inside` is 1), and leaves the handle alone.
  here.handle = t->op_begin(t->ctx, name, it->second.view, in_backward, node);
  // No context: PyTorch calls `on_end` all the same, and `inside` says which operator ends.
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  auto& here = local;
  if (here.inside > 1) {
    // A kernel's own operator (the one the mode sees holds `inside` at 1 until its end).
    here.inside--;
    return;
  }
  if (here.inside == 0) {
    // One passed over (a composite, not a dispatcher operator, a thread that does not track).
    return;
  }
  // The operator the mode sees.
  here.inside = 0;
  const uint32_t handle = here.handle;
  here.handle = 0;
  const Table* t = table.load(std::memory_order_acquire);
  if (t == nullptr || handle == 0 || forked.load(std::memory_order_relaxed)) return;
  // Ended by an exception unwinding through the dispatcher: a call that raised.
  const bool raised = std::uncaught_exceptions() > 0;
  std::vector<Output> outs;
  outs.swap(here.outs);
  // The storages of the outputs (alive through `fn.outputs()` until this returns).
  std::vector<c10::StorageImpl*> impls;
  impls.swap(here.impls);
  if (!raised) {
    for (const auto& v : fn.outputs()) {
      auto add = [&](const at::Tensor& x) {
        if (!x.defined() || !x.has_storage()) return;
        const auto& st = x.storage();
        auto* impl = st.unsafeGetStorageImpl();
        if (impl == nullptr || st.data() == nullptr) return;
        auto dev = st.device();
        outs.push_back({reinterpret_cast<uint64_t>(impl),
                        reinterpret_cast<uint64_t>(st.data()), static_cast<uint64_t>(st.nbytes()),
                        static_cast<int32_t>(dev.type()), dev.index(), 0, 0});
        impls.push_back(impl);
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
  // The frees found since the last operator first.
  sweep(t, false);
  t->op_end(t->ctx, handle, outs.data(), outs.size(), raised ? 1 : 0);
  // Each storage `op_end` recorded gets the observer's deleter (its `watch` cleared here: not
  // watched); one that cannot is watched from now on (under the lock only then).
  bool any = false;
  for (size_t i = 0; i < outs.size(); i++) {
    auto& o = outs[i];
    if (o.recorded == 0) continue;
    if (tell_frees_of(impls[i])) {
      o.watch = 0;
    } else {
      any = true;
    }
  }
  if (any) {
    std::lock_guard<std::mutex> guard(watch_mutex);
    for (size_t i = 0; i < outs.size(); i++) {
      const auto& o = outs[i];
      if (o.recorded == 0 || o.watch == 0) continue;
      auto strong =
          c10::intrusive_ptr<c10::StorageImpl>::unsafe_reclaim_from_nonowning(impls[i]);
      watches.push_back({Weak(strong), o.key, o.watch});
    }
    watched.store(watches.size(), std::memory_order_relaxed);
  }
  outs.clear();
  impls.clear();
  here.outs.swap(outs);
  here.impls.swap(impls);
}

}  // namespace

extern "C" {

// The table's layout this file was compiled for.
uint32_t poolsight_observer_version() { return kTableVersion; }

// Starts observing with `t` (kept until `poolsight_observer_remove`): 0 when started, else 1
// (another table is installed) or 2 (a wrong table version).
int poolsight_observer_install(const Table* t) {
  if (t == nullptr || t->version != kTableVersion) return 2;
  static std::once_flag atfork;
  std::call_once(atfork, [] { pthread_atfork(nullptr, nullptr, in_child); });
  const Table* none = nullptr;
  if (!table.compare_exchange_strong(none, t)) return 1;
  // A forked child's own recording (none of its parent's was installed when it forked).
  forked.store(false, std::memory_order_relaxed);
  return 0;
}

// Stops calling the table, once the frees being told through it are told.
void poolsight_observer_remove() {
  if (forked.load(std::memory_order_relaxed)) {
    // A forked child leaving track(): its copies of the watches are the parent's to tell.
    table.store(nullptr);
    return;
  }
  // The storages watched that are gone by now are freed in the trace; the rest were live when
  // tracking ended.
  if (const Table* t = table.load(std::memory_order_acquire)) sweep(t, true);
  table.store(nullptr);
  // A deleter that read the table before it went is telling a free through it: the recording
  // behind it stays until that is done (a free is told without the interpreter, so this waits
  // on nothing the caller holds).
  while (telling.load() != 0) std::this_thread::yield();
  // Let go of after the lock is (the last reference to a storage deletes it).
  std::vector<Watch> old_watches;
  {
    std::lock_guard<std::mutex> guard(watch_mutex);
    old_watches.swap(watches);
    watched.store(0);
    sweep_at = 0;
  }
}

// On the thread that tracks: the operator callback on, and the mark of a thread that tracks
// (it reaches autograd's threads from this one). Returns 0, or 1 when a profiler is running
// on this thread.
int poolsight_observer_enter() {
  if (c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE) != nullptr) return 1;
  if (!marker) marker = std::make_shared<Marker>();
  c10::ThreadLocalDebugInfo::_push(c10::DebugInfoKind::PROFILER_STATE, marker);
  tracks = true;
  handle = at::addGlobalCallback(
      at::RecordFunctionCallback(on_start, on_end)
          .needsOutputs(true)
          .scopes({at::RecordScope::FUNCTION}));
  return 0;
}

// Undoes `poolsight_observer_enter` on the same thread. The marker comes off the thread's
// debug info when it is the last pushed; else (something pushed after it and still there) it
// stays, and marks nothing once the table is removed.
void poolsight_observer_exit() {
  if (handle != 0) {
    at::removeCallback(handle);
    handle = 0;
  }
  tracks = false;
  if (!marker) return;
  if (paused) {
    pauses.fetch_sub(1);
  } else {
    pop_marker();
  }
  paused = false;
}

// A profiler is about to start on this thread (PyTorch refuses to start one over another
// profiler state): the marker steps aside, and the threads that track are known by `tracks`
// and `pauses` until it is back.
void poolsight_observer_pause() {
  if (!paused && pop_marker()) {
    paused = true;
    pauses.fetch_add(1);
  }
}

// The profiler has stopped: the marker is back.
void poolsight_observer_resume() {
  if (!paused) return;
  paused = false;
  pauses.fetch_sub(1);
  if (marker && c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE) == nullptr) {
    c10::ThreadLocalDebugInfo::_push(c10::DebugInfoKind::PROFILER_STATE, marker);
  }
}

}  // extern "C"
