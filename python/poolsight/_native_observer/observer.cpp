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
// - Frees: the allocator's reports (`c10::reportMemoryUsage`, what `profile_memory` uses),
//   through a profiler state that reads as "no profiler" to PyTorch's own checks. An allocator
//   reports the free of a block only if it reported its allocation to a profiler state (the CPU
//   allocator keeps sizes only from then on): an output whose block was not allocated inside
//   the operator (data made before tracking began, first seen through a view) is watched
//   instead, through a weak reference to its storage, and its free told when that expires.
// - The allocator reports a free to the freeing thread's profiler state, and only the threads
//   that track carry this one: a storage recorded here and freed on another thread (a queue's
//   consumer, a checkpoint writer) is not reported. Every recorded storage whose free the
//   allocator would report is therefore also held weakly (a "backstop" slot, let go when the
//   report comes), and one such slot is looked at per operator, at its end: a free on another
//   thread is told within about as many operators as there are such storages.

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/Tensor.h>
#include <ATen/record_function.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Logging.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/profiler/orchestration/observer.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <pthread.h>
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
  // 1: its block was allocated inside this operator, so the allocator will report its free.
  uint32_t reported;
  // Set by `op_end` (1) for a storage it recorded.
  uint32_t recorded;
  // The number `unwatched` gives back when the storage is gone: for a reported one, its
  // backstop slot's (set here before `op_end`); else set by `op_end` (nonzero) for a storage
  // it recorded.
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
  // A reported free; returns the number the storage was watched by (0: none), so that its
  // backstop slot is let go.
  uint64_t (*freed)(void* ctx, uint64_t ptr, int32_t device_type, int32_t device_index);
  // A watched storage (see `Output::watch`) is gone.
  void (*unwatched)(void* ctx, uint64_t key, uint64_t watch);
};

constexpr uint32_t kTableVersion = 3;

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
  // The blocks the allocator reported allocating on this thread since the operator the mode
  // sees began: the outputs whose frees it will report.
  std::vector<uint64_t> fresh;
  // An operator's outputs and their storages, kept between operators so that their memory is
  // reused (an `on_end` inside another's, from a Python callback, finds them empty and uses
  // its own).
  std::vector<Output> outs;
  std::vector<c10::StorageImpl*> impls;
};
thread_local PerThread local;

// Storages recorded whose frees the allocator will not report, until they are gone.
struct Watch {
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  uint64_t key;
  uint64_t watch;
};
std::mutex watch_mutex;
std::vector<Watch> watches;
std::atomic<size_t> watched{0};
// Backstop slots taken (see below), for the sweep to pass over at once when there are none.
std::atomic<size_t> backstopped{0};

// How many watched storages one sweep looks at, at most: with more watched (thousands of
// tensors made before tracking, each seen through a view), a sweep per operator would cost
// more than the operator. Past it, a free is told up to watched / kSweepBatch sweeps late.
constexpr size_t kSweepBatch = 32;
// Where the next sweep begins (guarded by `watch_mutex`).
size_t sweep_at = 0;

// The backstop (see the top of this file): slots of the recorded storages whose frees the
// allocator reports, each a weak reference until the report lets it go or it is found gone.
// A slot's number (`Output::watch`) has kBackstop set, its generation and its index, so that
// a number let go twice, or after its slot was reused, does nothing. Guarded by `watch_mutex`.
constexpr uint64_t kBackstop = uint64_t{1} << 63;
struct Slot {
  std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>> storage;
  uint64_t key = 0;
  uint32_t generation = 0;
  bool taken = false;
};
std::vector<Slot> slots;
std::vector<uint32_t> free_slots;
size_t slots_taken = 0;
size_t backstop_at = 0;

uint64_t slot_number(uint32_t i) {
  return kBackstop | (uint64_t{slots[i].generation & 0x7fffffffu} << 32) | i;
}

uint64_t take_slot() {
  uint32_t i;
  if (free_slots.empty()) {
    i = static_cast<uint32_t>(slots.size());
    slots.emplace_back();
  } else {
    i = free_slots.back();
    free_slots.pop_back();
  }
  slots[i].taken = true;
  slots_taken++;
  return slot_number(i);
}

using Weak = c10::weak_intrusive_ptr<c10::StorageImpl>;

// Lets go of the slot `number` names, if it still does; its weak reference goes to `dropped`,
// to be let go once `watch_mutex` is released (the last reference to a storage deletes it).
void let_go(uint64_t number, std::vector<Weak>& dropped) {
  if ((number & kBackstop) == 0) return;
  const auto i = static_cast<uint32_t>(number);
  if (i >= slots.size() || !slots[i].taken || slot_number(i) != number) return;
  auto& slot = slots[i];
  if (slot.storage.has_value()) dropped.push_back(std::move(*slot.storage));
  slot.storage.reset();
  slot.taken = false;
  slot.generation++;
  free_slots.push_back(i);
  slots_taken--;
}

// Tells the storages watched that are gone (their data freed): before an operator begins and
// before one's outputs are recorded, so that a free comes before what is allocated after it.
// `all`: every storage watched and every backstop slot (when tracking ends), else the next
// kSweepBatch watched storages, and with `backstop` the next backstop slot taken. `outs` (with
// their `impls`): the outputs of an operator about to be recorded; each reported one takes a
// backstop slot holding a weak reference to its storage, under the same lock, so that an
// operator's end takes the lock once.
void sweep(const Table* t, bool all, bool backstop, std::vector<Output>* outs = nullptr,
           const std::vector<c10::StorageImpl*>* impls = nullptr) {
  bool reported = false;
  if (outs != nullptr) {
    for (const auto& o : *outs) reported = reported || o.reported != 0;
  }
  if (!reported && watched.load(std::memory_order_relaxed) == 0 &&
      (!backstop || backstopped.load(std::memory_order_relaxed) == 0)) {
    return;
  }
  std::vector<std::pair<uint64_t, uint64_t>> gone;
  std::vector<Weak> dropped;
  {
    std::lock_guard<std::mutex> guard(watch_mutex);
    // The backstop: every slot when tracking ends, else the next one taken (the scan over free
    // slots bounded).
    const size_t looks = all ? slots.size() : backstop ? std::min<size_t>(slots.size(), 8) : 0;
    for (size_t k = 0, found = 0; k < looks && (all || found < 1); k++) {
      if (backstop_at >= slots.size()) backstop_at = 0;
      auto& slot = slots[backstop_at];
      const auto i = static_cast<uint32_t>(backstop_at++);
      if (!slot.taken || !slot.storage.has_value()) continue;
      found++;
      if (slot.storage->expired()) {
        gone.emplace_back(slot.key, slot_number(i));
        let_go(slot_number(i), dropped);
      }
    }
    if (outs != nullptr) {
      for (size_t i = 0; i < outs->size(); i++) {
        auto& o = (*outs)[i];
        if (o.reported == 0) continue;
        o.watch = take_slot();
        // Alive until the operator's end returns (`fn.outputs()` holds it).
        auto strong =
            c10::intrusive_ptr<c10::StorageImpl>::unsafe_reclaim_from_nonowning((*impls)[i]);
        auto& slot = slots[static_cast<uint32_t>(o.watch)];
        slot.storage.emplace(Weak(strong));
        slot.key = o.key;
      }
    }
    backstopped.store(slots_taken, std::memory_order_relaxed);
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

std::atomic<uint64_t> shadowed{0};

// The allocator's reports on the threads that track: a profiler state that is not a profiler
// (disabled, `ActiveProfilerType::NONE`), so PyTorch's checks and a profiler started inside
// read it as none; while such a profiler runs, its own state hides this one.
struct Reporter final : torch::profiler::impl::ProfilerStateBase {
  Reporter()
      : ProfilerStateBase(torch::profiler::impl::ProfilerConfig(
            torch::profiler::impl::ProfilerState::Disabled, false, true)) {}

  bool memoryProfilingEnabled() const override {
    return active.load(std::memory_order_relaxed) && !forked.load(std::memory_order_relaxed);
  }

  void reportMemoryUsage(void* ptr, int64_t alloc_size, size_t, size_t, c10::Device device)
      override {
    if (!active.load(std::memory_order_relaxed) || forked.load(std::memory_order_relaxed)) return;
    if (alloc_size >= 0) {
      if (alloc_size > 0 && local.inside > 0) {
        local.fresh.push_back(reinterpret_cast<uint64_t>(ptr));
      }
      return;
    }
    const Table* t = table.load(std::memory_order_acquire);
    if (t == nullptr) return;
    const uint64_t number = t->freed(t->ctx, reinterpret_cast<uint64_t>(ptr),
                                     static_cast<int32_t>(device.type()), device.index());
    if ((number & kBackstop) != 0) {
      std::vector<Weak> dropped;
      std::lock_guard<std::mutex> guard(watch_mutex);
      let_go(number, dropped);
      backstopped.store(slots_taken, std::memory_order_relaxed);
    }
  }

  torch::profiler::impl::ActiveProfilerType profilerType() override {
    return torch::profiler::impl::ActiveProfilerType::NONE;
  }

  std::atomic<bool> active{true};
};

std::shared_ptr<Reporter> reporter;

// This thread's reporter is off its debug info while a profiler runs (see `pause`).
thread_local bool paused = false;
// This thread entered (see `poolsight_observer_enter`).
thread_local bool tracks = false;
// Threads whose reporter stepped aside for a profiler.
std::atomic<uint32_t> pauses{0};

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
  auto* state = c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE);
  if (state != reporter.get()) {
    // Not a thread that tracks, unless it entered, or works for one that did, while a profiler
    // started inside track() holds its state (and hides the allocator's reports from it).
    if (!tracks && (state == nullptr || pauses.load(std::memory_order_relaxed) == 0)) {
      return nullptr;
    }
    shadowed.fetch_add(1, std::memory_order_relaxed);
  }
  auto& here = local;
  if (here.inside > 0) {
    // Inside the operator the mode sees: its kernel's own.
    here.inside++;
    return nullptr;
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
  // The watched storages only: the backstop is looked at once per operator, at its end.
  sweep(t, false, false);
  here.inside = 1;
  here.fresh.clear();
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
        const auto ptr = reinterpret_cast<uint64_t>(st.data());
        bool fresh = false;
        for (auto p : here.fresh) fresh = fresh || p == ptr;
        outs.push_back({reinterpret_cast<uint64_t>(impl), ptr, static_cast<uint64_t>(st.nbytes()),
                        static_cast<int32_t>(dev.type()), dev.index(), fresh ? 1u : 0u, 0, 0});
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
  // The frees found since the last operator first; the reported outputs take their slots.
  sweep(t, false, true, &outs, &impls);
  t->op_end(t->ctx, handle, outs.data(), outs.size(), raised ? 1 : 0);
  // What `op_end` decided, under the lock again only when there is something to keep or let
  // go: a reported output it did not record (seen before), or one recorded that the
  // allocator will not report (watched from now on).
  bool any = false;
  for (const auto& o : outs) {
    any = any || (o.reported != 0 && o.recorded == 0) || (o.reported == 0 && o.watch != 0);
  }
  if (any) {
    std::vector<Weak> dropped;
    std::lock_guard<std::mutex> guard(watch_mutex);
    for (size_t i = 0; i < outs.size(); i++) {
      const auto& o = outs[i];
      if (o.watch == 0) continue;
      if (o.reported != 0) {
        // Seen before (an in-place operator's output): its slot is let go.
        if (o.recorded == 0) let_go(o.watch, dropped);
        continue;
      }
      // Recorded (`op_end` numbers only what it records) and not reported: watched.
      auto strong =
          c10::intrusive_ptr<c10::StorageImpl>::unsafe_reclaim_from_nonowning(impls[i]);
      watches.push_back({Weak(strong), o.key, o.watch});
    }
    watched.store(watches.size(), std::memory_order_relaxed);
    backstopped.store(slots_taken, std::memory_order_relaxed);
  }
  outs.clear();
  impls.clear();
  here.outs.swap(outs);
  here.impls.swap(impls);
}

// PyTorch's CPU allocator warns, at the first free of a block it has no size for while memory
// is reported (and at every 1,000th after it), that the block "was allocated before the
// profiling started": under `track()` that is data made before tracking, which the observer
// handles (see `Watch`), and the warning names a profiler the user never started. Its count
// is taken past that first warning once per process, with the warning held back: a free of an
// address the allocator never gave (nothing is freed; only its count and the log see it).
void quiet_cpu_allocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    const int level = FLAGS_caffe2_log_level;
    FLAGS_caffe2_log_level = std::max(level, 2);  // errors only, for this one call
    static char never_allocated;
    c10::profiledCPUMemoryReporter().Delete(&never_allocated);
    FLAGS_caffe2_log_level = level;
  });
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
  shadowed.store(0);
  return 0;
}

// Stops calling the table; returns the operator calls seen while a profiler's own state hid
// the allocator's reports.
uint64_t poolsight_observer_remove() {
  if (forked.load(std::memory_order_relaxed)) {
    // A forked child leaving track(): its copies of the watches are the parent's to tell.
    table.store(nullptr, std::memory_order_release);
    return 0;
  }
  // The storages watched that are gone by now are freed in the trace; the rest were live when
  // tracking ended.
  if (const Table* t = table.load(std::memory_order_acquire)) sweep(t, true, true);
  table.store(nullptr, std::memory_order_release);
  // Let go of after the lock is (the last reference to a storage deletes it).
  std::vector<Watch> old_watches;
  std::vector<Slot> old_slots;
  {
    std::lock_guard<std::mutex> guard(watch_mutex);
    old_watches.swap(watches);
    watched.store(0);
    sweep_at = 0;
    old_slots.swap(slots);
    free_slots.clear();
    slots_taken = 0;
    backstop_at = 0;
    backstopped.store(0);
  }
  return shadowed.exchange(0);
}

// On the thread that tracks: the operator callback and the allocator's reports on (they reach
// autograd's threads from it). Returns 0, or 1 when a profiler is running on this thread.
int poolsight_observer_enter() {
  if (c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE) != nullptr) return 1;
  if (!reporter) reporter = std::make_shared<Reporter>();
  reporter->active.store(true);
  c10::ThreadLocalDebugInfo::_push(c10::DebugInfoKind::PROFILER_STATE, reporter);
  quiet_cpu_allocator();
  tracks = true;
  handle = at::addGlobalCallback(
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
  tracks = false;
  if (!reporter) return;
  reporter->active.store(false);
  if (paused) {
    pauses.fetch_sub(1);
  } else {
    pop_reporter();
  }
  paused = false;
}

// A profiler is about to start on this thread (PyTorch refuses to start one over another
// profiler state): the reporter steps aside, and the allocator reports to the profiler.
void poolsight_observer_pause() {
  if (!paused && pop_reporter()) {
    paused = true;
    pauses.fetch_add(1);
  }
}

// The profiler has stopped: the reporter is back.
void poolsight_observer_resume() {
  if (!paused) return;
  paused = false;
  pauses.fetch_sub(1);
  if (reporter && c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE) == nullptr) {
    c10::ThreadLocalDebugInfo::_push(c10::DebugInfoKind::PROFILER_STATE, reporter);
  }
}

}  // extern "C"
