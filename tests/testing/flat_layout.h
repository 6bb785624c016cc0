// FlatLayout: a memory layout as a flat list of blocks in address order, so that the layouts of
// DeviceMemory, CachingAllocatorSim and the naive ReferenceAllocator compare with ==.
// Free blocks compare with requested 0 (their stale requested size is not state).
#ifndef FRAGSCOPE_TESTS_TESTING_FLAT_LAYOUT_H_
#define FRAGSCOPE_TESTS_TESTING_FLAT_LAYOUT_H_

#include <cstdint>
#include <ostream>
#include <vector>

#include "model/caching_allocator_sim.h"
#include "model/device_memory.h"
#include "testing/reference_allocator.h"

namespace fragscope::testing {

struct FlatBlock {
  std::uint64_t addr = 0, size = 0, requested = 0;
  bool allocated = false;
  bool operator==(const FlatBlock&) const = default;
};

inline std::ostream& operator<<(std::ostream& os, const FlatBlock& b) {
  return os << "{" << b.addr << ", " << b.size << ", " << b.requested
            << (b.allocated ? ", allocated}" : ", free}");
}

inline std::vector<FlatBlock> FlatLayout(const model::DeviceMemory& m) {
  std::vector<FlatBlock> out;
  m.ForEachSegment([&](const model::Segment& s) {
    m.ForEachBlock(s, [&](const model::Block& b) {
      const bool allocated = b.state == model::BlockState::kAllocated;
      out.push_back({b.addr, b.size, allocated ? b.requested : 0, allocated});
    });
  });
  return out;
}

inline std::vector<FlatBlock> FlatLayout(const model::CachingAllocatorSim& sim) {
  std::vector<FlatBlock> out;
  for (const model::SnapshotSegment& s : sim.MemorySnapshot()) {
    for (const model::SnapshotBlock& b : s.blocks) {
      const bool allocated = b.state == "active_allocated";
      out.push_back({b.address, b.size, allocated ? b.requested_size : 0, allocated});
    }
  }
  return out;
}

inline std::vector<FlatBlock> FlatLayout(const ReferenceAllocator& r) {
  std::vector<FlatBlock> out;
  for (const RefSegment& s : r.segments()) {
    for (const RefBlock& b : s.blocks) out.push_back({b.addr, b.size, b.requested, b.allocated});
  }
  return out;
}

}  // namespace fragscope::testing

#endif  // FRAGSCOPE_TESTS_TESTING_FLAT_LAYOUT_H_
