// The worked example of docs/metrics.md, figure by figure. Expected values are computed by
// hand in the comments; change the doc and this test together.
#include "analysis/metrics.h"

#include <gtest/gtest.h>

#include "common/units.h"

namespace fragscope::analysis {
namespace {

constexpr std::uint64_t S = std::uint64_t{1} << 32;  // the large segment
constexpr std::uint64_t T = std::uint64_t{1} << 33;  // the small segment

Event Ev(Action action, std::uint64_t addr, std::uint64_t size = 0) {
  Event e;
  e.action = action;
  e.addr = addr;
  e.size = size;
  return e;
}

class WorkedExampleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const Event& e : {
             Ev(Action::kSegmentAlloc, S, 20 * kMiB),
             Ev(Action::kAlloc, S, 4 * kMiB),                  // A: [0, 4) MiB
             Ev(Action::kAlloc, S + 4 * kMiB, 8 * kMiB),       // B: [4, 12) MiB
             Ev(Action::kAlloc, S + 12 * kMiB, 7 * kMiB + 1),  // C: whole [12, 20) MiB
             Ev(Action::kFreeCompleted, S + 4 * kMiB),         // B freed: 8 MiB hole
             Ev(Action::kSegmentAlloc, T, 2 * kMiB),
             Ev(Action::kAlloc, T, 1000),  // D: 1024-byte block
         }) {
      ASSERT_TRUE(memory_.Apply(e).ok());
    }
    inputs_.capacity_bytes = 100 * kMiB;
  }
  model::DeviceMemory memory_{0};
  MetricsInputs inputs_;
};

TEST_F(WorkedExampleTest, PoolFigures) {
  inputs_.small_threshold = 1000;     // the learned quantiles of the doc's example
  inputs_.large_threshold = 7340032;  // 7 MiB: class floor of the median 7 MiB + 1
  const DeviceMetrics d = ComputeMetrics(memory_, inputs_);
  const PoolMetrics& l = d.large_pool;
  EXPECT_EQ(l.reserved_bytes, 20971520u);
  EXPECT_EQ(l.allocated_bytes, 12582912u);       // A 4 MiB + C 8 MiB (not split: 1 MiB - 512 left)
  EXPECT_EQ(l.requested_bytes, 11534337u);       // 4194304 + 7340033
  EXPECT_EQ(l.cached_free_bytes, 8388608u);      // 20 MiB - 12 MiB
  EXPECT_DOUBLE_EQ(l.fragmentation_ratio, 0.4);  // 8 / 20
  EXPECT_EQ(l.largest_free_block, 8388608u);
  EXPECT_DOUBLE_EQ(l.external_fragmentation, 0.0);  // the only free block is the largest
  EXPECT_EQ(l.internal_waste_bytes, 1048575u);      // 12582912 - 11534337
  EXPECT_EQ(l.stranded_bytes, 0u);                  // 8 MiB >= 7 MiB threshold
  const PoolMetrics& s = d.small_pool;
  EXPECT_EQ(s.reserved_bytes, 2097152u);
  EXPECT_EQ(s.allocated_bytes, 1024u);
  EXPECT_EQ(s.requested_bytes, 1000u);
  EXPECT_EQ(s.cached_free_bytes, 2096128u);
  EXPECT_DOUBLE_EQ(s.fragmentation_ratio, 2096128.0 / 2097152.0);  // 0.99951171875
  EXPECT_EQ(s.internal_waste_bytes, 24u);
  const PoolMetrics& a = d.all;
  EXPECT_EQ(a.reserved_bytes, 23068672u);
  EXPECT_EQ(a.allocated_bytes, 12583936u);
  EXPECT_EQ(a.cached_free_bytes, 10484736u);
  EXPECT_DOUBLE_EQ(a.fragmentation_ratio, 10484736.0 / 23068672.0);  // 0.4545...
  EXPECT_EQ(a.largest_free_block, 8388608u);
  EXPECT_DOUBLE_EQ(a.external_fragmentation, 1.0 - 8388608.0 / 10484736.0);  // 0.1999...
  EXPECT_EQ(a.internal_waste_bytes, 1048599u);
  EXPECT_EQ(a.segment_count, 2u);
  EXPECT_EQ(a.block_count, 5u);  // A, hole, C, D, small remainder
  EXPECT_EQ(a.free_block_count, 2u);
}

TEST_F(WorkedExampleTest, StrandedWithAFixedThreshold) {
  inputs_.small_threshold = 10 * kMiB;
  inputs_.large_threshold = LargePoolThreshold(10 * kMiB);
  const DeviceMetrics d = ComputeMetrics(memory_, inputs_);
  EXPECT_EQ(d.large_pool.stranded_bytes, 8388608u);  // the 8 MiB hole < 10 MiB
  EXPECT_EQ(d.small_pool.stranded_bytes, 2096128u);
  EXPECT_EQ(d.all.stranded_bytes, 8388608u + 2096128u);
}

TEST_F(WorkedExampleTest, MaxAllocatable) {
  const DeviceMetrics d = ComputeMetrics(memory_, inputs_);
  // Cached: the 8 MiB large hole (> 1 MiB) beats min(small 2096128, 1 MiB).
  EXPECT_EQ(d.max_allocatable_cached, 8388608u);
  // Driver: 100 MiB - 23068672 reserved = 81788928 = 39 x 2 MiB; a new segment can take it all.
  EXPECT_EQ(*d.device_free_bytes, 81788928u);
  EXPECT_EQ(d.max_allocatable, 81788928u);
  // With 90 MiB used by others only 10485760 - 23068672 < 0 is left: cached blocks only.
  inputs_.used_by_others_bytes = 90 * kMiB;
  const DeviceMetrics tight = ComputeMetrics(memory_, inputs_);
  EXPECT_EQ(*tight.device_free_bytes, 0u);
  EXPECT_EQ(tight.max_allocatable, 8388608u);
}

TEST_F(WorkedExampleTest, FreeingMergesAndReleasableCounts) {
  ASSERT_TRUE(memory_.Apply(Ev(Action::kFreeCompleted, S)).ok());  // A merges with the hole
  DeviceMetrics d = ComputeMetrics(memory_, inputs_);
  EXPECT_EQ(d.all.largest_free_block, 12 * kMiB);
  EXPECT_EQ(d.all.releasable_bytes, 0u);  // C still pins the segment
  ASSERT_TRUE(memory_.Apply(Ev(Action::kFreeCompleted, S + 12 * kMiB)).ok());
  d = ComputeMetrics(memory_, inputs_);
  EXPECT_EQ(d.all.releasable_bytes, 20 * kMiB);
  // Releasing the free 20 MiB segment and retrying gives 81788928 + 20 MiB = 102760448.
  EXPECT_EQ(d.max_allocatable, 102760448u);
}

TEST(MetricsTest, EmptyDeviceIsAllZero) {
  model::DeviceMemory memory(3);
  const DeviceMetrics d = ComputeMetrics(memory, {});
  EXPECT_EQ(d.device, 3);
  EXPECT_EQ(d.all.reserved_bytes, 0u);
  EXPECT_EQ(d.all.fragmentation_ratio, 0.0);
  EXPECT_EQ(d.all.external_fragmentation, 0.0);
  EXPECT_EQ(d.max_allocatable, 0u);
  EXPECT_FALSE(d.device_free_bytes.has_value());
}

TEST(MetricsTest, LargePoolThresholdFloor) {
  EXPECT_EQ(LargePoolThreshold(0), kMiB + 1);
  EXPECT_EQ(LargePoolThreshold(64 * kMiB), 64 * kMiB);
}

}  // namespace
}  // namespace fragscope::analysis
