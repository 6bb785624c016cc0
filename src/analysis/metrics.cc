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

  // Cached blocks: a large-pool block serves requests > 1 MiB up to its own size; small-pool
  // requests are <= 1 MiB (§4.2). Either serves a request as large as itself (§4.4).
  const std::uint64_t from_large =
      l.largest_free_block > model::kSmallSize ? l.largest_free_block : 0;
  const std::uint64_t from_small = std::min(s.largest_free_block, model::kSmallSize);
  d.max_allocatable_cached = std::max(from_large, from_small);
  d.max_allocatable = d.max_allocatable_cached;
  if (inputs.capacity_bytes) {
    const std::uint64_t used = inputs.used_by_others_bytes + a.reserved_bytes;
    const std::uint64_t free = *inputs.capacity_bytes > used ? *inputs.capacity_bytes - used : 0;
    d.device_free_bytes = free;
    // After a failed cudaMalloc the allocator frees every fully free cached segment and
    // retries (§4.7), so those bytes count towards a new segment too.
    const std::uint64_t budget = free + a.releasable_bytes;
    d.max_allocatable =
        std::max(d.max_allocatable, model::AllocatorRules::LargestRequestForNewSegment(budget));
  }
  d.num_ooms = memory.num_ooms();
  return d;
}

}  // namespace fragscope::analysis
