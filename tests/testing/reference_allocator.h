// ReferenceAllocator: a deliberately naive model of PyTorch's caching allocator, for tests
// only. Segments are plain vectors of blocks, searched linearly; no index, no counters. It
// exists so that DeviceMemory (and later CachingAllocatorSim) can be compared, event by event,
// with something too simple to be wrong in the same way. Default settings, one stream; an
// optional device capacity with PyTorch's release-everything-and-retry step before an OOM.
// Segments go at the lowest 2 MiB-aligned address from kBaseAddress where they fit, as
// CachingAllocatorSim documents.
#ifndef FRAGSCOPE_TESTS_TESTING_REFERENCE_ALLOCATOR_H_
#define FRAGSCOPE_TESTS_TESTING_REFERENCE_ALLOCATOR_H_

#include <cstdint>
#include <vector>

#include "fragscope/event.h"

namespace fragscope::testing {

struct RefBlock {
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
  std::uint64_t requested = 0;
  bool allocated = false;
};

struct RefSegment {
  std::uint64_t addr = 0;
  bool small = false;
  std::vector<RefBlock> blocks;  // address order, tiling the segment
};

class ReferenceAllocator {
 public:
  static constexpr std::uint64_t kBaseAddress = 0x7f0000000000;
  static constexpr std::uint64_t kUnlimited = ~std::uint64_t{0};

  explicit ReferenceAllocator(std::uint64_t capacity = kUnlimited) : capacity_(capacity) {}

  /// Allocates `request` bytes; appends the allocator events (segment_free* on a retry,
  /// segment_alloc?, alloc) to *out and returns the block address, or 0 when the device is
  /// out of memory.
  std::uint64_t Malloc(std::uint64_t request, std::vector<Event>* out);
  /// Frees the block at `addr`; appends free_requested and free_completed.
  void Free(std::uint64_t addr, std::vector<Event>* out);
  /// Releases every segment that is one free block; appends segment_free events.
  void EmptyCache(std::vector<Event>* out);

  const std::vector<RefSegment>& segments() const { return segments_; }  // address order
  std::uint64_t reserved() const;

 private:
  std::uint64_t capacity_;
  std::vector<RefSegment> segments_;
};

}  // namespace fragscope::testing

#endif  // FRAGSCOPE_TESTS_TESTING_REFERENCE_ALLOCATOR_H_
