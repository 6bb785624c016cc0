// SeedRequests builds a start state in the simulator: replaying its requests through
// RequestReplayer must give segments with exactly the recorded blocks, in order.
#include "model/seed_requests.h"

#include <algorithm>
#include <random>
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

// "total: size state, ..." per segment, sorted (a multiset: addresses differ between runs).
std::vector<std::string> SortedLayout(const std::vector<SnapshotSegment>& segments) {
  std::vector<std::string> rows;
  for (const SnapshotSegment& seg : segments) {
    std::string row = std::to_string(seg.total_size) + ":";
    for (const SnapshotBlock& b : seg.blocks) row += " " + std::to_string(b.size) + b.state;
    rows.push_back(row);
  }
  std::sort(rows.begin(), rows.end());
  return rows;
}

// Random layouts: a simulator runs random allocs and frees; its final segments become a start
// state (as a snapshot's rebuild yields it); SeedRequests' requests replayed into a fresh
// simulator must give the same segments, block for block (compared as multisets: addresses
// differ). Under the default settings and with expandable segments every segment must be
// built exactly; with max_split_size_mb some fall back, and only the exact ones are compared.
TEST(SeedRequestsTest, RandomLayoutsAreRebuiltExactly) {
  struct Setting {
    const char* conf;
    bool all_exact;
  };
  for (const Setting setting : {Setting{"", true}, Setting{"expandable_segments:True", true},
                                Setting{"max_split_size_mb:40", false}}) {
    SCOPED_TRACE(setting.conf);
    const AllocatorConfig config = *ParseAllocatorConfig(setting.conf, ConfigVersion::kNewest);
    std::uint64_t compared = 0;
    for (std::uint32_t seed_value = 1; seed_value <= 40; ++seed_value) {
      SCOPED_TRACE(seed_value);
      SimOptions options;
      options.config = config;
      options.driver.capacity_bytes = std::uint64_t{1} << 40;
      CachingAllocatorSim sim(options);
      std::mt19937_64 rng(seed_value);
      std::vector<std::uint64_t> live;
      for (int op = 0; op < 300; ++op) {
        if (!live.empty() && rng() % 5 < 2) {
          const std::size_t i = rng() % live.size();
          ASSERT_TRUE(sim.Free(live[i]).ok());
          live[i] = live.back();
          live.pop_back();
          continue;
        }
        const std::uint64_t size = rng() % 2 == 0 ? 1 + rng() % MiB : MiB + rng() % (48 * MiB);
        Result<std::uint64_t> addr = sim.Malloc(size);
        ASSERT_TRUE(addr.ok());
        live.push_back(*addr);
      }
      // The start state, as SnapshotReader yields it: segments, then the live blocks.
      const std::vector<SnapshotSegment> before = sim.MemorySnapshot();
      std::vector<Event> start;
      for (const SnapshotSegment& seg : before) {
        Event e = Segment(seg.address, seg.total_size,
                          seg.segment_type == "small" ? Pool::kSmall : Pool::kLarge);
        if (seg.is_expandable) e.action = Action::kSegmentMap;
        start.push_back(e);
      }
      for (const SnapshotSegment& seg : before) {
        for (const SnapshotBlock& b : seg.blocks) {
          if (b.state != "inactive") start.push_back(Block(b.address, b.size, b.requested_size));
        }
      }
      const SeedResult seed = SeedRequests(start, config.Rules());
      if (setting.all_exact) {
        ASSERT_EQ(seed.fallback_segments, 0u);
        ASSERT_EQ(seed.exact_segments, before.size());
      }
      if (seed.fallback_segments != 0) continue;
      RequestReplayer replayer([&](std::int32_t) { return options; }, OomPolicy::kStop, {});
      for (const Event& e : seed.requests) ASSERT_TRUE(replayer.Consume(e).ok());
      ASSERT_EQ(SortedLayout(replayer.sim(0)->MemorySnapshot()), SortedLayout(before));
      ++compared;
    }
    EXPECT_GE(compared, 10u);  // the comparison ran, not only the fallbacks
  }
}

}  // namespace
}  // namespace fragscope::model
