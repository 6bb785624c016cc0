// VirtualGpu session: the torch-free half of `fragscope.torch.virtual_gpu` (docs/virtual-gpu.md).
// It owns the simulation: a CachingAllocatorSim of the chosen capacity and settings that
// receives, through the C table of vgpu_api.h, every storage allocation and free the c10 hook
// (fragscope/torch/csrc, compiled against the torch the user runs) sees, in the order they
// happen, and decides what PyTorch's CUDA caching allocator would have done.
//
//   * CPU-only allocations (classified by the hook) and zero-byte ones are counted, never
//     simulated, unless VirtualGpuOptions::keep_cpu_only.
//   * At the request that would fail: with kRaise the hook throws c10::OutOfMemoryError with
//     the simulator's text (PyTorch's message); with kRecord the OOM is counted and the tensor
//     lives on the CPU, outside the simulation.
//   * A block of an earlier session freed later is ignored.
//
// Thread safety: every function may be called from any thread; one mutex serializes the
// simulator, so every thread's calls enter it in one order. After fork() the child's copy of
// the mutex is usable (pthread_atfork); the hook stops sending there.
#ifndef FRAGSCOPE_PYTHON_NATIVE_VGPU_SESSION_H_
#define FRAGSCOPE_PYTHON_NATIVE_VGPU_SESSION_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "fragscope/event.h"
#include "fragscope/status.h"
#include "model/caching_allocator_sim.h"
#include "vgpu_api.h"

namespace fragscope::vgpu {

inline constexpr int kNumCpuOnlyKinds = FRAGSCOPE_CPU_ONLY_KINDS;
/// "python_scalar", "op_scalar", "scalar_promotion", "adam_step_counter", "record_function"
/// for kinds 1..5 (the hook's cpu_only.h), "none" for 0.
const char* CpuOnlyKindName(int kind);

enum class OnOom : std::uint8_t { kRaise, kRecord };

struct VirtualGpuOptions {
  model::SimOptions sim;   // capacity, settings, torch version
  std::string alloc_conf;  // as given, for the trace header
  OnOom on_oom = OnOom::kRaise;
  bool keep_cpu_only = false;  // send CPU-only allocations to the simulator too
  bool record_trace = true;    // keep request and allocator events for DumpTrace/snapshots
};

/// A request event as the trace records it: alloc/free_requested of a program id, or a step.
struct RequestRecord {
  Action action = Action::kAlloc;
  std::uint64_t id = 0;    // alloc/free: the allocation's id (1, 2, ... in allocation order)
  std::uint64_t size = 0;  // alloc/free: requested bytes; step: the step number
};

/// An event of the simulated allocator, as much of it as a snapshot's device_traces shows.
struct AllocatorEvent {
  Action action = Action::kAlloc;
  bool has_device_free = false;
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
  std::uint64_t device_free = 0;  // oom
  std::int64_t step = 0;          // step markers
  std::int64_t time_us = 0;       // wall clock, microseconds since the Unix epoch
};

struct OomRecord {
  std::uint64_t request_index = 0;  // index among the request events (step markers included)
  std::int64_t step = -1;
  model::OomDetails details;
  /// memory_stats() and memory_snapshot() at the failed request, after the release-and-retry
  /// path: what a job that dies of the error, or a replay that stops there, ends with.
  std::map<std::string, std::int64_t> stats;
  std::vector<model::SnapshotSegment> segments;
};

/// Counts of what the hook saw, for reports and tests.
struct HookCounters {
  std::uint64_t allocs = 0;         // sent to the simulator (including failed ones)
  std::uint64_t frees = 0;          // sent to the simulator
  std::uint64_t zero_size = 0;      // passed through
  std::uint64_t foreign_frees = 0;  // frees of storages made before the session (never seen)
  std::uint64_t after_oom = 0;      // kRecord: allocations that failed and live on the CPU
  std::uint64_t cpu_only[kNumCpuOnlyKinds] = {};  // passed through, per kind
  std::uint64_t threads = 0;  // distinct threads that allocated through the hook
};

/// Starts a session with a new simulator; the hook is started separately with Api(). Fails
/// with kInvalidArgument if a session is running, or in a forked child.
Status Start(const VirtualGpuOptions& options);
/// Ends the session: the simulator stops receiving calls but keeps its state for inspection
/// until the next Start. Live storages of the session are later freed without it.
void Stop();
/// The table the hook calls (vgpu_api.h); valid for the life of the process.
const FragscopeVgpuApi* Api();
bool Active();

/// A step marker: the events that follow belong to step `step` (-1: the next one).
void MarkStep(std::int64_t step);

/// Under the lock, a copy of the simulator's figures (last session's, if stopped).
std::map<std::string, std::int64_t> MemoryStats();
std::vector<model::SnapshotSegment> MemorySnapshot();
/// (free, total) as cudaMemGetInfo: capacity − reserved − used by others, capacity.
std::pair<std::uint64_t, std::uint64_t> MemGetInfo();
void ResetPeakStats();
void ResetAccumulatedStats();
void EmptyCache();
Status SetMemoryFraction(double fraction);
std::vector<OomRecord> Ooms();
HookCounters Counters();
std::string AllocConfCanonical();
/// The request events (kind: request) and the allocator events the simulator produced.
std::vector<RequestRecord> RequestTrace();
std::vector<AllocatorEvent> AllocatorTrace();
/// Fails with kInvalidArgument when no session was ever started.
Status HasSession();

}  // namespace fragscope::vgpu

#endif  // FRAGSCOPE_PYTHON_NATIVE_VGPU_SESSION_H_
