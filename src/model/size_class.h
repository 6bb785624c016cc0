// Size classes: 64 classes per power of two (1/64 octave, at most 1.6% wide), exact below 64.
// Used to index free blocks and request sizes by class, so prefix sums ("bytes in free blocks
// smaller than T") and quantiles cost a scan of class totals, never a scan of all blocks.
#ifndef FRAGSCOPE_MODEL_SIZE_CLASS_H_
#define FRAGSCOPE_MODEL_SIZE_CLASS_H_

#include <array>
#include <bit>
#include <cstdint>
#include <vector>

namespace fragscope::model {

inline constexpr int kSubClassBits = 6;
inline constexpr int kSubClasses = 1 << kSubClassBits;
/// Classes 0..63 are the sizes 0..63; then 64 per octave from 2^6 up to 2^63.
inline constexpr int kNumSizeClasses = kSubClasses + (64 - kSubClassBits) * kSubClasses;

/// The class of `size`. Monotonic: a <= b implies SizeClass(a) <= SizeClass(b).
constexpr int SizeClass(std::uint64_t size) {
  if (size < kSubClasses) return static_cast<int>(size);
  const int e = 63 - std::countl_zero(size);  // 2^e <= size < 2^(e+1), e >= 6
  const int sub = static_cast<int>((size >> (e - kSubClassBits)) & (kSubClasses - 1));
  return (e - kSubClassBits + 1) * kSubClasses + sub;
}

/// The smallest size in class `c`: SizeClass(ClassFloor(c)) == c.
constexpr std::uint64_t ClassFloor(int c) {
  if (c < kSubClasses) return static_cast<std::uint64_t>(c);
  const int e = c / kSubClasses + kSubClassBits - 1;
  const std::uint64_t sub = static_cast<std::uint64_t>(c % kSubClasses);
  return (std::uint64_t{1} << e) | (sub << (e - kSubClassBits));
}

/// Counts per size class, with a total per group of 64 classes (one octave): Add is two
/// increments, PrefixSum and FindByRank scan at most 59 group totals and 64 counts. Adds run for
/// every request; the queries once per timeline window (a Fenwick tree, as before, made the
/// adds cost 12 dependent steps each for queries nobody asked for in between). A group's 64
/// counts are made when a size of it is first added: requests span a few octaves, and every
/// device of a trace keeps three of these (all 3,776 counts up front were 30 KB each, most of
/// the memory per device of a 4,096-device trace; issue 30 item 5).
class ClassCounts {
 public:
  void Add(int c, std::int64_t delta) {
    std::vector<std::uint64_t>& counts = counts_[static_cast<std::size_t>(c >> kSubClassBits)];
    if (counts.empty()) counts.assign(kSubClasses, 0);
    counts[static_cast<std::size_t>(c & (kSubClasses - 1))] += static_cast<std::uint64_t>(delta);
    groups_[static_cast<std::size_t>(c >> kSubClassBits)] += static_cast<std::uint64_t>(delta);
  }
  /// Sum over classes [0, c).
  std::uint64_t PrefixSum(int c) const {
    std::uint64_t sum = 0;
    const int full = c >> kSubClassBits;
    for (int g = 0; g < full; ++g) sum += groups_[static_cast<std::size_t>(g)];
    if (full < kGroups) {
      const std::vector<std::uint64_t>& counts = counts_[static_cast<std::size_t>(full)];
      if (!counts.empty()) {
        for (int i = 0; i < (c & (kSubClasses - 1)); ++i) {
          sum += counts[static_cast<std::size_t>(i)];
        }
      }
    }
    return sum;
  }
  /// The smallest class c such that PrefixSum(c + 1) > rank (rank counts from 0), or
  /// kNumSizeClasses when the total is <= rank.
  int FindByRank(std::uint64_t rank) const {
    int g = 0;
    for (; g < kGroups; ++g) {
      const std::uint64_t n = groups_[static_cast<std::size_t>(g)];
      if (n > rank) break;
      rank -= n;
    }
    if (g == kGroups) return kNumSizeClasses;
    // The group holds more than `rank` counts, so its counts were made.
    const std::vector<std::uint64_t>& counts = counts_[static_cast<std::size_t>(g)];
    int i = 0;
    for (; counts[static_cast<std::size_t>(i)] <= rank; ++i) {
      rank -= counts[static_cast<std::size_t>(i)];
    }
    return (g << kSubClassBits) + i;
  }

 private:
  static constexpr int kGroups = kNumSizeClasses / kSubClasses;
  std::array<std::vector<std::uint64_t>, kGroups> counts_;  // empty: every count is 0
  std::array<std::uint64_t, kGroups> groups_{};
};
static_assert(kNumSizeClasses % kSubClasses == 0);

}  // namespace fragscope::model

#endif  // FRAGSCOPE_MODEL_SIZE_CLASS_H_
