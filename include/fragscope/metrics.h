// Fragmentation metrics of one device, per pool and in total. docs/metrics.md defines every
// field with its formula and a worked example; every number fragscope prints is one of these.
//
// Thread safety: plain value types.
#ifndef FRAGSCOPE_METRICS_H_
#define FRAGSCOPE_METRICS_H_

#include <cstdint>
#include <optional>

namespace fragscope {

struct PoolMetrics {
  std::uint64_t reserved_bytes = 0;        // Σ segment sizes
  std::uint64_t allocated_bytes = 0;       // Σ sizes of allocated blocks
  std::uint64_t active_bytes = 0;          // allocated + pending-free blocks
  std::uint64_t requested_bytes = 0;       // Σ requested bytes of allocated blocks
  std::uint64_t cached_free_bytes = 0;     // reserved − allocated
  double fragmentation_ratio = 0;          // cached_free / reserved (0 when reserved == 0)
  std::uint64_t largest_free_block = 0;    // largest free (cached, not pending) block
  double external_fragmentation = 0;       // 1 − largest_free / cached_free (0 when no cache)
  std::uint64_t internal_waste_bytes = 0;  // allocated − requested
  std::uint64_t stranded_bytes = 0;        // free bytes in blocks < stranded_threshold
  std::uint64_t stranded_threshold = 0;    // the size a free block must reach to be useful
  std::uint64_t releasable_bytes = 0;      // segments that are one free block (empty_cache frees)
  std::uint64_t segment_count = 0;
  std::uint64_t block_count = 0;  // allocated + pending + free blocks
  std::uint64_t allocated_block_count = 0;
  std::uint64_t pending_free_block_count = 0;
  std::uint64_t free_block_count = 0;
};

struct DeviceMetrics {
  std::int32_t device = 0;
  PoolMetrics all;
  PoolMetrics small_pool;  // blocks of rounded size <= 1 MiB, 2 MiB segments
  PoolMetrics large_pool;
  /// The largest single request that would succeed now without an OOM under the allocator's
  /// rules: from cached blocks, or (when the device's free memory is known) from a new
  /// segment after releasing the fully free cached segments, as the release-and-retry path does.
  std::uint64_t max_allocatable = 0;
  /// The cached-blocks-only part of max_allocatable.
  std::uint64_t max_allocatable_cached = 0;
  /// Driver-free bytes: capacity − used_by_others − reserved, when the capacity is known.
  std::optional<std::uint64_t> device_free_bytes;
  std::uint64_t num_ooms = 0;
};

}  // namespace fragscope

#endif  // FRAGSCOPE_METRICS_H_
