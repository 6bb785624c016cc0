// BfcReference: a deliberately naive model of the BFC allocator's rules, for the differential
// test of model::BfcAllocatorSim (tests/model/bfc_property_test.cc). It keeps regions as plain
// vectors of chunks, builds the 21 bins literally on every request and scans them in order, and
// coalesces by rebuilding the region's chunk list: slow, short and easy to check by eye against
// docs/simulator.md ("The BFC allocator model"). It exists only for testing.
//
// Thread safety: none.
#ifndef FRAGSCOPE_TESTS_TESTING_BFC_REFERENCE_H_
#define FRAGSCOPE_TESTS_TESTING_BFC_REFERENCE_H_

#include <cstdint>
#include <vector>

#include "model/bfc_allocator_sim.h"

namespace fragscope::testing {

class BfcReference {
 public:
  BfcReference(const model::BfcSettings& settings, const model::BfcDevice& device);
  /// The chunk address, or 0 when the request fails.
  std::uint64_t Malloc(std::uint64_t request);
  /// REQUIRES: `addr` is a chunk in use.
  void Free(std::uint64_t addr);
  /// Regions in address order.
  std::vector<model::BfcRegion> Regions() const;
  std::uint64_t limit() const { return limit_; }

 private:
  bool Extend(std::uint64_t rounded);
  bool CollectGarbage(std::uint64_t rounded);
  std::uint64_t Find(std::uint64_t rounded, std::uint64_t request);
  std::uint64_t Pool() const;

  model::BfcSettings settings_;
  model::BfcDevice device_;
  std::uint64_t limit_ = 0;
  std::uint64_t next_region_ = 0;
  bool backed_off_ = false;
  std::vector<model::BfcRegion> regions_;  // kept sorted by address
};

}  // namespace fragscope::testing

#endif  // FRAGSCOPE_TESTS_TESTING_BFC_REFERENCE_H_
