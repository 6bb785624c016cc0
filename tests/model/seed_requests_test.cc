// SeedRequests builds a start state in the simulator: replaying its requests through
// RequestReplayer must give segments with exactly the recorded blocks, in order.
#include "model/seed_requests.h"

#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "common/units.h"
#include "model/alloc_conf.h"
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

// "size:state" of every block of every simulated segment, segments in address order, after the
// requests were replayed under the allocator settings `conf`.
std::vector<std::string> Replay(const std::vector<Event>& requests, std::string_view conf = "") {
  const Result<AllocatorConfig> config = ParseAllocatorConfig(conf, ConfigVersion::kNewest);
  EXPECT_TRUE(config.ok());
  RequestReplayer replayer(
      [&](std::int32_t) {
        SimOptions o;
        o.config = *config;
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

Event Mapped(std::uint64_t addr, std::uint64_t size, Pool pool, std::uint64_t stream = 0) {
  Event e = Segment(addr, size, pool);
  e.action = Action::kSegmentMap;
  e.stream = stream;
  return e;
}

TEST(SeedRequestsTest, ExpandableRangesAreBuiltPieceByPiece) {
  // A 40 MiB mapped large range (two 20 MiB pages): free 15.375 MiB, live 8.125 MiB, free
  // 16.5 MiB; and a 2 MiB small one: free 176 KiB, two live 5 KiB blocks, free rest. The pieces
  // are requested in address order (the first maps one page, the live block a second one, the
  // last filler fills the mapped rest), the fillers freed at the end.
  const std::uint64_t l = 0x938c00000, s = 0x403c00000;
  const std::vector<Event> start = {
      Mapped(s, 2 * MiB, Pool::kSmall),      Mapped(l, 40 * MiB, Pool::kLarge),
      Block(s + 176 * 1024, 5 * 1024, 4704), Block(s + 181 * 1024, 5 * 1024, 4704),
      Block(l + 16120832, 8519680, 8519680),
  };
  AllocatorRules rules;
  rules.expandable_segments = true;
  const SeedResult seed = SeedRequests(start, rules);
  EXPECT_EQ(seed.exact_segments, 2u);
  EXPECT_EQ(seed.fallback_segments, 0u);
  EXPECT_EQ(Replay(seed.requests, "expandable_segments:True"),
            std::vector<std::string>({"2048K: 176f 5a 5a 1862f", "40960K: 15743f 8320a 16897f"}));
}

TEST(SeedRequestsTest, ExpandableRangesFallBackWhenTheyCannotBeBuiltAlone) {
  const std::uint64_t s = 0x600000000;
  AllocatorRules on;
  on.expandable_segments = true;
  // Expandable segments off: the simulator would cudaMalloc instead.
  std::vector<Event> start = {Mapped(s, 40 * MiB, Pool::kLarge),
                              Block(s + 16 * MiB, 8 * MiB, 8 * MiB)};
  SeedResult seed = SeedRequests(start, AllocatorRules{});
  EXPECT_EQ(seed.exact_segments, 0u);
  EXPECT_EQ(seed.fallback_segments, 1u);
  ASSERT_EQ(seed.requests.size(), 1u);
  EXPECT_EQ(seed.requests[0].action, Action::kAlloc);
  EXPECT_EQ(seed.requests[0].addr, s + 16 * MiB);
  EXPECT_EQ(seed.requests[0].size, 8 * MiB);
  // Two ranges of one stream and pool: the simulator's one reservation would join them.
  start.push_back(Mapped(s + 100 * MiB, 20 * MiB, Pool::kLarge));
  seed = SeedRequests(start, on);
  EXPECT_EQ(seed.exact_segments, 0u);
  EXPECT_EQ(seed.fallback_segments, 2u);
  // On another stream each is alone of its kind.
  start.back().stream = 7;
  seed = SeedRequests(start, on);
  EXPECT_EQ(seed.exact_segments, 2u);
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
