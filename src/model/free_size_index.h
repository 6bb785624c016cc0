// FreeSizeIndex: the sizes of the free blocks of one pool, indexed so that every fragmentation
// metric that depends on them is cheap to read and every change is O(1) in the common case:
// the largest free block, the bytes in free blocks smaller than a threshold (stranded bytes),
// and a power-of-two histogram.
//
// Layout: sizes fall into size classes (64 per power of two, see size_class.h). Each class has
// one 64-byte slot: its count and bytes and, inline, up to kInlineSizes of its exact sizes
// with their counts, so that the common update touches one cache line. A class with more
// distinct sizes keeps them in a sorted array beside the slot (a tree past kMaxFlatSizes, so
// hostile inputs cannot make updates linear). Per-octave totals and bitmasks of the non-empty
// classes and octaves make reads walk at most 64 octaves + 64 classes + the exact sizes of one
// class; the power-of-two histogram is summed from the totals when asked for.
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
  /// Distinct sizes a class holds in its slot before they move to a sorted array.
  static constexpr std::size_t kInlineSizes = 3;
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
  /// The free blocks by power of two (summed from the class totals: O(octaves + 64)).
  SizeHistogram histogram() const;

 private:
  // Class groups of 64: group g holds classes [64 g, 64 g + 64), i.e. one octave above 63.
  static constexpr int kGroups = kNumSizeClasses / kSubClasses;
  static_assert(kNumSizeClasses % kSubClasses == 0 && kGroups <= 64);

  struct SizeCount {
    std::uint64_t size;
    std::uint64_t count;
  };
  // The exact sizes of a class that outgrew its slot.
  struct Spill {
    std::vector<SizeCount> flat;                                   // sorted by size
    std::unique_ptr<std::map<std::uint64_t, std::uint64_t>> tree;  // when flat overflows
  };
  struct alignas(64) Slot {
    std::uint64_t count = 0;                // blocks in the class
    std::uint64_t bytes = 0;                // their bytes
    std::uint64_t size[kInlineSizes] = {};  // [0, inline_n): ascending, while spill is null
    std::uint32_t size_count[kInlineSizes] = {};
    std::uint32_t inline_n = 0;
    Spill* spill = nullptr;  // owned; set while the class holds more than kInlineSizes sizes
  };
  static_assert(sizeof(Slot) == 64);
  struct Totals {
    std::uint64_t count = 0;
    std::uint64_t bytes = 0;
  };

  static void AddExact(Slot& slot, std::uint64_t size);
  static void RemoveExact(Slot& slot, std::uint64_t size);
  static void SpillAdd(Spill& spill, std::uint64_t size);
  static void SpillRemove(Spill& spill, std::uint64_t size);
  void FreeSpills();
  // Σ (count, bytes) of the sizes of class c that are < threshold.
  Totals ExactBelow(int c, std::uint64_t threshold) const;
  Totals Below(std::uint64_t threshold) const;

  std::uint64_t count_ = 0;
  std::uint64_t bytes_ = 0;
  // Slots by class, one array of kSubClasses per group (octave), made when a size of it is first
  // added: all 3,776 classes were 241 KB per index, 566 KB per device of an analysis, and
  // `replay` of a trace of 4,096 devices peaked at 3.0 GB (issue 30 item 5). A group whose bit is
  // set in group_mask_ (or a class in class_mask_) has its array.
  std::array<std::unique_ptr<Slot[]>, kGroups> groups_;
  std::array<Totals, kGroups> group_totals_{};
  std::uint64_t group_mask_ = 0;                     // bit g: group g non-empty
  std::array<std::uint64_t, kGroups> class_mask_{};  // bit i of [g]: class 64 g + i non-empty
};

}  // namespace fragscope::model

#endif  // FRAGSCOPE_MODEL_FREE_SIZE_INDEX_H_
