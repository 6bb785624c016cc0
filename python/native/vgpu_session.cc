#include "vgpu_session.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_set>
#include <utility>

#include "model/alloc_conf.h"

namespace fragscope::vgpu {
namespace {

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
  std::unique_ptr<Session> session;  // the running or the last session
  bool active = false;
  std::uint32_t sessions = 0;
};

State& G() {
  static State* state = new State;
  return *state;
}

std::atomic<bool> g_in_child{false};

// -- the table the hook calls (vgpu_api.h) -----------------------------------------------------

int WantsClassification() {
  State& g = G();
  std::lock_guard<std::mutex> lock(g.mutex);
  return g.active && !g.session->options.keep_cpu_only ? 1 : 0;
}

void CopyMessage(const std::string& text, char* out, std::size_t capacity) {
  if (capacity == 0) return;
  const std::size_t n = std::min(text.size(), capacity - 1);
  std::memcpy(out, text.data(), n);
  out[n] = '\0';
}

int OnAlloc(std::uint64_t nbytes, int kind, FragscopeVgpuBlock* block, char* message,
            std::size_t capacity) {
  State& g = G();
  std::lock_guard<std::mutex> lock(g.mutex);
  if (!g.active || g_in_child.load(std::memory_order_relaxed)) return FRAGSCOPE_VGPU_PASS;
  Session& s = *g.session;
  s.threads.insert(std::this_thread::get_id());
  s.counters.threads = s.threads.size();
  if (kind > 0 && kind < kNumCpuOnlyKinds && !s.options.keep_cpu_only) {
    ++s.counters.cpu_only[kind];
    return FRAGSCOPE_VGPU_PASS;
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
      CopyMessage(result.status().message(), message, capacity);
      return FRAGSCOPE_VGPU_OOM;
    }
    ++s.counters.after_oom;
    // kRecord: the tensor exists (on the CPU) but not in the simulation; a later free of its
    // id is not sent.
    if (s.options.record_trace) s.requests.pop_back();
    return FRAGSCOPE_VGPU_PASS;
  }
  block->session = s.number;
  block->handle = result.value().handle;
  block->id = id;
  block->size = nbytes;
  return FRAGSCOPE_VGPU_SIMULATED;
}

// The free of a simulated block: recorded and sent to the simulator of its own session only.
void FreeLocked(Session& s, const FragscopeVgpuBlock& block) {
  if (s.options.record_trace) s.requests.push_back({Action::kFreeRequested, block.id, block.size});
  s.sim->FreeBlock(block.handle);
}

void UndoAlloc(const FragscopeVgpuBlock* block) {
  State& g = G();
  std::lock_guard<std::mutex> lock(g.mutex);
  if (g.active && g.session->number == block->session) FreeLocked(*g.session, *block);
}

void OnFree(const FragscopeVgpuBlock* block) {
  State& g = G();
  std::lock_guard<std::mutex> lock(g.mutex);
  if (!g.active || g_in_child.load(std::memory_order_relaxed) ||
      g.session->number != block->session) {
    return;
  }
  ++g.session->counters.frees;
  FreeLocked(*g.session, *block);
}

void OnZeroSize() {
  State& g = G();
  std::lock_guard<std::mutex> lock(g.mutex);
  if (g.active) ++g.session->counters.zero_size;
}

const FragscopeVgpuApi kApi = {
    FRAGSCOPE_VGPU_API_VERSION, &WantsClassification, &OnAlloc, &UndoAlloc, &OnFree, &OnZeroSize};

// Fork: hold the mutex across fork() so that the child's copy is not locked by a thread that
// does not exist there; the child simulates nothing.
void BeforeFork() { G().mutex.lock(); }
void AfterForkParent() { G().mutex.unlock(); }
void AfterForkChild() {
  g_in_child.store(true);
  G().mutex.unlock();
}

std::once_flag g_atfork_once;

std::int64_t NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

const char* CpuOnlyKindName(int kind) {
  static const char* const kNames[kNumCpuOnlyKinds] = {
      "none",           "python_scalar", "op_scalar", "scalar_promotion", "adam_step_counter",
      "record_function"};
  return kind >= 0 && kind < kNumCpuOnlyKinds ? kNames[kind] : "none";
}

const FragscopeVgpuApi* Api() { return &kApi; }

Status Start(const VirtualGpuOptions& options) {
  if (g_in_child.load()) {
    return Status(StatusCode::kInvalidArgument,
                  "virtual GPU: cannot start in a forked child process");
  }
  std::call_once(g_atfork_once,
                 [] { pthread_atfork(&BeforeFork, &AfterForkParent, &AfterForkChild); });
  State& g = G();
  auto session = std::make_unique<Session>();
  session->options = options;
  session->sim = std::make_unique<model::CachingAllocatorSim>(options.sim);
  if (options.record_trace) {
    Session* raw = session.get();
    session->sim->SetEventSink([raw](const Event& e) {
      raw->events.push_back(AllocatorEvent{e.action, e.device_free.has_value(), e.addr, e.size,
                                           e.device_free.value_or(0), e.step, NowUs()});
    });
  }
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
  return Status::Ok();
}

void Stop() {
  State& g = G();
  {
    std::lock_guard<std::mutex> lock(g.mutex);
    if (!g.active) return;
    g.active = false;
  }
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
      e.time_us = NowUs();
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
