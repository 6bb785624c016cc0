// FreeSizeIndex: the sizes of the free blocks of one pool, indexed so that every fragmentation
// metric that depends on them is cheap to read and every change is O(1) in the common case:
// the largest free block, the bytes in free blocks smaller than a threshold (stranded bytes),
// and a power-of-two histogram.
//
// Layout: sizes fall into size classes (64 per power of two, see size_class.h). Each class
// keeps its exact sizes with their counts in a small sorted array (a tree once a class holds
// more than kMaxFlatSizes distinct sizes, so hostile inputs cannot make updates linear), and
// per-class and per-octave totals with bitmasks of the non-empty ones. Reads walk at most
// 64 octaves + 64 classes + the exact sizes of one class.
//
// Invariant: count() == Σ class counts == Σ histogram counts == Add() calls − Remove() calls,
// and bytes() == Σ sizes of those blocks.
//
// Thread safety: none; owned by one DeviceMemory.
#ifndef FRAGSCOPE_MODEL_FREE_SIZE_INDEX_H_
#define FRAGSCOPE_MODEL_FREE_SIZE_INDEX_H_

#include <array>
#include <bit>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "model/size_class.h"

namespace fragscope::model {

/// Power-of-two buckets: bucket b holds sizes in [2^b, 2^(b+1)).
inline constexpr int kHistogramBuckets = 64;
struct SizeHistogram {
  std::array<std::uint64_t, kHistogramBuckets> count{};
  std::array<std::uint64_t, kHistogramBuckets> bytes{};
};
inline int HistogramBucket(std::uint64_t size) {
  return size == 0 ? 0 : 63 - std::countl_zero(size);
}

class FreeSizeIndex {
 public:
  /// A class switches from a sorted array to a tree past this many distinct sizes.
  static constexpr std::size_t kMaxFlatSizes = 256;

  FreeSizeIndex();
  ~FreeSizeIndex();
  FreeSizeIndex(FreeSizeIndex&&) noexcept;
  FreeSizeIndex& operator=(FreeSizeIndex&&) noexcept;

  void Add(std::uint64_t size);
  /// REQUIRES: a block of `size` was added and not yet removed.
  void Remove(std::uint64_t size);

  std::uint64_t count() const { return count_; }
  std::uint64_t bytes() const { return bytes_; }
  /// 0 when there is no free block.
  std::uint64_t Largest() const;
  /// Σ sizes of free blocks with size < threshold.
  std::uint64_t BytesBelow(std::uint64_t threshold) const;
  /// Number of free blocks with size < threshold.
  std::uint64_t CountBelow(std::uint64_t threshold) const;
  const SizeHistogram& histogram() const { return histogram_; }

 private:
  // Class groups of 64: group g holds classes [64 g, 64 g + 64), i.e. one octave above 63.
  static constexpr int kGroups = kNumSizeClasses / kSubClasses;
  static_assert(kNumSizeClasses % kSubClasses == 0 && kGroups <= 64);

  struct SizeCount {
    std::uint64_t size;
    std::uint64_t count;
  };
  struct ClassSizes {
    std::vector<SizeCount> flat;                                   // sorted by size
    std::unique_ptr<std::map<std::uint64_t, std::uint64_t>> tree;  // when flat overflows
  };
  struct Totals {
    std::uint64_t count = 0;
    std::uint64_t bytes = 0;
  };

  void AddExact(ClassSizes& sizes, std::uint64_t size);
  void RemoveExact(ClassSizes& sizes, std::uint64_t size);
  // Σ (count, bytes) of the sizes of class c that are < threshold.
  Totals ExactBelow(int c, std::uint64_t threshold) const;
  Totals Below(std::uint64_t threshold) const;

  std::uint64_t count_ = 0;
  std::uint64_t bytes_ = 0;
  std::vector<ClassSizes> sizes_;     // by class
  std::vector<Totals> class_totals_;  // by class
  std::array<Totals, kGroups> group_totals_{};
  std::uint64_t group_mask_ = 0;                     // bit g: group g non-empty
  std::array<std::uint64_t, kGroups> class_mask_{};  // bit i of [g]: class 64 g + i non-empty
  SizeHistogram histogram_;
};

}  // namespace fragscope::model

#endif  // FRAGSCOPE_MODEL_FREE_SIZE_INDEX_H_
