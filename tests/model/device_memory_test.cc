#include "model/device_memory.h"

#include <gtest/gtest.h>

#include "common/units.h"

namespace fragscope::model {
namespace {

constexpr std::uint64_t kSeg = std::uint64_t{1} << 32;

Event Ev(Action action, std::uint64_t addr, std::uint64_t size = 0) {
  Event e;
  e.action = action;
  e.addr = addr;
  e.size = size;
  return e;
}

class DeviceMemoryTest : public ::testing::Test {
 protected:
  void Apply(const Event& e) {
    Status st = memory_.Apply(e);
    ASSERT_TRUE(st.ok()) << st.ToString();
    Status inv = memory_.CheckInvariants();
    ASSERT_TRUE(inv.ok()) << inv.ToString();
  }
  std::string ApplyError(const Event& e) {
    Status st = memory_.Apply(e);
    EXPECT_FALSE(st.ok());
    Status inv = memory_.CheckInvariants();
    EXPECT_TRUE(inv.ok()) << "a rejected event must leave the model unchanged: " << inv.ToString();
    return st.message();
  }
  std::vector<std::pair<std::uint64_t, BlockState>> Blocks() {
    std::vector<std::pair<std::uint64_t, BlockState>> out;
    memory_.ForEachSegment([&](const Segment& s) {
      memory_.ForEachBlock(s, [&](const Block& b) { out.emplace_back(b.size, b.state); });
    });
    return out;
  }
  DeviceMemory memory_{0};
};

TEST_F(DeviceMemoryTest, SplitsAtTheLowEndAndMergesOnFree) {
  Apply(Ev(Action::kSegmentAlloc, kSeg, 20 * kMiB));
  EXPECT_EQ(memory_.pool(Pool::kLarge).reserved, 20 * kMiB);
  EXPECT_EQ(memory_.pool(Pool::kLarge).releasable, 20 * kMiB);
  Apply(Ev(Action::kAlloc, kSeg, 4 * kMiB));  // remainder 16 MiB > 1 MiB: split
  Apply(Ev(Action::kAlloc, kSeg + 4 * kMiB, 8 * kMiB));
  // 7 MiB + 1 B rounds to 7 MiB + 512; the 8 MiB block's remainder (1 MiB - 512) is not split.
  Apply(Ev(Action::kAlloc, kSeg + 12 * kMiB, 7 * kMiB + 1));
  EXPECT_EQ(Blocks().size(), 3u);
  const PoolCounters& c = memory_.pool(Pool::kLarge);
  EXPECT_EQ(c.allocated, 20 * kMiB);
  EXPECT_EQ(c.requested, 4 * kMiB + 8 * kMiB + 7 * kMiB + 1);
  EXPECT_EQ(c.releasable, 0u);
  EXPECT_EQ(c.free.count(), 0u);

  Apply(Ev(Action::kFreeRequested, kSeg + 4 * kMiB, 8 * kMiB));
  EXPECT_EQ(c.allocated, 12 * kMiB);
  EXPECT_EQ(c.active, 20 * kMiB);  // pending-free still active
  EXPECT_EQ(c.free.count(), 0u);
  Apply(Ev(Action::kFreeCompleted, kSeg + 4 * kMiB));
  EXPECT_EQ(c.free.Largest(), 8 * kMiB);
  Apply(Ev(Action::kFreeCompleted, kSeg));  // without free_requested: both steps at once
  EXPECT_EQ(c.free.Largest(), 12 * kMiB);   // merged with its free neighbour
  EXPECT_EQ(Blocks().size(), 2u);
  Apply(Ev(Action::kFreeCompleted, kSeg + 12 * kMiB));
  EXPECT_EQ(Blocks().size(), 1u);
  EXPECT_EQ(c.releasable, 20 * kMiB);
  Apply(Ev(Action::kSegmentFree, kSeg, 20 * kMiB));
  EXPECT_EQ(memory_.reserved(), 0u);
  EXPECT_EQ(memory_.segment_count(), 0u);
}

TEST_F(DeviceMemoryTest, SmallPoolSplitsAt512) {
  Apply(Ev(Action::kSegmentAlloc, kSeg, 2 * kMiB));
  Apply(Ev(Action::kAlloc, kSeg, 1000));
  EXPECT_EQ(memory_.pool(Pool::kSmall).allocated, 1024u);
  EXPECT_EQ(memory_.pool(Pool::kSmall).free.Largest(), 2 * kMiB - 1024);
  EXPECT_EQ(memory_.pool(Pool::kLarge).reserved, 0u);
}

TEST_F(DeviceMemoryTest, ExplicitBlockSizeWins) {
  Apply(Ev(Action::kSegmentAlloc, kSeg, 20 * kMiB));
  Event e = Ev(Action::kAlloc, kSeg, 100);
  e.block_size = 4096;
  Apply(e);
  EXPECT_EQ(memory_.allocated(), 4096u);
  EXPECT_EQ(memory_.pool(Pool::kLarge).free.Largest(), 20 * kMiB - 4096);
}

TEST_F(DeviceMemoryTest, RejectsInconsistentEvents) {
  Apply(Ev(Action::kSegmentAlloc, kSeg, 20 * kMiB));
  Apply(Ev(Action::kAlloc, kSeg, 4 * kMiB));
  EXPECT_NE(ApplyError(Ev(Action::kSegmentAlloc, kSeg + kMiB, 20 * kMiB)).find("overlaps"),
            std::string::npos);
  EXPECT_NE(ApplyError(Ev(Action::kSegmentAlloc, kSeg - kMiB, 2 * kMiB)).find("overlaps"),
            std::string::npos);
  EXPECT_NE(ApplyError(Ev(Action::kSegmentAlloc, ~std::uint64_t{0} - 10, 2 * kMiB)).find("wraps"),
            std::string::npos);
  EXPECT_NE(ApplyError(Ev(Action::kSegmentAlloc, 0, 0)).find("size is 0"), std::string::npos);
  EXPECT_NE(ApplyError(Ev(Action::kFreeCompleted, 12345)).find("outside every segment"),
            std::string::npos);
  EXPECT_NE(ApplyError(Ev(Action::kFreeRequested, kSeg + 512)).find("inside the allocated block"),
            std::string::npos);
  EXPECT_NE(ApplyError(Ev(Action::kAlloc, kSeg, 100)).find("already allocated"), std::string::npos);
  EXPECT_NE(ApplyError(Ev(Action::kAlloc, kSeg + 4 * kMiB, 17 * kMiB)).find("does not fit"),
            std::string::npos);
  EXPECT_NE(ApplyError(Ev(Action::kFreeRequested, kSeg, 5)).find("allocated for"),
            std::string::npos);
  EXPECT_NE(ApplyError(Ev(Action::kSegmentFree, kSeg)).find("still holds 1"), std::string::npos);
  EXPECT_NE(ApplyError(Ev(Action::kSegmentFree, kSeg + 4 * kMiB)).find("no segment starts"),
            std::string::npos);
  Apply(Ev(Action::kFreeRequested, kSeg, 4 * kMiB));
  EXPECT_NE(ApplyError(Ev(Action::kFreeRequested, kSeg)).find("double free"), std::string::npos);
  Apply(Ev(Action::kFreeCompleted, kSeg));
  EXPECT_NE(ApplyError(Ev(Action::kFreeCompleted, kSeg)).find("is free"), std::string::npos);
  EXPECT_NE(ApplyError(Ev(Action::kSegmentFree, kSeg, 2 * kMiB)).find("size"), std::string::npos);
}

TEST_F(DeviceMemoryTest, ExpandableSegmentsGrowMergeAndShrink) {
  Event map = Ev(Action::kSegmentMap, kSeg, 20 * kMiB);
  Apply(map);
  EXPECT_EQ(memory_.pool(Pool::kLarge).reserved, 20 * kMiB);
  Apply(Ev(Action::kAlloc, kSeg, 30 * kMiB / 2));               // 15 MiB; remainder 5 MiB free
  Apply(Ev(Action::kSegmentMap, kSeg + 20 * kMiB, 20 * kMiB));  // grows: one segment, merged tail
  EXPECT_EQ(memory_.segment_count(), 1u);
  EXPECT_EQ(memory_.pool(Pool::kLarge).free.Largest(), 25 * kMiB);
  // A range mapped below the segment joins it too.
  Apply(Ev(Action::kSegmentMap, kSeg - 20 * kMiB, 20 * kMiB));
  EXPECT_EQ(memory_.segment_count(), 1u);
  EXPECT_EQ(memory_.reserved(), 60 * kMiB);
  // Unmapping the middle of the top free block splits the segment in two.
  Apply(Ev(Action::kSegmentUnmap, kSeg + 20 * kMiB, 10 * kMiB));
  EXPECT_EQ(memory_.segment_count(), 2u);
  EXPECT_EQ(memory_.reserved(), 50 * kMiB);
  // Unmapping a range that is not inside one free block is rejected.
  EXPECT_NE(ApplyError(Ev(Action::kSegmentUnmap, kSeg, 20 * kMiB)).find("inside one free block"),
            std::string::npos);
  // Remapping the hole joins the two segments again.
  Apply(Ev(Action::kSegmentMap, kSeg + 20 * kMiB, 10 * kMiB));
  EXPECT_EQ(memory_.segment_count(), 1u);
  EXPECT_EQ(memory_.pool(Pool::kLarge).free.Largest(), 25 * kMiB);
  // Unmapping whole free ends.
  Apply(Ev(Action::kSegmentUnmap, kSeg - 20 * kMiB, 20 * kMiB));
  Apply(Ev(Action::kSegmentUnmap, kSeg + 15 * kMiB, 25 * kMiB));
  EXPECT_EQ(memory_.reserved(), 15 * kMiB);
  Apply(Ev(Action::kFreeCompleted, kSeg));
  Apply(Ev(Action::kSegmentUnmap, kSeg, 15 * kMiB));
  EXPECT_EQ(memory_.segment_count(), 0u);
}

TEST_F(DeviceMemoryTest, OomIsCounted) {
  Event oom = Ev(Action::kOom, 0, 5 * kGiB);
  oom.device_free = 95682560;
  Apply(oom);
  EXPECT_EQ(memory_.num_ooms(), 1u);
  EXPECT_EQ(memory_.last_oom()->requested, 5 * kGiB);
}

}  // namespace
}  // namespace fragscope::model
