// AllocatorRules: the few decisions of PyTorch's caching allocator that even a plain replay of
// an allocator trace needs (shared/spec/pytorch-caching-allocator.md §2, §4.1, §4.3, §4.8):
// how a request is rounded, which pool it belongs to, how big a new segment is, and whether a
// free block is split. PyTorch's trace records only the requested size of an `alloc`, so the
// block size is re-derived with these rules.
//
// Thread safety: immutable value type.
#ifndef FRAGSCOPE_MODEL_ALLOCATOR_RULES_H_
#define FRAGSCOPE_MODEL_ALLOCATOR_RULES_H_

#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "common/units.h"
#include "fragscope/event.h"
#include "fragscope/status.h"

namespace fragscope::model {

inline constexpr std::uint64_t kMinBlockSize = 512;         // every rounded size >= this
inline constexpr std::uint64_t kSmallSize = 1 * kMiB;       // <= this: small pool
inline constexpr std::uint64_t kSmallBuffer = 2 * kMiB;     // small-pool segment size
inline constexpr std::uint64_t kLargeBuffer = 20 * kMiB;    // segment for 1 MiB < s < 10 MiB
inline constexpr std::uint64_t kMinLargeAlloc = 10 * kMiB;  // from here: own rounded segment
inline constexpr std::uint64_t kRoundLarge = 2 * kMiB;      // rounding unit of large segments
inline constexpr int kRoundupIntervals = 16;
inline constexpr std::uint64_t kUnlimited = std::numeric_limits<std::uint64_t>::max();

struct AllocatorRules {
  /// max_split_size_mb in bytes; kUnlimited = never limited (PyTorch's default).
  std::uint64_t max_split_size = kUnlimited;
  /// max_non_split_rounding_mb in bytes.
  std::uint64_t max_non_split_rounding = kLargeBuffer;
  /// roundup_power2_divisions per power-of-two interval (0 or 1 = plain 512-byte rounding).
  std::array<std::uint32_t, kRoundupIntervals> roundup_power2_divisions{};
  bool expandable_segments = false;

  /// The block size PyTorch allocates for `request` bytes (§4.1).
  std::uint64_t RoundSize(std::uint64_t request) const;
  /// The pool a rounded size goes to (§4.2): <= 1 MiB small, else large.
  static Pool PoolFor(std::uint64_t rounded) {
    return rounded <= kSmallSize ? Pool::kSmall : Pool::kLarge;
  }
  /// cudaMalloc size for a rounded request (§4.3).
  static std::uint64_t SegmentSize(std::uint64_t rounded);
  /// Whether a free block of `block_size` in `pool` is split to serve `rounded` (§4.8).
  bool ShouldSplit(Pool pool, std::uint64_t block_size, std::uint64_t rounded) const;
  /// The largest request whose new segment fits in `budget_bytes` of driver memory, with
  /// 512-byte rounding (§4.3 inverted): >= 10 MiB budgets give floor(budget / 2 MiB) * 2 MiB,
  /// 2..10 MiB budgets only fit a small segment (requests <= 1 MiB), less fits nothing.
  static std::uint64_t LargestRequestForNewSegment(std::uint64_t budget_bytes);

  /// Rules from allocator settings ("key", "value") as a trace header or snapshot records them.
  /// Reads max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions and
  /// expandable_segments; other keys are ignored here (the simulator's config parser validates
  /// them all). A malformed value of a key read here is an error naming the key.
  static Result<AllocatorRules> FromSettings(
      const std::vector<std::pair<std::string, std::string>>& settings);
};

}  // namespace fragscope::model

#endif  // FRAGSCOPE_MODEL_ALLOCATOR_RULES_H_
