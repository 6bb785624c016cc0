// VirtualGpu: the live hook of `fragscope.torch.virtual_gpu` (docs/virtual-gpu.md). It replaces
// c10's CPU allocator with a wrapper: every storage allocation and free of the process, in the
// order they happen, also goes to a CachingAllocatorSim of the chosen capacity and settings,
// which decides what PyTorch's CUDA caching allocator would have done. The memory itself still
// comes from the wrapped CPU allocator.
//
//   * Allocations a GPU run would make on the CPU too (wrapped scalars, optimizer step counters,
//     record_function handles: cpu_only.h) pass through without reaching the simulator, unless
//     VirtualGpuOptions::keep_cpu_only. Zero-byte allocations never reach it either (PyTorch's
//     CUDA allocator hands out a null pointer for them).
//   * Storages allocated before Start (or by a previous session) are freed by the deleter they
//     were made with; the simulator never sees them.
//   * At the request that would fail: with kRaise, allocate() throws c10::OutOfMemoryError with
//     the simulator's text (PyTorch's message), which Python sees as torch.cuda.OutOfMemoryError;
//     with kRecord the OOM is counted and the tensor lives on the CPU, outside the simulation.
//   * Threads: one mutex serializes the simulator, so every thread's calls enter it in one
//     order. Fork: a child process (a DataLoader worker) stops simulating; its allocations and
//     frees go straight to the CPU allocator (pthread_atfork keeps the mutex usable there).
//
// Thread safety: every function may be called from any thread.
#ifndef FRAGSCOPE_PYTHON_NATIVE_VIRTUAL_GPU_H_
#define FRAGSCOPE_PYTHON_NATIVE_VIRTUAL_GPU_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cpu_only.h"
#include "fragscope/event.h"
#include "fragscope/status.h"
#include "model/caching_allocator_sim.h"

namespace fragscope::vgpu {

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

/// Starts a session: installs the wrapper (once per process) and a new simulator. Fails with
/// kFailedPrecondition if a session is running, or in a forked child.
Status Start(const VirtualGpuOptions& options);
/// Ends the session: the simulator stops receiving calls but keeps its state for inspection
/// until the next Start. Live storages of the session are later freed without it.
void Stop();
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

#endif  // FRAGSCOPE_PYTHON_NATIVE_VIRTUAL_GPU_H_
