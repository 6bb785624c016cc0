// FreeSizeIndex: the sizes of the free blocks of one pool, indexed so that every fragmentation
// metric that depends on them is O(log n) to read: the largest free block, the bytes in free
// blocks smaller than a threshold (stranded bytes), and a power-of-two histogram.
//
// Invariant: count() == Σ histogram counts == number of Add() minus Remove() calls, and
// bytes() == Σ sizes of those blocks.
//
// Thread safety: none; owned by one DeviceMemory.
#ifndef FRAGSCOPE_MODEL_FREE_SIZE_INDEX_H_
#define FRAGSCOPE_MODEL_FREE_SIZE_INDEX_H_

#include <array>
#include <cstdint>
#include <map>

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
  void Add(std::uint64_t size);
  /// REQUIRES: a block of `size` was added and not yet removed.
  void Remove(std::uint64_t size);

  std::uint64_t count() const { return count_; }
  std::uint64_t bytes() const { return bytes_; }
  /// 0 when there is no free block.
  std::uint64_t Largest() const { return sizes_.empty() ? 0 : sizes_.rbegin()->first; }
  /// Σ sizes of free blocks with size < threshold.
  std::uint64_t BytesBelow(std::uint64_t threshold) const;
  /// Number of free blocks with size < threshold.
  std::uint64_t CountBelow(std::uint64_t threshold) const;
  const SizeHistogram& histogram() const { return histogram_; }

 private:
  std::uint64_t count_ = 0;
  std::uint64_t bytes_ = 0;
  ClassFenwick class_count_;
  ClassFenwick class_bytes_;
  std::map<std::uint64_t, std::uint64_t> sizes_;  // size -> number of free blocks of that size
  SizeHistogram histogram_;
};

}  // namespace fragscope::model

#endif  // FRAGSCOPE_MODEL_FREE_SIZE_INDEX_H_
