#include "virtual_gpu.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include "model/alloc_conf.h"

namespace fragscope::vgpu {
namespace {

// SetCPUAllocator's priority: above the default allocator's 0, so nothing registered at load
// time overrides the wrapper while it is installed; Stop restores the wrapped one at the same.
constexpr std::uint8_t kPriority = 100;

// One live storage allocated through the wrapper.
struct Live {
  void* inner_context = nullptr;
  c10::DeleterFnPtr inner_deleter = nullptr;
  std::uint32_t session = 0;  // 0: not in any simulation (CPU-only, failed, forked child)
  model::CachingAllocatorSim::BlockHandle handle = model::CachingAllocatorSim::kNoBlock;
  std::uint64_t id = 0;
  std::uint64_t size = 0;
};

struct Session {
  std::uint32_t number = 0;
  VirtualGpuOptions options;
  std::unique_ptr<model::CachingAllocatorSim> sim;
  std::vector<RequestRecord> requests;
  std::vector<AllocatorEvent> events;
  std::vector<OomRecord> ooms;
  HookCounters counters;
  std::unordered_set<std::thread::id> threads;
  std::uint64_t next_id = 1;
  std::int64_t step = -1;
};

// Process-wide state. Never destroyed: storages may be freed during interpreter shutdown,
// after static destructors would have run.
struct State {
  std::mutex mutex;
  std::unordered_map<void*, Live> live;
  c10::Allocator* inner = nullptr;   // the allocator the wrapper forwards to
  std::unique_ptr<Session> session;  // the running or the last session
  bool active = false;
  std::uint32_t sessions = 0;
  pid_t pid = 0;  // the process that installed the wrapper; a forked child differs
};

State& G() {
  static State* state = new State;
  return *state;
}

std::atomic<bool> g_in_child{false};

void DeleteLive(void* data);

class WrappingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) const override;
  c10::DeleterFnPtr raw_deleter() const override { return &DeleteLive; }
};

WrappingAllocator& Wrapper() {
  static WrappingAllocator* wrapper = new WrappingAllocator;
  return *wrapper;
}

[[noreturn]] void ThrowOom(const std::string& message) {
  throw c10::OutOfMemoryError(
      c10::SourceLocation{__func__, __FILE__, static_cast<std::uint32_t>(__LINE__)}, message);
}

c10::DataPtr WrappingAllocator::allocate(size_t nbytes) const {
  State& g = G();
  c10::Allocator* inner = g.inner;
  if (nbytes == 0 || g_in_child.load(std::memory_order_relaxed)) {
    if (nbytes == 0 && !g_in_child.load(std::memory_order_relaxed)) {
      std::lock_guard<std::mutex> lock(g.mutex);
      if (g.active) ++g.session->counters.zero_size;
    }
    return inner->allocate(nbytes);
  }
  // Classify outside the lock: it reads this thread's op stack only.
  CpuOnlyKind kind = CpuOnlyKind::kNone;
  Live entry;
  {
    std::unique_lock<std::mutex> lock(g.mutex);
    if (!g.active) {
      lock.unlock();
      return inner->allocate(nbytes);
    }
    Session& s = *g.session;
    if (!s.options.keep_cpu_only) {
      lock.unlock();
      kind = Classify(nbytes);
      lock.lock();
      if (!g.active || g.session.get() != &s) return inner->allocate(nbytes);
    }
    s.threads.insert(std::this_thread::get_id());
    s.counters.threads = s.threads.size();
    if (kind != CpuOnlyKind::kNone) {
      ++s.counters.cpu_only[static_cast<int>(kind)];
      lock.unlock();
      return inner->allocate(nbytes);
    }
    const std::uint64_t id = s.next_id++;
    ++s.counters.allocs;
    if (s.options.record_trace) s.requests.push_back({Action::kAlloc, id, nbytes});
    auto result = s.sim->MallocBlock(nbytes);
    if (!result.ok()) {
      OomRecord oom;
      oom.request_index = s.requests.size() - 1;
      oom.step = s.step;
      if (s.sim->last_oom()) oom.details = *s.sim->last_oom();
      oom.details.message = result.status().message();
      oom.stats = s.sim->stats().Flatten();
      oom.segments = s.sim->MemorySnapshot();
      s.ooms.push_back(oom);
      if (s.options.on_oom == OnOom::kRaise) {
        const std::string message = result.status().message();
        lock.unlock();
        ThrowOom(message);
      }
      ++s.counters.after_oom;
      // kRecord: the tensor exists (on the CPU) but not in the simulation; a later free of
      // its id is not sent.
      if (s.options.record_trace) s.requests.pop_back();
      lock.unlock();
      return inner->allocate(nbytes);
    }
    entry.session = s.number;
    entry.handle = result.value().handle;
    entry.id = id;
    entry.size = nbytes;
  }
  c10::DataPtr inner_ptr;
  try {
    inner_ptr = inner->allocate(nbytes);
  } catch (...) {
    // The host ran out of real memory: undo the simulated allocation.
    std::lock_guard<std::mutex> lock(g.mutex);
    if (g.active && g.session->number == entry.session) {
      g.session->sim->FreeBlock(entry.handle);
      if (g.session->options.record_trace)
        g.session->requests.push_back({Action::kFreeRequested, entry.id, entry.size});
    }
    throw;
  }
  void* data = inner_ptr.get();
  const c10::Device device = inner_ptr.device();
  entry.inner_deleter = inner_ptr.get_deleter();
  entry.inner_context = inner_ptr.release_context();
  {
    std::lock_guard<std::mutex> lock(g.mutex);
    g.live[data] = entry;
  }
  return c10::DataPtr(data, data, &DeleteLive, device);
}

void DeleteLive(void* data) {
  State& g = G();
  Live entry;
  {
    std::lock_guard<std::mutex> lock(g.mutex);
    auto it = g.live.find(data);
    if (it == g.live.end()) return;  // cannot happen: only the wrapper hands out DeleteLive
    entry = it->second;
    g.live.erase(it);
    if (g.active && !g_in_child.load(std::memory_order_relaxed) &&
        entry.session == g.session->number) {
      Session& s = *g.session;
      ++s.counters.frees;
      if (s.options.record_trace)
        s.requests.push_back({Action::kFreeRequested, entry.id, entry.size});
      s.sim->FreeBlock(entry.handle);
    }
  }
  if (entry.inner_deleter != nullptr) entry.inner_deleter(entry.inner_context);
}

// Fork: hold the mutex across fork() so that the child's copy is not locked by a thread that
// does not exist there, then let the child pass everything through.
void BeforeFork() { G().mutex.lock(); }
void AfterForkParent() { G().mutex.unlock(); }
void AfterForkChild() {
  g_in_child.store(true);
  G().mutex.unlock();
}

std::once_flag g_install_once;

void InstallWrapper() {
  std::call_once(g_install_once, [] {
    State& g = G();
    g.inner = c10::GetCPUAllocator();
    g.pid = getpid();
    pthread_atfork(&BeforeFork, &AfterForkParent, &AfterForkChild);
  });
}

}  // namespace

Status Start(const VirtualGpuOptions& options) {
  if (g_in_child.load()) {
    return Status(StatusCode::kInvalidArgument,
                  "virtual GPU: cannot start in a forked child process");
  }
  InstallWrapper();
  State& g = G();
  auto session = std::make_unique<Session>();
  session->options = options;
  session->sim = std::make_unique<model::CachingAllocatorSim>(options.sim);
  if (options.record_trace) {
    Session* raw = session.get();
    session->sim->SetEventSink([raw](const Event& e) {
      raw->events.push_back(AllocatorEvent{e.action, e.device_free.has_value(), e.addr, e.size,
                                           e.device_free.value_or(0), e.step});
    });
  }
  if (!options.keep_cpu_only) InstallScopeTracking();
  {
    std::lock_guard<std::mutex> lock(g.mutex);
    if (g.active) {
      return Status(StatusCode::kInvalidArgument,
                    "virtual GPU: a virtual GPU is already active in this process");
    }
    session->number = ++g.sessions;
    g.session = std::move(session);
    g.active = true;
  }
  c10::SetCPUAllocator(&Wrapper(), kPriority);
  return Status::Ok();
}

void Stop() {
  State& g = G();
  {
    std::lock_guard<std::mutex> lock(g.mutex);
    if (!g.active) return;
    g.active = false;
  }
  c10::SetCPUAllocator(g.inner, kPriority);
  UninstallScopeTracking();
}

bool Active() {
  std::lock_guard<std::mutex> lock(G().mutex);
  return G().active;
}

Status HasSession() {
  std::lock_guard<std::mutex> lock(G().mutex);
  if (G().session == nullptr) {
    return Status(StatusCode::kInvalidArgument,
                  "no virtual GPU: start one with fragscope.torch.virtual_gpu(...)");
  }
  return Status::Ok();
}

namespace {
template <typename F>
auto WithSession(F f) {
  std::lock_guard<std::mutex> lock(G().mutex);
  return f(*G().session);
}
}  // namespace

void MarkStep(std::int64_t step) {
  WithSession([&](Session& s) {
    s.step = step >= 0 ? step : s.step + 1;
    if (s.options.record_trace) {
      s.requests.push_back({Action::kStep, 0, static_cast<std::uint64_t>(s.step)});
      AllocatorEvent e;
      e.action = Action::kStep;
      e.step = s.step;
      s.events.push_back(e);
    }
    return 0;
  });
}

std::map<std::string, std::int64_t> MemoryStats() {
  return WithSession([](Session& s) { return s.sim->stats().Flatten(); });
}
std::vector<model::SnapshotSegment> MemorySnapshot() {
  return WithSession([](Session& s) { return s.sim->MemorySnapshot(); });
}
std::pair<std::uint64_t, std::uint64_t> MemGetInfo() {
  return WithSession([](Session& s) {
    return std::make_pair(s.sim->device_free_bytes(), s.options.sim.driver.capacity_bytes);
  });
}
void ResetPeakStats() {
  WithSession([](Session& s) {
    s.sim->ResetPeakStats();
    return 0;
  });
}
void ResetAccumulatedStats() {
  WithSession([](Session& s) {
    s.sim->ResetAccumulatedStats();
    return 0;
  });
}
void EmptyCache() {
  WithSession([](Session& s) {
    s.sim->EmptyCache();
    return 0;
  });
}
Status SetMemoryFraction(double fraction) {
  return WithSession([&](Session& s) { return s.sim->SetMemoryFraction(fraction); });
}
std::vector<OomRecord> Ooms() {
  return WithSession([](Session& s) { return s.ooms; });
}
HookCounters Counters() {
  return WithSession([](Session& s) { return s.counters; });
}
std::string AllocConfCanonical() {
  return WithSession([](Session& s) { return model::ToConfString(s.sim->config()); });
}
std::vector<RequestRecord> RequestTrace() {
  return WithSession([](Session& s) { return s.requests; });
}
std::vector<AllocatorEvent> AllocatorTrace() {
  return WithSession([](Session& s) { return s.events; });
}

}  // namespace fragscope::vgpu
