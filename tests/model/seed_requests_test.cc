// SeedRequests builds a start state in the simulator: replaying its requests through
// RequestReplayer must give segments with exactly the recorded blocks, in order.
#include "model/seed_requests.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/units.h"
#include "model/request_replayer.h"

namespace fragscope::model {
namespace {

constexpr std::uint64_t MiB = kMiB;

Event Segment(std::uint64_t addr, std::uint64_t size, Pool pool) {
  Event e;
  e.action = Action::kSegmentAlloc;
  e.addr = addr;
  e.size = size;
  e.pool = pool;
  return e;
}
Event Block(std::uint64_t addr, std::uint64_t block_size, std::uint64_t requested) {
  Event e;
  e.action = Action::kBlock;
  e.addr = addr;
  e.size = requested;
  e.block_size = block_size;
  return e;
}

// "size:state" of every block of every simulated segment, segments in address order.
std::vector<std::string> Replay(const std::vector<Event>& requests) {
  RequestReplayer replayer(
      [](std::int32_t) {
        SimOptions o;
        o.driver.capacity_bytes = std::uint64_t{1} << 40;
        return o;
      },
      OomPolicy::kStop, {});
  for (const Event& e : requests) {
    Status st = replayer.Consume(e);
    EXPECT_TRUE(st.ok()) << st.message();
  }
  std::vector<std::string> out;
  for (const auto& [device, sim] : replayer.devices()) {
    for (const SnapshotSegment& s : sim->MemorySnapshot()) {
      std::string row = std::to_string(s.total_size / 1024) + "K:";
      for (const SnapshotBlock& b : s.blocks) {
        row += " " + std::to_string(b.size / 1024) + (b.state == "inactive" ? "f" : "a");
      }
      out.push_back(row);
    }
  }
  return out;
}

TEST(SeedRequestsTest, LargeSegmentWithGapsIsBuiltExactly) {
  // A 40 MiB segment: free 6 MiB, live 4 MiB, free 10 MiB, live 2 MiB + 512 KiB, free rest.
  // Carved from the front of one cached 40 MiB block, fillers freed last.
  const std::uint64_t s = 0x7f0000000000;
  const std::vector<Event> start = {
      Segment(s, 40 * MiB, Pool::kLarge),
      Block(s + 6 * MiB, 4 * MiB, 4 * MiB - 100),
      Block(s + 20 * MiB, 2 * MiB + 512 * 1024, 2 * MiB + 512 * 1024),
  };
  const SeedResult seed = SeedRequests(start, AllocatorRules{});
  EXPECT_EQ(seed.exact_segments, 1u);
  EXPECT_EQ(seed.fallback_segments, 0u);
  EXPECT_EQ(Replay(seed.requests),
            std::vector<std::string>({"40960K: 6144f 4096a 10240f 2560a 17920f"}));
}

TEST(SeedRequestsTest, SmallSegmentGapsOverOneMiBAreSplitIntoFillers) {
  // A 2 MiB small segment: live 512 B, free 1.5 MiB - 512, live 512 KiB. The 1.5 MiB gap cannot
  // be one request (over 1 MiB goes to the large pool): two fillers, freed and merged.
  const std::uint64_t s = 0x7f0000000000;
  const std::vector<Event> start = {
      Segment(s, 2 * MiB, Pool::kSmall),
      Block(s, 512, 100),
      Block(s + 3 * MiB / 2, MiB / 2, MiB / 2),
  };
  const SeedResult seed = SeedRequests(start, AllocatorRules{});
  EXPECT_EQ(seed.exact_segments, 1u);
  // 512 B = 0K in the row's KiB units.
  EXPECT_EQ(Replay(seed.requests), std::vector<std::string>({"2048K: 0a 1535f 512a"}));
}

TEST(SeedRequestsTest, SegmentsKeepTheirAddressOrderAndCachedEmptySegments) {
  // Two segments: an empty cached 20 MiB one, then a 24 MiB one holding one 12 MiB block.
  const std::uint64_t s = 0x7f0000000000;
  const std::vector<Event> start = {
      Segment(s + 100 * MiB, 24 * MiB, Pool::kLarge),
      Segment(s, 20 * MiB, Pool::kLarge),
      Block(s + 100 * MiB + 12 * MiB, 12 * MiB, 12 * MiB),
  };
  const SeedResult seed = SeedRequests(start, AllocatorRules{});
  EXPECT_EQ(seed.exact_segments, 2u);
  EXPECT_EQ(Replay(seed.requests),
            std::vector<std::string>({"20480K: 20480f", "24576K: 12288f 12288a"}));
}

TEST(SeedRequestsTest, ExpandableSegmentsFallBackToLiveBlocksInAddressOrder) {
  const std::uint64_t s = 0x600000000;
  Event seg = Segment(s, 40 * MiB, Pool::kLarge);
  seg.action = Action::kSegmentMap;
  const std::vector<Event> start = {seg, Block(s + 16 * MiB, 8 * MiB, 8 * MiB)};
  const SeedResult seed = SeedRequests(start, AllocatorRules{});
  EXPECT_EQ(seed.exact_segments, 0u);
  EXPECT_EQ(seed.fallback_segments, 1u);
  ASSERT_EQ(seed.requests.size(), 1u);
  EXPECT_EQ(seed.requests[0].action, Action::kAlloc);
  EXPECT_EQ(seed.requests[0].addr, s + 16 * MiB);
  EXPECT_EQ(seed.requests[0].size, 8 * MiB);
}

TEST(SeedRequestsTest, PendingBlocksAreFreedAfterTheFillers) {
  const std::uint64_t s = 0x7f0000000000;
  Event pending;
  pending.action = Action::kFreeRequested;
  pending.addr = s;
  const std::vector<Event> start = {Segment(s, 20 * MiB, Pool::kLarge), Block(s, 4 * MiB, 4 * MiB),
                                    pending};
  const SeedResult seed = SeedRequests(start, AllocatorRules{});
  ASSERT_FALSE(seed.requests.empty());
  EXPECT_EQ(seed.requests.back().action, Action::kFreeRequested);
  EXPECT_EQ(seed.requests.back().addr, s);
}

}  // namespace
}  // namespace fragscope::model
