// The virtual GPU's hook into c10 (docs/virtual-gpu.md): while a session runs, c10's CPU
// allocator is replaced by a wrapper that hands every storage allocation and free of the
// process, in the order they happen, to fragscope's native core (vgpu_api.h), which decides
// what PyTorch's CUDA caching allocator would have done. The memory itself still comes from the
// wrapped CPU allocator.
//
// This file is compiled against the torch the user runs (fragscope/torch/csrc.py builds it
// with Torch's CMake package, once per torch version, and caches it), so it uses nothing of
// fragscope's C++ libraries: only c10, ATen's RecordFunction and the C table of vgpu_api.h.
//
//   * Zero-byte allocations never reach the simulator (PyTorch's CUDA allocator hands out a
//     null pointer for them); CPU-only ones (cpu_only.h) are classified here and counted there.
//   * At the request that would fail, the core answers FRAGSCOPE_VGPU_OOM and allocate() throws
//     c10::OutOfMemoryError with PyTorch's message (Python: torch.cuda.OutOfMemoryError).
//   * Storages made before the session are freed by the deleter they were made with.
//   * Fork: a child process (a DataLoader worker) passes everything straight to the CPU
//     allocator; pthread_atfork keeps this file's mutex usable there.
//
// Thread safety: every exported function may be called from any thread.
#include <pthread.h>

#include <atomic>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <torch/csrc/api/include/torch/version.h>

#include "cpu_only.h"
#include "vgpu_api.h"

#define FRAGSCOPE_HOOK_EXPORT extern "C" __attribute__((visibility("default")))

namespace fragscope::vgpu {
namespace {

// SetCPUAllocator's priority: above the default allocator's 0, so nothing registered at load
// time overrides the wrapper while it is installed; Stop restores the wrapped one at the same.
constexpr std::uint8_t kPriority = 100;

// One live storage allocated through the wrapper and simulated by the core.
struct Live {
  void* inner_context = nullptr;
  c10::DeleterFnPtr inner_deleter = nullptr;
  FragscopeVgpuBlock block{};
};

struct State {
  std::mutex mutex;
  std::unordered_map<void*, Live> live;
  c10::Allocator* inner = nullptr;  // the allocator the wrapper forwards to
  const FragscopeVgpuApi* api = nullptr;
};

// Never destroyed: storages may be freed during interpreter shutdown, after static destructors.
State& G() {
  static State* state = new State;
  return *state;
}

std::atomic<bool> g_in_child{false};

void DeleteLive(void* data) {
  State& g = G();
  Live entry;
  {
    std::lock_guard<std::mutex> lock(g.mutex);
    auto it = g.live.find(data);
    if (it == g.live.end()) return;  // cannot happen: only the wrapper hands out DeleteLive
    entry = it->second;
    g.live.erase(it);
  }
  if (!g_in_child.load(std::memory_order_relaxed)) g.api->on_free(&entry.block);
  if (entry.inner_deleter != nullptr) entry.inner_deleter(entry.inner_context);
}

[[noreturn]] void ThrowOom(const char* message) {
  throw c10::OutOfMemoryError(
      c10::SourceLocation{__func__, __FILE__, static_cast<std::uint32_t>(__LINE__)}, message);
}

c10::DataPtr Allocate(std::size_t nbytes) {
  State& g = G();
  c10::Allocator* inner = g.inner;
  if (g_in_child.load(std::memory_order_relaxed)) return inner->allocate(nbytes);
  const FragscopeVgpuApi* api = g.api;
  if (nbytes == 0) {
    api->on_zero_size();
    return inner->allocate(nbytes);
  }
  // Classify outside the core's lock: it reads this thread's op stack only.
  const int kind = api->wants_classification() ? static_cast<int>(Classify(nbytes)) : 0;
  FragscopeVgpuBlock block{};
  char message[8192];
  message[0] = '\0';
  switch (api->on_alloc(nbytes, kind, &block, message, sizeof message)) {
    case FRAGSCOPE_VGPU_OOM:
      ThrowOom(message);
    case FRAGSCOPE_VGPU_SIMULATED:
      break;
    default:
      return inner->allocate(nbytes);
  }
  c10::DataPtr inner_ptr;
  try {
    inner_ptr = inner->allocate(nbytes);
  } catch (...) {
    api->undo_alloc(&block);  // the host ran out of real memory
    throw;
  }
  void* data = inner_ptr.get();
  const c10::Device device = inner_ptr.device();
  Live entry;
  entry.inner_deleter = inner_ptr.get_deleter();
  entry.inner_context = inner_ptr.release_context();
  entry.block = block;
  {
    std::lock_guard<std::mutex> lock(g.mutex);
    g.live[data] = entry;
  }
  return c10::DataPtr(data, data, &DeleteLive, device);
}

// c10::Allocator::allocate is const up to torch 2.2 and not from 2.3 on; copy_data is pure
// virtual from 2.3 on and absent before. The base is a template parameter so that only the
// variant that matches the headers is ever instantiated.
template <class A>
using ConstAllocate = c10::DataPtr (A::*)(std::size_t) const;

template <class A>
concept AllocateIsConst = std::is_convertible_v<decltype(&A::allocate), ConstAllocate<A>>;

template <class Base>
class ConstWrapper final : public Base {
 public:
  c10::DataPtr allocate(std::size_t nbytes) const override { return Allocate(nbytes); }
  c10::DeleterFnPtr raw_deleter() const override { return &DeleteLive; }
  void copy_data(void* dest, const void* src, std::size_t count) const {
    std::memcpy(dest, src, count);
  }
};

template <class Base>
class MutableWrapper final : public Base {
 public:
  c10::DataPtr allocate(std::size_t nbytes) override { return Allocate(nbytes); }
  c10::DeleterFnPtr raw_deleter() const override { return &DeleteLive; }
  void copy_data(void* dest, const void* src, std::size_t count) const {
    std::memcpy(dest, src, count);
  }
};

using WrappingAllocator =
    std::conditional_t<AllocateIsConst<c10::Allocator>, ConstWrapper<c10::Allocator>,
                       MutableWrapper<c10::Allocator>>;

WrappingAllocator& Wrapper() {
  static WrappingAllocator* wrapper = new WrappingAllocator;
  return *wrapper;
}

void BeforeFork() { G().mutex.lock(); }
void AfterForkParent() { G().mutex.unlock(); }
void AfterForkChild() {
  g_in_child.store(true);
  G().mutex.unlock();
}

std::once_flag g_install_once;
std::mutex g_start_mutex;
bool g_installed = false;

}  // namespace
}  // namespace fragscope::vgpu

using fragscope::vgpu::G;

#define FRAGSCOPE_STR2(x) #x
#define FRAGSCOPE_STR(x) FRAGSCOPE_STR2(x)

/// The torch version the hook was compiled against ("2.13.0").
FRAGSCOPE_HOOK_EXPORT const char* fragscope_hook_torch_version() {
  return FRAGSCOPE_STR(TORCH_VERSION_MAJOR) "." FRAGSCOPE_STR(
      TORCH_VERSION_MINOR) "." FRAGSCOPE_STR(TORCH_VERSION_PATCH);
}

FRAGSCOPE_HOOK_EXPORT std::uint32_t fragscope_hook_api_version() {
  return FRAGSCOPE_VGPU_API_VERSION;
}

// The functions below are called through ctypes: no exception may leave them.

/// Installs the wrapper as c10's CPU allocator, sending to `api`; with track_scopes, the
/// RecordFunction callback that classifies CPU-only allocations. Returns 0, or -1 for an API
/// of another version, -2 in a forked child, -3 if torch refused.
FRAGSCOPE_HOOK_EXPORT int fragscope_hook_start(const FragscopeVgpuApi* api, int track_scopes) {
  using namespace fragscope::vgpu;
  if (api == nullptr || api->version != FRAGSCOPE_VGPU_API_VERSION) return -1;
  if (g_in_child.load()) return -2;
  std::lock_guard<std::mutex> lock(g_start_mutex);
  try {
    std::call_once(g_install_once, [] {
      G().inner = c10::GetCPUAllocator();
      pthread_atfork(&BeforeFork, &AfterForkParent, &AfterForkChild);
    });
    G().api = api;
    if (track_scopes) InstallScopeTracking();
    c10::SetCPUAllocator(&Wrapper(), kPriority);
  } catch (...) {
    return -3;
  }
  g_installed = true;
  return 0;
}

/// Restores the wrapped allocator; storages of the session are later freed through the core,
/// which ignores them once its session ended.
FRAGSCOPE_HOOK_EXPORT void fragscope_hook_stop() {
  using namespace fragscope::vgpu;
  std::lock_guard<std::mutex> lock(g_start_mutex);
  if (!g_installed) return;
  try {
    c10::SetCPUAllocator(G().inner, kPriority);
    UninstallScopeTracking();
  } catch (...) {  // nothing to undo: the wrapper forwards to the same allocator
  }
  g_installed = false;
}

/// A record_function range that allocates nothing (cpu_only.h, UserScope).
FRAGSCOPE_HOOK_EXPORT void* fragscope_user_scope_new(const char* name) {
  try {
    return new fragscope::vgpu::UserScope(name);
  } catch (...) {
    return nullptr;
  }
}
FRAGSCOPE_HOOK_EXPORT void fragscope_user_scope_enter(void* scope) {
  try {
    static_cast<fragscope::vgpu::UserScope*>(scope)->Enter();
  } catch (...) {  // a range profilers miss is no reason to stop training
  }
}
FRAGSCOPE_HOOK_EXPORT void fragscope_user_scope_exit(void* scope) {
  try {
    static_cast<fragscope::vgpu::UserScope*>(scope)->Exit();
  } catch (...) {
  }
}
FRAGSCOPE_HOOK_EXPORT void fragscope_user_scope_delete(void* scope) {
  delete static_cast<fragscope::vgpu::UserScope*>(scope);
}

/// RecordFunction scopes the CPU-only tracking saw start on this thread (benchmarks).
FRAGSCOPE_HOOK_EXPORT std::uint64_t fragscope_scopes_entered_on_this_thread() {
  return fragscope::vgpu::ScopesEnteredOnThisThread();
}
