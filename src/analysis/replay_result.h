// ReplayResult: what `fragscope replay` found besides the analysis of the simulated allocator
// trace: per device the simulator's memory_stats() and segments, and the OOMs with PyTorch's
// messages. Plain values for the sinks.
#ifndef FRAGSCOPE_ANALYSIS_REPLAY_RESULT_H_
#define FRAGSCOPE_ANALYSIS_REPLAY_RESULT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "analysis/fidelity.h"
#include "model/caching_allocator_sim.h"
#include "model/request_replayer.h"

namespace fragscope::analysis {

/// The capacity of a virtual GPU that never runs out (1 PiB): replays of snapshots, which do
/// not record the device's size, use it unless told --capacity.
inline constexpr std::uint64_t kUnlimitedCapacity = std::uint64_t{1} << 50;

struct DeviceReplay {
  std::int32_t device = 0;
  std::uint64_t capacity_bytes = 0;
  std::uint64_t used_by_others_bytes = 0;
  std::string alloc_conf;  // canonical PYTORCH_CUDA_ALLOC_CONF of the simulator at the end
  std::map<std::string, std::int64_t> memory_stats;  // PyTorch's key names
  std::vector<model::SnapshotSegment> segments;      // torch.cuda.memory_snapshot() shape
};

struct ReplayResult {
  std::string trace;
  /// Which allocator model ran: "pytorch" (CachingAllocatorSim) or "bfc" (BfcAllocatorSim,
  /// whose memory_stats carry TensorFlow's / JAX's names and whose OOM messages are
  /// TensorFlow's).
  std::string allocator = "pytorch";
  model::OomPolicy policy = model::OomPolicy::kStop;
  bool stopped_at_oom = false;       // the replay ended at the first OOM (policy kStop)
  std::uint64_t request_events = 0;  // request events replayed
  std::vector<DeviceReplay> devices;
  std::vector<model::ReplayOom> ooms;
  /// Replays of a snapshot: the recorded run against the simulation, per device.
  std::vector<DeviceFidelity> fidelity;
  std::vector<std::string> notes;
};

}  // namespace fragscope::analysis

#endif  // FRAGSCOPE_ANALYSIS_REPLAY_RESULT_H_
