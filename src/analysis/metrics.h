// ComputeMetrics: the fragmentation metrics of one DeviceMemory, read from the counters and
// free-size indexes it keeps current: O(log n), never a scan of the blocks.
#ifndef FRAGSCOPE_ANALYSIS_METRICS_H_
#define FRAGSCOPE_ANALYSIS_METRICS_H_

#include <cstdint>
#include <optional>

#include "fragscope/metrics.h"
#include "model/device_memory.h"

namespace fragscope::analysis {

struct MetricsInputs {
  /// Free blocks smaller than these are stranded (see docs/metrics.md, stranded_bytes).
  std::uint64_t small_threshold = 0;
  std::uint64_t large_threshold = 0;
  /// Device capacity and memory used outside this allocator, when known.
  std::optional<std::uint64_t> capacity_bytes;
  std::uint64_t used_by_others_bytes = 0;
};

DeviceMetrics ComputeMetrics(const model::DeviceMemory& memory, const MetricsInputs& inputs);

/// The largest free block of either pool and `max_allocatable` (docs/metrics.md) alone, as
/// ComputeMetrics gives them: O(1) from the counters, cheap enough for every event.
struct Allocatable {
  std::uint64_t largest_free_block = 0;
  std::uint64_t max_allocatable_cached = 0;
  std::uint64_t max_allocatable = 0;
  std::optional<std::uint64_t> device_free_bytes;  // with a capacity
};
Allocatable ComputeAllocatable(const model::DeviceMemory& memory,
                               std::optional<std::uint64_t> capacity_bytes,
                               std::uint64_t used_by_others_bytes);

/// The stranding threshold of the large pool never goes below 1 MiB + 1 byte: large-pool
/// requests are > 1 MiB, so a large-pool free block of <= 1 MiB can serve nothing.
std::uint64_t LargePoolThreshold(std::uint64_t quantile);

}  // namespace fragscope::analysis

#endif  // FRAGSCOPE_ANALYSIS_METRICS_H_
