#include "analysis/fidelity.h"

#include <gtest/gtest.h>

namespace fragscope::analysis {
namespace {

model::SnapshotSegment Seg(std::uint64_t addr,
                           std::vector<std::pair<std::uint64_t, const char*>> blocks) {
  model::SnapshotSegment s;
  s.address = addr;
  for (const auto& [size, state] : blocks) {
    model::SnapshotBlock b;
    b.size = size;
    b.state = state;
    s.total_size += size;
    if (std::string(state) == "active_allocated") s.allocated_size += size;
    s.blocks.push_back(b);
  }
  return s;
}

TEST(FidelityTest, MatchesSegmentsAsMultisetsWhateverTheirAddresses) {
  const std::vector<model::SnapshotSegment> real = {
      Seg(0x1000, {{4, "active_allocated"}, {16, "inactive"}}),
      Seg(0x9000, {{4, "active_allocated"}, {16, "inactive"}}),
      Seg(0x5000, {{10, "active_allocated"}, {10, "active_allocated"}}),
  };
  const std::vector<model::SnapshotSegment> sim = {
      Seg(0x7, {{4, "active_allocated"}, {16, "inactive"}}),   // same layout
      Seg(0x8, {{16, "inactive"}, {4, "active_allocated"}}),   // same size, other layout
      Seg(0x9, {{20, "active_allocated"}, {10, "inactive"}}),  // neither
      Seg(0xa, {{2, "inactive"}}),
  };
  const DeviceFidelity f = CompareSegments(real, sim);
  EXPECT_EQ(f.real_segments, 3u);
  EXPECT_EQ(f.sim_segments, 4u);
  EXPECT_EQ(f.matched_segments, 1u);
  EXPECT_EQ(f.matched_by_size, 2u);
  EXPECT_DOUBLE_EQ(f.segment_agreement(), 0.25);
  EXPECT_DOUBLE_EQ(f.size_agreement(), 0.5);
  EXPECT_EQ(f.real_reserved, 60u);
  EXPECT_EQ(f.sim_reserved, 72u);
  EXPECT_EQ(f.real_allocated, 28u);
  EXPECT_EQ(f.sim_allocated, 28u);
}

TEST(FidelityTest, NothingAgainstNothingAgrees) {
  const DeviceFidelity f = CompareSegments({}, {});
  EXPECT_DOUBLE_EQ(f.segment_agreement(), 1.0);
  EXPECT_DOUBLE_EQ(f.size_agreement(), 1.0);
}

}  // namespace
}  // namespace fragscope::analysis
