// Size classes: 64 classes per power of two (1/64 octave, at most 1.6% wide), exact below 64.
// Used to index free blocks and request sizes with Fenwick trees, so prefix sums ("bytes in
// free blocks smaller than T") and quantiles cost O(log classes), never a scan of all blocks.
#ifndef FRAGSCOPE_MODEL_SIZE_CLASS_H_
#define FRAGSCOPE_MODEL_SIZE_CLASS_H_

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

/// A Fenwick (binary indexed) tree of sums over size classes.
class ClassFenwick {
 public:
  ClassFenwick() : tree_(kNumSizeClasses + 1, 0) {}
  void Add(int c, std::int64_t delta) {
    for (int i = c + 1; i <= kNumSizeClasses; i += i & -i) {
      tree_[static_cast<std::size_t>(i)] += static_cast<std::uint64_t>(delta);
    }
  }
  /// Sum over classes [0, c).
  std::uint64_t PrefixSum(int c) const {
    std::uint64_t sum = 0;
    for (int i = c; i > 0; i -= i & -i) sum += tree_[static_cast<std::size_t>(i)];
    return sum;
  }
  /// The smallest class c such that PrefixSum(c + 1) > rank (rank counts from 0), or
  /// kNumSizeClasses when the total is <= rank.
  int FindByRank(std::uint64_t rank) const {
    int pos = 0;
    for (int step = 1 << 11; step > 0; step >>= 1) {
      const int next = pos + step;
      if (next <= kNumSizeClasses && tree_[static_cast<std::size_t>(next)] <= rank) {
        pos = next;
        rank -= tree_[static_cast<std::size_t>(next)];
      }
    }
    return pos;  // classes [0, pos) hold <= original rank items
  }

 private:
  std::vector<std::uint64_t> tree_;
};
static_assert((1 << 11) <= kNumSizeClasses && kNumSizeClasses < (1 << 12));

}  // namespace fragscope::model

#endif  // FRAGSCOPE_MODEL_SIZE_CLASS_H_
