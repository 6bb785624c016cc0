// Request-size statistics: SizeProfile (every request of a run: histogram, quantiles, most
// frequent sizes) and RequestWindow (the last W requests of one pool, whose quantile is the
// stranding threshold: a free block smaller than what recent requests ask for is stranded).
//
// Thread safety: none.
#ifndef FRAGSCOPE_ANALYSIS_SIZE_PROFILE_H_
#define FRAGSCOPE_ANALYSIS_SIZE_PROFILE_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "model/free_size_index.h"
#include "model/size_class.h"

namespace fragscope::analysis {

/// The last `capacity` request sizes.
class RequestWindow {
 public:
  explicit RequestWindow(std::size_t capacity);
  void Add(std::uint64_t size);
  /// The q-quantile (0 <= q <= 1) of the sizes in the window, rounded down to its size class
  /// (at most 1.6% below the exact value); 0 when empty. O(classes / 64 + 64).
  std::uint64_t Quantile(double q) const;
  std::size_t size() const { return count_; }

 private:
  std::size_t capacity_;
  std::vector<std::uint64_t> ring_;  // grows to capacity_, then overwritten from next_
  std::size_t next_ = 0;
  std::size_t count_ = 0;
  model::ClassCounts classes_;
};

struct SizeCount {
  std::uint64_t size = 0;
  std::uint64_t count = 0;
};

/// Every request of a run.
class SizeProfile {
 public:
  /// Distinct sizes tracked exactly; beyond this, quantiles fall back to size classes.
  static constexpr std::size_t kMaxDistinctSizes = std::size_t{1} << 20;

  void Add(std::uint64_t size);
  /// Optional hint that Add(size) comes soon: loads its slot of the exact-size table.
  void Prefetch(std::uint64_t size) const {
    if (!table_.empty()) __builtin_prefetch(&table_[Slot(size)]);
  }
  std::uint64_t count() const { return count_; }
  std::uint64_t bytes() const { return bytes_; }
  std::uint64_t min() const { return count_ ? min_ : 0; }
  std::uint64_t max() const { return max_; }
  /// The smallest size s such that at least q of the requests are <= s. Exact while the
  /// number of distinct sizes is <= kMaxDistinctSizes (exact() is true), else a size-class floor.
  std::uint64_t Quantile(double q) const;
  bool exact() const { return !overflowed_; }
  std::size_t distinct_sizes() const { return distinct_; }
  /// The n most frequent sizes, most frequent first (ties: larger size first).
  std::vector<SizeCount> TopSizes(std::size_t n) const;
  const model::SizeHistogram& histogram() const { return histogram_; }

 private:
  // The exact counts: open addressing with linear probing, at most half full, kEmpty = free.
  // Add() runs for every alloc event, and a run with many distinct sizes misses the cache
  // here; the count sits in the slot, so that is one miss, which Prefetch() can hide.
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};  // a free slot's size
  std::size_t Slot(std::uint64_t size) const {
    const std::uint64_t h = size * 0x9e3779b97f4a7c15ULL;
    return static_cast<std::size_t>(h ^ (h >> 32)) & (table_.size() - 1);
  }
  void Grow();
  std::vector<SizeCount> Counted() const;  // the occupied slots

  std::uint64_t count_ = 0, bytes_ = 0, min_ = ~std::uint64_t{0}, max_ = 0;
  std::vector<SizeCount> table_;
  std::size_t distinct_ = 0;
  bool overflowed_ = false;
  model::ClassCounts classes_;
  model::SizeHistogram histogram_;
};

}  // namespace fragscope::analysis

#endif  // FRAGSCOPE_ANALYSIS_SIZE_PROFILE_H_
