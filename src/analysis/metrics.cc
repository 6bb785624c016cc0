#include "analysis/metrics.h"

#include <algorithm>

namespace fragscope::analysis {

namespace {

PoolMetrics FromCounters(const model::PoolCounters& c, std::uint64_t threshold) {
  PoolMetrics m;
  m.reserved_bytes = c.reserved;
  m.allocated_bytes = c.allocated;
  m.active_bytes = c.active;
  m.requested_bytes = c.requested;
  m.cached_free_bytes = c.reserved - c.allocated;
  m.largest_free_block = c.free.Largest();
  m.internal_waste_bytes = c.allocated - c.requested;
  m.stranded_threshold = threshold;
  m.stranded_bytes = c.free.BytesBelow(threshold);
  m.releasable_bytes = c.releasable;
  m.segment_count = c.segment_count;
  m.allocated_block_count = c.allocated_count;
  m.pending_free_block_count = c.pending_count;
  m.free_block_count = c.free.count();
  m.block_count = c.allocated_count + c.pending_count + c.free.count();
  return m;
}

void FinishRatios(PoolMetrics& m) {
  m.fragmentation_ratio = m.reserved_bytes == 0 ? 0.0
                                                : static_cast<double>(m.cached_free_bytes) /
                                                      static_cast<double>(m.reserved_bytes);
  m.external_fragmentation = m.cached_free_bytes == 0
                                 ? 0.0
                                 : 1.0 - static_cast<double>(m.largest_free_block) /
                                             static_cast<double>(m.cached_free_bytes);
}

}  // namespace

std::uint64_t LargePoolThreshold(std::uint64_t quantile) {
  return std::max(quantile, model::kSmallSize + 1);
}

Allocatable ComputeAllocatable(const model::DeviceMemory& memory,
                               std::optional<std::uint64_t> capacity_bytes,
                               std::uint64_t used_by_others_bytes) {
  const model::PoolCounters& s = memory.pool(Pool::kSmall);
  const model::PoolCounters& l = memory.pool(Pool::kLarge);
  const std::uint64_t largest_small = s.free.Largest();
  const std::uint64_t largest_large = l.free.Largest();
  Allocatable a;
  a.largest_free_block = std::max(largest_small, largest_large);
  // Cached blocks: a large-pool block serves requests > 1 MiB up to its own size; small-pool
  // requests are <= 1 MiB (§4.2). Either serves a request as large as itself (§4.4).
  const std::uint64_t from_large = largest_large > model::kSmallSize ? largest_large : 0;
  const std::uint64_t from_small = std::min(largest_small, model::kSmallSize);
  a.max_allocatable_cached = std::max(from_large, from_small);
  a.max_allocatable = a.max_allocatable_cached;
  if (capacity_bytes) {
    const std::uint64_t used = used_by_others_bytes + s.reserved + l.reserved;
    const std::uint64_t free = *capacity_bytes > used ? *capacity_bytes - used : 0;
    a.device_free_bytes = free;
    // After a failed cudaMalloc the allocator frees every fully free cached segment and
    // retries (§4.7), so those bytes count towards a new segment too.
    const std::uint64_t budget = free + s.releasable + l.releasable;
    a.max_allocatable =
        std::max(a.max_allocatable, model::AllocatorRules::LargestRequestForNewSegment(budget));
  }
  return a;
}

DeviceMetrics ComputeMetrics(const model::DeviceMemory& memory, const MetricsInputs& inputs) {
  DeviceMetrics d;
  d.device = memory.device();
  d.small_pool = FromCounters(memory.pool(Pool::kSmall), inputs.small_threshold);
  d.large_pool = FromCounters(memory.pool(Pool::kLarge), inputs.large_threshold);
  const PoolMetrics& s = d.small_pool;
  const PoolMetrics& l = d.large_pool;
  PoolMetrics& a = d.all;
  a.reserved_bytes = s.reserved_bytes + l.reserved_bytes;
  a.allocated_bytes = s.allocated_bytes + l.allocated_bytes;
  a.active_bytes = s.active_bytes + l.active_bytes;
  a.requested_bytes = s.requested_bytes + l.requested_bytes;
  a.cached_free_bytes = s.cached_free_bytes + l.cached_free_bytes;
  a.largest_free_block = std::max(s.largest_free_block, l.largest_free_block);
  a.internal_waste_bytes = s.internal_waste_bytes + l.internal_waste_bytes;
  a.stranded_bytes = s.stranded_bytes + l.stranded_bytes;
  a.stranded_threshold = 0;  // per pool only
  a.releasable_bytes = s.releasable_bytes + l.releasable_bytes;
  a.segment_count = s.segment_count + l.segment_count;
  a.block_count = s.block_count + l.block_count;
  a.allocated_block_count = s.allocated_block_count + l.allocated_block_count;
  a.pending_free_block_count = s.pending_free_block_count + l.pending_free_block_count;
  a.free_block_count = s.free_block_count + l.free_block_count;
  FinishRatios(d.small_pool);
  FinishRatios(d.large_pool);
  FinishRatios(a);

  const Allocatable can =
      ComputeAllocatable(memory, inputs.capacity_bytes, inputs.used_by_others_bytes);
  d.max_allocatable_cached = can.max_allocatable_cached;
  d.max_allocatable = can.max_allocatable;
  if (can.device_free_bytes) d.device_free_bytes = *can.device_free_bytes;
  d.num_ooms = memory.num_ooms();
  return d;
}

}  // namespace fragscope::analysis
