// Tests of CachingAllocatorSim against shared/spec/pytorch-caching-allocator.md. Every numbered
// behaviour of the spec has a test named after its section (Spec4_3_..., Spec12_1_...), with the
// expected figures worked out by hand in comments. After every operation the harness checks the
// simulator's invariants (incl. the §11.4 snapshot/stats identities) and that the events it
// emitted, applied to a DeviceMemory, give exactly the segments and blocks of MemorySnapshot().
//
// Addresses follow the simulator's documented policy (docs/simulator.md, §15): cudaMalloc'd
// segments are 2 MiB granules from kBase, lowest free address first; expandable reservations
// come from kResBase upwards, lowest first, each followed by one page of gap.
#include "model/caching_allocator_sim.h"

#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/units.h"
#include "model/device_memory.h"
#include "testing/reference_allocator.h"

namespace fragscope::model {
namespace {

constexpr std::uint64_t MiB = kMiB;
constexpr std::uint64_t GiB = kGiB;
constexpr std::uint64_t kBase = 0x7f0000000000ull;      // first cudaMalloc address
constexpr std::uint64_t kResBase = 0x1000000000000ull;  // first expandable reservation
constexpr ConfigVersion kNewest = ConfigVersion::kNewest;
constexpr ConfigVersion kV2 = ConfigVersion::kV2;
constexpr ConfigVersion kV1_13 = ConfigVersion::kV1_13;

std::string_view StateName(BlockState s) {
  switch (s) {
    case BlockState::kAllocated:
      return "active_allocated";
    case BlockState::kPendingFree:
      return "active_pending_free";
    case BlockState::kFree:
      return "inactive";
  }
  return "?";
}

class CachingAllocatorSimTest : public ::testing::Test {
 protected:
  void Make(std::string_view conf = "", ConfigVersion version = kNewest,
            std::uint64_t capacity = 16 * GiB, std::uint64_t others = 0, std::int32_t device = 0) {
    Result<AllocatorConfig> parsed = ParseAllocatorConfig(conf, version);
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    SimOptions options;
    options.config = *parsed;
    options.version = version;
    options.driver = driver_;
    options.driver.capacity_bytes = capacity;
    options.driver.used_by_others_bytes = others;
    options.device = device;
    sim_ = std::make_unique<CachingAllocatorSim>(options);
    memory_ = std::make_unique<DeviceMemory>(device);
    events_.clear();
    sim_->SetEventSink([this](const Event& e) {
      events_.push_back(e);
      const Status st = memory_->Apply(e);
      if (!st.ok())
        ADD_FAILURE() << "event " << ActionName(e.action) << " rejected: " << st.ToString();
    });
    Verify();
  }

  // The two checks that run after every operation.
  void Verify() {
    const Status inv = sim_->CheckInvariants();
    ASSERT_TRUE(inv.ok()) << inv.ToString();
    const Status mem = memory_->CheckInvariants();
    ASSERT_TRUE(mem.ok()) << mem.ToString();
    const std::vector<SnapshotSegment> snap = sim_->MemorySnapshot();
    std::vector<const Segment*> segs;
    memory_->ForEachSegment([&](const Segment& s) { segs.push_back(&s); });
    ASSERT_EQ(snap.size(), segs.size()) << "segments in the snapshot vs. replayed events";
    for (std::size_t i = 0; i < snap.size(); ++i) {
      const SnapshotSegment& a = snap[i];
      const Segment& b = *segs[i];
      ASSERT_EQ(a.address, b.addr) << "segment " << i;
      ASSERT_EQ(a.total_size, b.size) << "segment " << FormatAddress(a.address);
      ASSERT_EQ(a.stream, b.stream) << "segment " << FormatAddress(a.address);
      ASSERT_EQ(a.segment_type, PoolName(b.pool)) << "segment " << FormatAddress(a.address);
      ASSERT_EQ(a.is_expandable, b.expandable) << "segment " << FormatAddress(a.address);
      std::vector<const Block*> blocks;
      memory_->ForEachBlock(b, [&](const Block& blk) { blocks.push_back(&blk); });
      ASSERT_EQ(a.blocks.size(), blocks.size()) << "blocks of " << FormatAddress(a.address);
      for (std::size_t j = 0; j < blocks.size(); ++j) {
        ASSERT_EQ(a.blocks[j].address, blocks[j]->addr);
        ASSERT_EQ(a.blocks[j].size, blocks[j]->size) << FormatAddress(blocks[j]->addr);
        ASSERT_EQ(a.blocks[j].state, StateName(blocks[j]->state)) << FormatAddress(blocks[j]->addr);
        if (blocks[j]->state == BlockState::kAllocated) {
          ASSERT_EQ(a.blocks[j].requested_size, blocks[j]->requested);
        }
      }
    }
  }

  std::uint64_t Alloc(std::uint64_t request, std::uint64_t stream = 0) {
    Result<std::uint64_t> r = sim_->Malloc(request, stream);
    EXPECT_TRUE(r.ok()) << "Malloc(" << request << ") " << r.status().ToString();
    Verify();
    return r.ok() ? *r : 0;
  }
  Status TryAlloc(std::uint64_t request, std::uint64_t stream = 0) {
    Result<std::uint64_t> r = sim_->Malloc(request, stream);
    Verify();
    return r.status();
  }
  void Free(std::uint64_t addr) {
    const Status st = sim_->Free(addr);
    EXPECT_TRUE(st.ok()) << st.ToString();
    Verify();
  }
  void Record(std::uint64_t addr, std::uint64_t stream) {
    const Status st = sim_->RecordStream(addr, stream);
    EXPECT_TRUE(st.ok()) << st.ToString();
    Verify();
  }
  void Sync(std::optional<std::uint64_t> stream) {
    sim_->StreamSync(stream);
    Verify();
  }
  void Empty() {
    sim_->EmptyCache();
    Verify();
  }
  void Fraction(double f) {
    const Status st = sim_->SetMemoryFraction(f);
    EXPECT_TRUE(st.ok()) << st.ToString();
    Verify();
  }
  void Settings(std::string_view conf) {
    const Status st = sim_->SetAllocatorSettings(conf);
    EXPECT_TRUE(st.ok()) << st.ToString();
    Verify();
  }

  std::int64_t Stat(const std::string& key) const {
    const auto flat = sim_->stats().Flatten();
    auto it = flat.find(key);
    EXPECT_NE(it, flat.end()) << key;
    return it == flat.end() ? -999 : it->second;
  }
  std::vector<Event> Take() {
    std::vector<Event> out = std::move(events_);
    events_.clear();
    return out;
  }
  static std::vector<Action> Actions(const std::vector<Event>& events) {
    std::vector<Action> out;
    for (const Event& e : events) out.push_back(e.action);
    return out;
  }
  // The alloc event of the last Malloc, from the events since the last Take().
  Event LastAlloc() const {
    for (auto it = events_.rbegin(); it != events_.rend(); ++it) {
      if (it->action == Action::kAlloc) return *it;
    }
    ADD_FAILURE() << "no alloc event";
    return Event{};
  }
  // The only block at `addr` in the snapshot.
  SnapshotBlock BlockAt(std::uint64_t addr) const {
    for (const SnapshotSegment& s : sim_->MemorySnapshot()) {
      for (const SnapshotBlock& b : s.blocks) {
        if (b.address == addr) return b;
      }
    }
    ADD_FAILURE() << "no block at " << FormatAddress(addr);
    return SnapshotBlock{};
  }

  std::unique_ptr<CachingAllocatorSim> sim_;
  std::unique_ptr<DeviceMemory> memory_;
  std::vector<Event> events_;
  DriverModel driver_;  // Make() takes the address fields from here
};

using A = Action;

// ---------------------------------------------------------------------------------------------
// §1 Data model: free lists per stream

TEST_F(CachingAllocatorSimTest, Spec1_FreeBlocksAreReusedOnlyByTheirStream) {
  Make();
  // 4 MiB is a large-pool request; its new segment is 20 MiB (§4.3) at the first address.
  const std::uint64_t a = Alloc(4 * MiB, /*stream=*/1);
  EXPECT_EQ(a, kBase);
  Free(a);  // [kBase, +20 MiB) is now one cached block of stream 1
  // The pool is ordered by (stream, size, address): stream 2 finds nothing and gets a new
  // segment right above the first one.
  EXPECT_EQ(Alloc(4 * MiB, 2), kBase + 20 * MiB);
  EXPECT_EQ(Stat("reserved_bytes.all.current"), static_cast<std::int64_t>(40 * MiB));
  // Stream 1 gets its cached block back without a new segment.
  EXPECT_EQ(Alloc(4 * MiB, 1), kBase);
  EXPECT_EQ(Stat("segment.all.current"), 2);
  EXPECT_EQ(Stat("num_device_alloc"), 2);
}

// ---------------------------------------------------------------------------------------------
// §2 Constants, the 1 EiB guard, zero-byte requests

TEST_F(CachingAllocatorSimTest, Spec2_RequestsOfOneExbibyteFailBeforeTheAllocator) {
  Make();
  Result<std::uint64_t> r = sim_->Malloc(std::uint64_t{1} << 60);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfMemory);  // torch.OutOfMemoryError
  EXPECT_EQ(r.status().message(), "CUDA out of memory. Tried to allocate more than 1EB memory.");
  ASSERT_TRUE(sim_->last_oom().has_value());
  EXPECT_EQ(sim_->last_oom()->message, r.status().message());
  EXPECT_EQ(sim_->last_oom()->requested, std::uint64_t{1} << 60);
  EXPECT_TRUE(events_.empty());
  EXPECT_EQ(Stat("num_ooms"), 0);  // no stats touched
  EXPECT_EQ(Stat("num_alloc_retries"), 0);
  Verify();
  // One byte less reaches the allocator: an ordinary OOM on a 16 GiB device, counted, after
  // the release-and-retry path.
  const Status st = TryAlloc((std::uint64_t{1} << 60) - 1);
  EXPECT_EQ(st.code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(Stat("num_ooms"), 1);
  EXPECT_EQ(Stat("num_alloc_retries"), 1);
}

TEST_F(CachingAllocatorSimTest, Spec2_ZeroByteRequestsNeverReachTheAllocator) {
  Make();
  const auto before = sim_->stats().Flatten();
  Result<std::uint64_t> r = sim_->Malloc(0);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 0u);  // a null pointer
  EXPECT_TRUE(events_.empty());
  EXPECT_EQ(sim_->stats().Flatten(), before);
  EXPECT_TRUE(sim_->Free(0).ok());  // free(nullptr) is a no-op
  EXPECT_TRUE(events_.empty());
  Verify();
}

TEST_F(CachingAllocatorSimTest, Spec2_EveryRoundedSizeIsAtLeastMinBlockSize) {
  Make();
  Alloc(1);
  // kMinBlockSize = 512: a 1-byte request holds a 512-byte block of a 2 MiB small segment.
  EXPECT_EQ(LastAlloc().size, 1u);
  EXPECT_EQ(LastAlloc().block_size, 512u);
  EXPECT_EQ(Stat("allocated_bytes.small_pool.current"), 512);
  EXPECT_EQ(Stat("reserved_bytes.small_pool.current"), static_cast<std::int64_t>(kSmallBuffer));
}

// ---------------------------------------------------------------------------------------------
// §3 Configuration at run time

TEST_F(CachingAllocatorSimTest, Spec3_1_RuntimeSettingsResetSplitRoundupAndGcButKeepOthers) {
  Make(
      "expandable_segments:True,max_split_size_mb:40,roundup_power2_divisions:4,"
      "garbage_collection_threshold:0.5");
  EXPECT_EQ(sim_->config().max_split_size, 40 * MiB);
  Settings("");
  // Every parse resets max_split_size, roundup_power2_divisions and the GC threshold ...
  EXPECT_EQ(sim_->config().max_split_size, kUnlimited);
  EXPECT_EQ(sim_->config().roundup_power2_divisions[0], 0u);
  EXPECT_EQ(sim_->config().garbage_collection_threshold, 0.0);
  // ... other options keep their value.
  EXPECT_TRUE(sim_->config().expandable_segments);
  // §11.2: the max_split_size stat was fixed when the allocator was created.
  EXPECT_EQ(Stat("max_split_size"), static_cast<std::int64_t>(40 * MiB));
  Settings("expandable_segments:False");
  EXPECT_FALSE(sim_->config().expandable_segments);
  // A bad string is rejected and changes nothing.
  const AllocatorConfig before = sim_->config();
  EXPECT_FALSE(sim_->SetAllocatorSettings("no_such_option:1").ok());
  EXPECT_EQ(sim_->config(), before);
  Verify();
}

TEST_F(CachingAllocatorSimTest, Spec3_1_RuntimeSettingsChangeLaterDecisions) {
  Make();
  Settings("roundup_power2_divisions:4");
  // 84 MiB with 4 divisions rounds to 96 MiB (§4.1 table): a 96 MiB segment.
  Alloc(84 * MiB);
  EXPECT_EQ(LastAlloc().block_size, 96 * MiB);
  Settings("");  // divisions back to 0: plain 512-byte rounding
  Alloc(84 * MiB);
  EXPECT_EQ(LastAlloc().block_size, 84 * MiB);
}

// ---------------------------------------------------------------------------------------------
// §4.0 Decision order

TEST_F(CachingAllocatorSimTest, Spec4_0_CompletedEventsAreProcessedBeforeTheSearch) {
  Make();
  // a: 1000 B -> 1024 B block at the bottom of a new 2 MiB small segment, remainder cached.
  const std::uint64_t a = Alloc(1000);
  EXPECT_EQ(a, kBase);
  Record(a, 7);
  Free(a);  // waits on an event of stream 7: active_pending_free
  EXPECT_EQ(BlockAt(a).state, "active_pending_free");
  // Without a sync the event is incomplete: b takes the remainder above a.
  const std::uint64_t b = Alloc(1000);
  EXPECT_EQ(b, kBase + 1024);
  Free(b);  // b merges with the cached remainder above it, not with pending a
  Sync(7);  // the event completes now, but a is only freed by the next malloc (§5.2)
  EXPECT_EQ(BlockAt(a).state, "active_pending_free");
  Take();
  // Step 1 of the next malloc frees a, which merges the whole segment back into one block;
  // the best fit is then the block at kBase.
  EXPECT_EQ(Alloc(1000), kBase);
  EXPECT_EQ(Actions(Take()), (std::vector<Action>{A::kFreeCompleted, A::kAlloc}));
}

TEST_F(CachingAllocatorSimTest, Spec4_0_ReleaseAllAndRetryIsCountedOnce) {
  Make("", kNewest, /*capacity=*/100 * MiB);
  Free(Alloc(60 * MiB));  // one cached 60 MiB segment at kBase; driver free 40 MiB
  Take();
  // 80 MiB: no cached block >= 80 MiB (4.4); cudaMalloc(80 MiB) > 40 MiB free (4b); no
  // max_split_size, so 4c does nothing; 4d releases the 60 MiB segment (a sync of all streams)
  // and the retry -- counted -- gets 80 MiB at the lowest address, kBase.
  EXPECT_EQ(Alloc(80 * MiB), kBase);
  const std::vector<Event> ev = Take();
  EXPECT_EQ(Actions(ev), (std::vector<Action>{A::kSegmentFree, A::kSegmentAlloc, A::kAlloc}));
  EXPECT_EQ(ev[0].size, 60 * MiB);
  EXPECT_EQ(ev[1].size, 80 * MiB);
  EXPECT_EQ(Stat("num_alloc_retries"), 1);
  EXPECT_EQ(Stat("num_sync_all_streams"), 1);
  EXPECT_EQ(Stat("num_device_alloc"), 2);
  EXPECT_EQ(Stat("num_device_free"), 1);
  EXPECT_EQ(Stat("num_ooms"), 0);
}

TEST_F(CachingAllocatorSimTest, Spec4_0_MemoryReleasedBeforeAnOomStaysReleased) {
  Make("", kNewest, 100 * MiB);
  const std::uint64_t a = Alloc(30 * MiB);  // segment 30 MiB at kBase
  Alloc(50 * MiB);                          // segment 50 MiB at kBase + 30 MiB
  Free(a);
  Take();
  // 60 MiB: cached 30 MiB is too small; 60 MiB > 20 MiB free; 4d releases the 30 MiB segment
  // (free now 50 MiB) and the retry still fails: OOM. Nothing is restored.
  const Status st = TryAlloc(60 * MiB);
  EXPECT_EQ(st.code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(Actions(Take()), (std::vector<Action>{A::kSegmentFree, A::kOom}));
  EXPECT_EQ(Stat("reserved_bytes.all.current"), static_cast<std::int64_t>(50 * MiB));
  EXPECT_EQ(sim_->device_free_bytes(), 50 * MiB);
  EXPECT_EQ(Stat("num_alloc_retries"), 1);
  EXPECT_EQ(Stat("num_ooms"), 1);
  ASSERT_TRUE(sim_->last_oom().has_value());
  EXPECT_EQ(sim_->last_oom()->device_free, 50 * MiB);
}

// ---------------------------------------------------------------------------------------------
// §4.1 Rounding

TEST_F(CachingAllocatorSimTest, Spec4_1_RoundingTable) {
  struct Case {
    const char* conf;
    std::uint64_t request;
    std::uint64_t rounded;
  };
  // The table of §4.1. Each rounded size is observed as the block the alloc takes: every case
  // is either split off a bigger segment or fills its own segment exactly.
  const Case cases[] = {
      {"", 1, 512},
      {"", 513, 1024},
      {"", 1000, 1024},
      {"", 1048577, 1049088},                                // > 1 MiB: large pool
      {"roundup_power2_divisions:4", 1200, 1536},            // 1200 <= 512*4: plain rounding
      {"roundup_power2_divisions:4", 3000, 3072},            // [2048,4096) in 4 steps of 512
      {"roundup_power2_divisions:4", 88080384, 100663296},   // 84 MiB -> 96 MiB
      {"roundup_power2_divisions:8", 88080384, 92274688},    // 84 MiB -> 88 MiB
      {"roundup_power2_divisions:2", 419430400, 536870912},  // 400 MiB -> 512 MiB
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.conf << " " << c.request);
    Make(c.conf, kNewest, 4 * GiB);
    Alloc(c.request);
    EXPECT_EQ(LastAlloc().size, c.request);
    EXPECT_EQ(LastAlloc().block_size, c.rounded);
  }
}

// ---------------------------------------------------------------------------------------------
// §4.2 Pool choice

TEST_F(CachingAllocatorSimTest, Spec4_2_RequestsNeverCrossPools) {
  Make();
  Alloc(4 * MiB);  // large: 20 MiB segment at kBase, 16 MiB cached above the block
  // 1 MiB rounds to 1 MiB <= kSmallSize: small pool. The free 16 MiB large block is not used;
  // a 2 MiB small segment is made above the large one.
  const std::uint64_t b = Alloc(1 * MiB);
  EXPECT_EQ(b, kBase + 20 * MiB);
  Free(b);  // the small segment is one cached 2 MiB block
  // 1 MiB + 1 rounds to 1 049 088 > 1 MiB: large pool; the cached small block is not used,
  // the 16 MiB large block at kBase + 4 MiB is.
  EXPECT_EQ(Alloc(1 * MiB + 1), kBase + 4 * MiB);
  EXPECT_EQ(Stat("segment.small_pool.current"), 1);
  EXPECT_EQ(Stat("segment.large_pool.current"), 1);
}

// ---------------------------------------------------------------------------------------------
// §4.3 Segment sizes

TEST_F(CachingAllocatorSimTest, Spec4_3_SegmentSizes) {
  struct Case {
    std::uint64_t request;
    std::uint64_t segment;
  };
  const Case cases[] = {
      {1024, 2 * MiB},                   // small pool: kSmallBuffer
      {1 * MiB, 2 * MiB},                // rounded 1 MiB is still small
      {1 * MiB + 1, 20 * MiB},           // large, < 10 MiB: kLargeBuffer
      {9 * MiB + 512 * 1024, 20 * MiB},  // 9.5 MiB
      {10 * MiB, 10 * MiB},              // 10 485 760: already a multiple of 2 MiB
      {10 * MiB + 1, 12 * MiB},          // rounded 10 486 272 -> up to 12 582 912
      {39 * MiB + 1, 40 * MiB},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.request);
    Make();
    Alloc(c.request);
    ASSERT_FALSE(events_.empty());
    EXPECT_EQ(events_.front().action, A::kSegmentAlloc);
    EXPECT_EQ(events_.front().size, c.segment);
    EXPECT_EQ(Stat("reserved_bytes.all.current"), static_cast<std::int64_t>(c.segment));
  }
}

// ---------------------------------------------------------------------------------------------
// §4.4 Best fit

TEST_F(CachingAllocatorSimTest, Spec4_4_BestFitIsTheSmallestBlockThenTheLowestAddress) {
  Make();
  const std::uint64_t a = Alloc(30 * MiB);  // kBase
  const std::uint64_t b = Alloc(24 * MiB);  // kBase + 30 MiB
  const std::uint64_t c = Alloc(24 * MiB);  // kBase + 54 MiB
  Free(c);
  Free(a);
  Free(b);
  // 22 MiB: the smallest cached block >= 22 MiB is 24 MiB; of the two, the lower address (b).
  // The 2 MiB remainder is > 1 MiB, so b splits and the allocation takes its lower part.
  EXPECT_EQ(Alloc(22 * MiB), b);
  EXPECT_EQ(b, kBase + 30 * MiB);
  EXPECT_EQ(BlockAt(b + 22 * MiB).state, "inactive");
  EXPECT_EQ(BlockAt(b + 22 * MiB).size, 2 * MiB);
}

TEST_F(CachingAllocatorSimTest, Spec4_4_OversizeBlocksOnlyServeOversizeRequests) {
  Make("max_split_size_mb:40", kNewest, 4 * GiB);
  Free(Alloc(50 * MiB));  // cached 50 MiB block at kBase, >= M = 40 MiB: oversize
  // 30 MiB < M while the candidate (50 MiB) >= M: fail, without looking further. New segment.
  EXPECT_EQ(Alloc(30 * MiB), kBase + 50 * MiB);
  // 45 MiB >= M: 50 MiB < 45 + 20 (max_non_split_rounding) is acceptable and is not split.
  EXPECT_EQ(Alloc(45 * MiB), kBase);
  EXPECT_EQ(LastAlloc().block_size, 50 * MiB);
  EXPECT_EQ(Stat("allocated_bytes.large_pool.current"), static_cast<std::int64_t>(80 * MiB));
  EXPECT_EQ(Stat("requested_bytes.large_pool.current"), static_cast<std::int64_t>(75 * MiB));
  EXPECT_EQ(Stat("oversize_allocations.current"), 1);  // only the 50 MiB block is >= 40 MiB
  EXPECT_EQ(Stat("oversize_segments.current"), 1);
}

TEST_F(CachingAllocatorSimTest, Spec4_4_OversizeToleranceIsMaxNonSplitRounding) {
  // Default tolerance 20 MiB: a cached 70 MiB block is refused for 45 MiB (70 >= 45 + 20);
  // the new segment is 45 MiB rounded up to 2 MiB = 46 MiB, above the 70 MiB one.
  Make("max_split_size_mb:40", kNewest, 4 * GiB);
  Free(Alloc(70 * MiB));
  EXPECT_EQ(Alloc(45 * MiB), kBase + 70 * MiB);
  EXPECT_EQ(events_.back().block_size, 46 * MiB);
  // max_non_split_rounding_mb:30: 70 < 45 + 30, the cached block serves whole.
  Make("max_split_size_mb:40,max_non_split_rounding_mb:30", kNewest, 4 * GiB);
  Free(Alloc(70 * MiB));
  EXPECT_EQ(Alloc(45 * MiB), kBase);
  EXPECT_EQ(LastAlloc().block_size, 70 * MiB);
}

TEST_F(CachingAllocatorSimTest, Spec4_4_ExpandableFreeTailIsUsedLast) {
  Make("expandable_segments:True", kNewest, 1 * GiB);
  const std::uint64_t L = kResBase;         // the first (large) reservation
  EXPECT_EQ(Alloc(30 * MiB), L);            // maps 40 MiB; tail [30, 40) free
  EXPECT_EQ(Alloc(8 * MiB), L + 30 * MiB);  // tail [38, 40)
  const std::uint64_t c = Alloc(8 * MiB);   // grows: maps [40, 60), takes [38, 46)
  EXPECT_EQ(c, L + 38 * MiB);
  EXPECT_EQ(Alloc(8 * MiB), L + 46 * MiB);  // tail [54, 60) = 6 MiB
  Free(c);                                  // hole [38, 46) = 8 MiB between two live blocks
  // 5 MiB: the smallest fit is the 6 MiB tail, but its potential size (6 MiB + the unmapped
  // rest of the reservation) is larger than the hole's (8 MiB): the hole wins.
  EXPECT_EQ(Alloc(5 * MiB), L + 38 * MiB);
}

// ---------------------------------------------------------------------------------------------
// §4.5 New segments

TEST_F(CachingAllocatorSimTest, Spec4_5_FractionLimitFailsWithoutCallingTheDriver) {
  Make("", kNewest, 1 * GiB);
  Fraction(0.5);  // limit 512 MiB
  Alloc(300 * MiB);
  Take();
  // 300 + 300 MiB > 512 MiB: refused before cudaMalloc (the driver has 724 MiB free).
  const Status st = TryAlloc(300 * MiB);
  EXPECT_EQ(st.code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(Actions(Take()), (std::vector<Action>{A::kOom}));  // no segment_alloc attempt
  EXPECT_NE(st.message().find(" is free. 512.00 MiB allowed; Of the allocated"), std::string::npos)
      << st.message();
  EXPECT_EQ(Stat("num_alloc_retries"), 1);
  EXPECT_EQ(Stat("num_device_alloc"), 1);
}

TEST_F(CachingAllocatorSimTest, Spec4_5_DriverCapacityExcludesOtherUsers) {
  Make("", kNewest, 100 * MiB, /*others=*/50 * MiB);
  EXPECT_EQ(sim_->device_free_bytes(), 50 * MiB);
  EXPECT_EQ(TryAlloc(60 * MiB).code(), StatusCode::kOutOfMemory);
  Alloc(40 * MiB);
  EXPECT_EQ(sim_->device_free_bytes(), 10 * MiB);
}

TEST_F(CachingAllocatorSimTest, Spec4_5_NewSegmentStats) {
  Make("max_split_size_mb:40");
  Alloc(50 * MiB);  // segment 50 MiB >= M: oversize
  Alloc(30 * MiB);  // segment 30 MiB
  EXPECT_EQ(Stat("segment.large_pool.current"), 2);
  EXPECT_EQ(Stat("reserved_bytes.large_pool.current"), static_cast<std::int64_t>(80 * MiB));
  EXPECT_EQ(Stat("oversize_segments.current"), 1);
  EXPECT_EQ(Stat("num_device_alloc"), 2);
}

// ---------------------------------------------------------------------------------------------
// §4.6 release_available_cached_blocks

TEST_F(CachingAllocatorSimTest, Spec4_6_ReleaseOversizeBlocks) {
  Make("max_split_size_mb:40", kNewest, 120 * MiB);
  Free(Alloc(100 * MiB));  // cached oversize block at kBase; driver free 20 MiB
  Take();
  // 30 MiB: the 100 MiB candidate is oversize for a request < M (4.4 fails); cudaMalloc(30 MiB)
  // fails; 4c: target = max(30, 40) MiB; the smallest block >= 40 MiB is the 100 MiB one:
  // cudaFree it and retry (not counted as a retry): 30 MiB at kBase.
  EXPECT_EQ(Alloc(30 * MiB), kBase);
  const std::vector<Event> ev = Take();
  EXPECT_EQ(Actions(ev), (std::vector<Action>{A::kSegmentFree, A::kSegmentAlloc, A::kAlloc}));
  EXPECT_EQ(ev[0].size, 100 * MiB);
  EXPECT_EQ(Stat("num_alloc_retries"), 0);
  EXPECT_EQ(Stat("num_sync_all_streams"), 0);
  EXPECT_EQ(Stat("oversize_segments.current"), 0);
  EXPECT_EQ(Stat("oversize_segments.freed"), 1);
}

TEST_F(CachingAllocatorSimTest, Spec4_6_ReleaseSeveralOversizeBlocksFromTheLargestDown) {
  Make("max_split_size_mb:40", kNewest, 250 * MiB);
  Alloc(50 * MiB);                            // live, kBase
  const std::uint64_t x42 = Alloc(42 * MiB);  // kBase + 50
  const std::uint64_t x44 = Alloc(44 * MiB);  // kBase + 92
  const std::uint64_t x46 = Alloc(46 * MiB);  // kBase + 136
  const std::uint64_t x48 = Alloc(48 * MiB);  // kBase + 182; reserved 230, free 20 MiB
  Free(x42);
  Free(x44);
  Free(x46);
  Free(x48);
  Take();
  // 90 MiB: no cached block >= 90 MiB; cudaMalloc fails; 4c walks down from the largest
  // oversize block: 48 (released 48 < 90), 46 (94 >= 90): stop. x42, x44 stay cached.
  // The retry finds 90 MiB at the lowest hole that fits: [kBase+136, kBase+230).
  EXPECT_EQ(Alloc(90 * MiB), kBase + 136 * MiB);
  const std::vector<Event> ev = Take();
  EXPECT_EQ(Actions(ev),
            (std::vector<Action>{A::kSegmentFree, A::kSegmentFree, A::kSegmentAlloc, A::kAlloc}));
  EXPECT_EQ(ev[0].addr, x48);
  EXPECT_EQ(ev[1].addr, x46);
  EXPECT_EQ(BlockAt(x42).state, "inactive");
  EXPECT_EQ(BlockAt(x44).state, "inactive");
  EXPECT_EQ(Stat("num_alloc_retries"), 0);
}

TEST_F(CachingAllocatorSimTest, Spec4_6_AFailedPartialReleaseStaysReleased) {
  Make("max_split_size_mb:40", kNewest, 240 * MiB);
  Alloc(110 * MiB);                           // live, kBase
  const std::uint64_t x24 = Alloc(24 * MiB);  // kBase + 110, not oversize
  const std::uint64_t x42 = Alloc(42 * MiB);  // kBase + 134
  const std::uint64_t x44 = Alloc(44 * MiB);  // kBase + 176; reserved 220, free 20 MiB
  Free(x24);
  Free(x42);
  Free(x44);
  Take();
  // 100 MiB: 4c walks 44 (44), 42 (86) and stops at the 24 MiB block (< M): 86 < 100, "no" --
  // but both stay released. 4d then releases the 24 MiB block too and the counted retry fits
  // 100 MiB at the lowest hole, kBase + 110 MiB.
  EXPECT_EQ(Alloc(100 * MiB), kBase + 110 * MiB);
  const std::vector<Event> ev = Take();
  EXPECT_EQ(Actions(ev), (std::vector<Action>{A::kSegmentFree, A::kSegmentFree, A::kSegmentFree,
                                              A::kSegmentAlloc, A::kAlloc}));
  EXPECT_EQ(ev[0].addr, x44);
  EXPECT_EQ(ev[1].addr, x42);
  EXPECT_EQ(ev[2].addr, x24);
  EXPECT_EQ(Stat("num_alloc_retries"), 1);

  // Failing variant: live 150 MiB, cached 42 + 44 (free 4 MiB). 4c releases both (86 < 100),
  // 4d has nothing left, the retry fails: OOM with 90 MiB free and 150 MiB reserved.
  Make("max_split_size_mb:40", kNewest, 240 * MiB);
  Alloc(150 * MiB);
  const std::uint64_t y42 = Alloc(42 * MiB);
  const std::uint64_t y44 = Alloc(44 * MiB);
  Free(y42);
  Free(y44);
  EXPECT_EQ(TryAlloc(100 * MiB).code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(Stat("reserved_bytes.all.current"), static_cast<std::int64_t>(150 * MiB));
  EXPECT_EQ(sim_->last_oom()->device_free, 90 * MiB);
}

TEST_F(CachingAllocatorSimTest, Spec4_6_DoesNothingWithoutMaxSplitSize) {
  Make("", kNewest, 60 * MiB);
  Alloc(30 * MiB);        // live, kBase
  Free(Alloc(22 * MiB));  // cached at kBase + 30; free 8 MiB
  Take();
  // 25 MiB (segment 26 MiB): 22 < 25; cudaMalloc(26) fails; M unlimited: 4c says "no"; 4d
  // releases the 22 MiB segment and the counted retry succeeds at kBase + 30 MiB.
  EXPECT_EQ(Alloc(25 * MiB), kBase + 30 * MiB);
  EXPECT_EQ(Actions(Take()), (std::vector<Action>{A::kSegmentFree, A::kSegmentAlloc, A::kAlloc}));
  EXPECT_EQ(Stat("num_alloc_retries"), 1);
  EXPECT_EQ(Stat("num_sync_all_streams"), 1);
}

// ---------------------------------------------------------------------------------------------
// §4.7 release_cached_blocks

TEST_F(CachingAllocatorSimTest, Spec4_7_ReleaseCachedBlocksFreesUnsplitBlocksLargePoolFirst) {
  Make();
  Alloc(4 * MiB);                           // kBase: 20 MiB segment, 16 MiB cached, split
  const std::uint64_t b = Alloc(30 * MiB);  // kBase + 20 MiB
  const std::uint64_t s = Alloc(1000);      // kBase + 50 MiB: small segment
  Free(b);
  Free(s);
  Take();
  Empty();
  const std::vector<Event> ev = Take();
  // The large pool first, then the small one; the split 16 MiB block pins its segment.
  EXPECT_EQ(Actions(ev), (std::vector<Action>{A::kSegmentFree, A::kSegmentFree}));
  EXPECT_EQ(ev[0].addr, b);
  EXPECT_EQ(ev[1].addr, s);
  EXPECT_EQ(Stat("reserved_bytes.all.current"), static_cast<std::int64_t>(20 * MiB));
  EXPECT_EQ(Stat("num_device_free"), 2);
  EXPECT_EQ(Stat("num_sync_all_streams"), 1);
}

TEST_F(CachingAllocatorSimTest, Spec4_7_ReleaseSynchronizesEveryOutstandingEvent) {
  Make();
  const std::uint64_t a = Alloc(4 * MiB);
  Record(a, 5);
  Free(a);  // pending on stream 5; never synced
  Take();
  Empty();  // waits for the event: a is cached, its segment is whole and is released
  EXPECT_EQ(Actions(Take()), (std::vector<Action>{A::kFreeCompleted, A::kSegmentFree}));
  EXPECT_EQ(Stat("reserved_bytes.all.current"), 0);
  EXPECT_EQ(Stat("active.all.current"), 0);
}

// ---------------------------------------------------------------------------------------------
// §4.8 Split decision

TEST_F(CachingAllocatorSimTest, Spec4_8_SmallPoolSplitsAnyRemainderOfAtLeast512) {
  Make();
  const std::uint64_t a = Alloc(1024);
  // 2 MiB small block, request 1024 -> split, remainder 2 096 128 (the spec's example).
  EXPECT_EQ(BlockAt(a + 1024).size, 2096128u);
  const std::uint64_t b = Alloc(1 * MiB);  // from the remainder: 1 047 552 left, split again
  EXPECT_EQ(b, a + 1024);
  // 1 047 552 is a small request whose rounded size equals the block: remainder 0, no split.
  const std::uint64_t c = Alloc(1047552);
  EXPECT_EQ(c, b + 1 * MiB);
  EXPECT_EQ(Stat("segment.all.current"), 1);
  EXPECT_EQ(Stat("allocated_bytes.small_pool.current"), static_cast<std::int64_t>(2 * MiB));
}

TEST_F(CachingAllocatorSimTest, Spec4_8_LargeRemainderOfExactly1MiBIsNotSplit) {
  Make();
  // 19 MiB -> 20 MiB segment (>= 10 MiB: rounded up to 2 MiB); remainder exactly 1 MiB: the
  // whole 20 MiB is handed out and counted as allocated.
  Alloc(19 * MiB);
  EXPECT_EQ(LastAlloc().block_size, 20 * MiB);
  EXPECT_EQ(Stat("allocated_bytes.all.current"), static_cast<std::int64_t>(20 * MiB));
  EXPECT_EQ(Stat("requested_bytes.all.current"), static_cast<std::int64_t>(19 * MiB));
  // A freed 12 MiB block and 11 MiB + 1 (rounded 11 MiB + 512): remainder 1 MiB - 512 <= 1 MiB,
  // so the whole 12 MiB block is used.
  const std::uint64_t x = Alloc(12 * MiB);
  Free(x);
  const std::uint64_t y = Alloc(11 * MiB + 1);
  EXPECT_EQ(y, x);
  EXPECT_EQ(LastAlloc().block_size, 12 * MiB);
  Free(y);
  // 11 MiB exactly: remainder 1 MiB, still not split.
  Alloc(11 * MiB);
  EXPECT_EQ(LastAlloc().block_size, 12 * MiB);
  Free(x);
  // 11 MiB - 512: remainder 1 MiB + 512 > 1 MiB: split.
  Alloc(11 * MiB - 512);
  EXPECT_EQ(LastAlloc().block_size, 11 * MiB - 512);
  EXPECT_EQ(BlockAt(x + 11 * MiB - 512).size, 1 * MiB + 512);
}

TEST_F(CachingAllocatorSimTest, Spec4_8_A19_5MiBRequestHoldsTheWhole20MiBSegment) {
  Make();
  // The spec's example: 19.5 MiB needs a 20 MiB segment; remainder 0.5 MiB <= 1 MiB.
  Alloc(19 * MiB + 512 * 1024);
  EXPECT_EQ(LastAlloc().block_size, 20 * MiB);
  EXPECT_EQ(Stat("inactive_split.all.current"), 0);
}

TEST_F(CachingAllocatorSimTest, Spec4_8_OversizeBlocksAreNotSplit) {
  Make("max_split_size_mb:40");
  const std::uint64_t a = Alloc(50 * MiB);
  Free(a);
  // 45 MiB >= M: the 50 MiB block is taken whole although the remainder (5 MiB) is > 1 MiB.
  EXPECT_EQ(Alloc(45 * MiB), a);
  EXPECT_EQ(LastAlloc().block_size, 50 * MiB);
  EXPECT_EQ(Stat("inactive_split.all.current"), 0);
  // Below M the usual rule holds: 20 MiB segment, 10 MiB request, remainder 10 MiB: split.
  Alloc(10 * MiB - 512);
  EXPECT_EQ(LastAlloc().block_size, 10 * MiB - 512);
}

// ---------------------------------------------------------------------------------------------
// §5 Free path

TEST_F(CachingAllocatorSimTest, Spec5_1_FreeUpdatesAllocationStatsAtOnceAndActiveStatsLater) {
  Make();
  const std::uint64_t a = Alloc(4 * MiB);
  Record(a, 3);
  Take();
  Free(a);
  EXPECT_EQ(Actions(Take()), (std::vector<Action>{A::kFreeRequested}));
  EXPECT_EQ(Stat("allocation.all.current"), 0);
  EXPECT_EQ(Stat("allocated_bytes.all.current"), 0);
  EXPECT_EQ(Stat("active.all.current"), 1);
  EXPECT_EQ(Stat("active_bytes.all.current"), static_cast<std::int64_t>(4 * MiB));
  EXPECT_EQ(Stat("requested_bytes.all.current"), static_cast<std::int64_t>(4 * MiB));
  EXPECT_EQ(BlockAt(a).state, "active_pending_free");
  Sync(3);
  Alloc(1000);  // processes the completed event first
  const std::vector<Event> ev = Take();
  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev.front().action, A::kFreeCompleted);
  EXPECT_EQ(ev.front().addr, a);
  EXPECT_EQ(ev.front().size, 4 * MiB);       // the requested size of the freed block
  EXPECT_EQ(Stat("active.all.current"), 1);  // the new small block only
  EXPECT_EQ(Stat("active_bytes.all.current"), 1024);
  EXPECT_EQ(Stat("requested_bytes.all.current"), 1000);
}

TEST_F(CachingAllocatorSimTest, Spec5_1_RecordStreamOnTheAllocationStreamIsIgnored) {
  Make();
  const std::uint64_t a = Alloc(4 * MiB, 2);
  Record(a, 2);
  Take();
  Free(a);
  EXPECT_EQ(Actions(Take()), (std::vector<Action>{A::kFreeRequested, A::kFreeCompleted}));
  EXPECT_EQ(BlockAt(a).state, "inactive");
}

TEST_F(CachingAllocatorSimTest, Spec5_1_FreeOfAnUnknownPointerFails) {
  Make();
  Status st = sim_->Free(0x1234);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "invalid device pointer: 0x1234");
  const std::uint64_t a = Alloc(1000);
  Free(a);
  EXPECT_EQ(sim_->Free(a).code(), StatusCode::kInvalidArgument);  // double free
  EXPECT_EQ(sim_->RecordStream(a, 1).code(), StatusCode::kInvalidArgument);
  Verify();
}

TEST_F(CachingAllocatorSimTest, Spec5_2_EventsCompleteWhenTheirStreamsSyncAndFreeAtTheNextMalloc) {
  Make();
  const std::uint64_t a = Alloc(4 * MiB);
  Record(a, 3);
  Record(a, 4);
  Free(a);  // two events: one on stream 3, one on stream 4
  Sync(3);
  Alloc(1000);  // the stream-4 event is still incomplete
  EXPECT_EQ(BlockAt(a).state, "active_pending_free");
  Sync(4);
  EXPECT_EQ(BlockAt(a).state, "active_pending_free");  // only a malloc polls events
  Take();
  Alloc(1000);
  const std::vector<Event> ev = Take();
  EXPECT_EQ(Actions(ev), (std::vector<Action>{A::kFreeCompleted, A::kAlloc}));
  EXPECT_EQ(BlockAt(a).state, "inactive");
}

TEST_F(CachingAllocatorSimTest, Spec5_2_ASyncCompletesOnlyEventsRecordedBeforeIt) {
  Make();
  const std::uint64_t a = Alloc(4 * MiB);
  Record(a, 3);
  Sync(3);  // nothing recorded yet
  Free(a);  // the event is recorded now, after the sync
  Alloc(1000);
  EXPECT_EQ(BlockAt(a).state, "active_pending_free");
  Sync(std::nullopt);  // all streams
  Alloc(1000);
  EXPECT_EQ(BlockAt(a).state, "inactive");
}

TEST_F(CachingAllocatorSimTest, Spec5_2_EventsOfOneStreamCompleteInRecordingOrder) {
  Make();
  const std::uint64_t a = Alloc(4 * MiB);  // kBase, 16 MiB cached above
  const std::uint64_t b = Alloc(4 * MiB);  // kBase + 4 MiB
  Record(a, 3);
  Record(b, 3);
  Free(b);
  Free(a);
  Sync(3);
  Take();
  Alloc(1000);
  const std::vector<Event> ev = Take();
  ASSERT_GE(ev.size(), 2u);
  EXPECT_EQ(ev[0].action, A::kFreeCompleted);
  EXPECT_EQ(ev[0].addr, b);  // recorded first
  EXPECT_EQ(ev[1].action, A::kFreeCompleted);
  EXPECT_EQ(ev[1].addr, a);
}

TEST_F(CachingAllocatorSimTest, Spec5_3_FreeMergesWithPrevThenNext) {
  Make();
  // One 20 MiB segment: a [0,4) b [4,8) c [8,12) MiB, cached [12,20). Distinct requests that all
  // round to 4 MiB.
  const std::uint64_t a = Alloc(4 * MiB - 100);
  const std::uint64_t b = Alloc(4 * MiB - 200);
  const std::uint64_t c = Alloc(4 * MiB - 300);
  Free(a);  // [0,4) cached, split
  Free(c);  // merges with the cached [12,20): [8,20)
  EXPECT_EQ(BlockAt(c).size, 12 * MiB);
  Free(b);  // merges with prev [0,4) and next [8,20): one unsplit 20 MiB block
  const std::vector<SnapshotSegment> snap = sim_->MemorySnapshot();
  ASSERT_EQ(snap.size(), 1u);
  ASSERT_EQ(snap[0].blocks.size(), 1u);
  EXPECT_EQ(snap[0].blocks[0].size, 20 * MiB);
  // The merged block is b's (the freed block absorbs its neighbours): PyTorch's snapshot shows
  // its stale requested_size.
  EXPECT_EQ(snap[0].blocks[0].requested_size, 4 * MiB - 200);
  EXPECT_EQ(Stat("inactive_split.all.current"), 0);
  Empty();  // a whole free segment is releasable
  EXPECT_EQ(Stat("reserved_bytes.all.current"), 0);
}

// ---------------------------------------------------------------------------------------------
// §6 Expandable segments

TEST_F(CachingAllocatorSimTest, Spec6_1_OneReservationPerStreamAndPoolSizedFromTotalMemory) {
  Make("expandable_segments:True", kNewest, 1 * GiB);
  // Small reservation: ceil((1 GiB + 128 MiB) / 2 MiB) pages = 576 pages = 1152 MiB, then one
  // 2 MiB page of gap. Large: ceil(1152 MiB / 20 MiB) = 58 pages = 1160 MiB, then 20 MiB gap.
  EXPECT_EQ(Alloc(512), kResBase);
  EXPECT_EQ(Alloc(30 * MiB), kResBase + 1154 * MiB);
  EXPECT_EQ(Alloc(512, /*stream=*/1), kResBase + 1154 * MiB + 1180 * MiB);
  EXPECT_EQ(Alloc(512), kResBase + 512);  // stream 0 small: the same reservation
  const std::vector<SnapshotSegment> snap = sim_->MemorySnapshot();
  ASSERT_EQ(snap.size(), 3u);
  for (const SnapshotSegment& s : snap) EXPECT_TRUE(s.is_expandable);
  EXPECT_EQ(Stat("segment.all.current"), 0);  // mappings never count as segments
}

TEST_F(CachingAllocatorSimTest, Spec6_2_TheFirst512ByteRequestMapsOnePage) {
  Make("expandable_segments:True", kNewest, 1 * GiB);
  Alloc(512);
  const std::vector<Event> ev = Take();
  ASSERT_EQ(Actions(ev), (std::vector<Action>{A::kSegmentMap, A::kAlloc}));
  EXPECT_EQ(ev[0].addr, kResBase);
  EXPECT_EQ(ev[0].size, 2 * MiB);
  EXPECT_EQ(ev[0].pool, Pool::kSmall);
  EXPECT_EQ(ev[1].block_size, 512u);
  // Same reserved bytes as a normal small segment, but no `segment`.
  EXPECT_EQ(Stat("reserved_bytes.small_pool.current"), static_cast<std::int64_t>(2 * MiB));
  EXPECT_EQ(Stat("segment.all.current"), 0);
  EXPECT_EQ(Stat("num_device_alloc"), 1);
}

TEST_F(CachingAllocatorSimTest, Spec6_2_GrowingExamples) {
  Make("expandable_segments:True", kNewest, 1 * GiB);
  const std::uint64_t L = kResBase;
  // 30 MiB in a fresh large segment maps 40 MiB (2 pages) and splits off a 10 MiB free tail.
  EXPECT_EQ(Alloc(30 * MiB), L);
  std::vector<Event> ev = Take();
  ASSERT_EQ(Actions(ev), (std::vector<Action>{A::kSegmentMap, A::kAlloc}));
  EXPECT_EQ(ev[0].size, 40 * MiB);
  EXPECT_EQ(BlockAt(L + 30 * MiB).size, 10 * MiB);
  // The next 8 MiB takes the tail without mapping.
  EXPECT_EQ(Alloc(8 * MiB), L + 30 * MiB);
  EXPECT_EQ(Actions(Take()), (std::vector<Action>{A::kAlloc}));
  // 5 MiB: the 2 MiB tail is too small; it is extended by one more page [40, 60) and the
  // allocation starts at the tail: [38, 43), leaving [43, 60) = 17 MiB free.
  EXPECT_EQ(Alloc(5 * MiB), L + 38 * MiB);
  ev = Take();
  ASSERT_EQ(Actions(ev), (std::vector<Action>{A::kSegmentMap, A::kAlloc}));
  EXPECT_EQ(ev[0].addr, L + 40 * MiB);
  EXPECT_EQ(ev[0].size, 20 * MiB);
  EXPECT_EQ(BlockAt(L + 43 * MiB).size, 17 * MiB);
  EXPECT_EQ(Stat("reserved_bytes.all.current"), static_cast<std::int64_t>(60 * MiB));
  EXPECT_EQ(Stat("num_device_alloc"), 2);
  EXPECT_EQ(Stat("segment.all.current"), 0);
  ASSERT_EQ(sim_->MemorySnapshot().size(), 1u);  // one contiguous mapped range
}

TEST_F(CachingAllocatorSimTest, Spec6_2_GapsLeftByUnmappingAreRefilledFirst) {
  Make("expandable_segments:True", kNewest, 1 * GiB);
  const std::uint64_t L = kResBase;
  EXPECT_EQ(Alloc(20 * MiB), L);             // page 0, exactly: no remainder
  const std::uint64_t b = Alloc(20 * MiB);   // page 1
  EXPECT_EQ(Alloc(20 * MiB), L + 40 * MiB);  // page 2
  Free(b);
  Take();
  Empty();  // page 1 is a whole free page: unmapped; two mapped ranges remain
  std::vector<Event> ev = Take();
  ASSERT_EQ(Actions(ev), (std::vector<Action>{A::kSegmentUnmap}));
  EXPECT_EQ(ev[0].addr, L + 20 * MiB);
  EXPECT_EQ(ev[0].size, 20 * MiB);
  EXPECT_EQ(sim_->MemorySnapshot().size(), 2u);
  EXPECT_EQ(Stat("num_device_free"), 1);
  // 10 MiB: the lowest unmapped range of the stream is the gap; one page is mapped there and
  // the segment is one range again.
  EXPECT_EQ(Alloc(10 * MiB), L + 20 * MiB);
  ev = Take();
  ASSERT_EQ(Actions(ev), (std::vector<Action>{A::kSegmentMap, A::kAlloc}));
  EXPECT_EQ(ev[0].addr, L + 20 * MiB);
  ASSERT_EQ(sim_->MemorySnapshot().size(), 1u);
  EXPECT_EQ(sim_->MemorySnapshot()[0].total_size, 60 * MiB);
}

TEST_F(CachingAllocatorSimTest, Spec6_2_AFailedMappingEndsInTheOomPath) {
  Make("expandable_segments:True", kNewest, 100 * MiB);
  Alloc(90 * MiB);  // maps 5 pages = 100 MiB: the whole device; a 10 MiB free tail
  Take();
  // 20 MiB: the tail is too small; growing needs one more page, the driver has none; 4d's
  // release finds no whole free page (the tail is part of page 4). OOM; nothing mapped.
  const Status st = TryAlloc(20 * MiB);
  EXPECT_EQ(st.code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(Actions(Take()), (std::vector<Action>{A::kOom}));
  EXPECT_NE(st.message().find("Tried to allocate 20.00 MiB. GPU 0 has a total capacity of "
                              "100.00 MiB of which 0 bytes is free."),
            std::string::npos)
      << st.message();
  EXPECT_EQ(Stat("num_alloc_retries"), 1);
  EXPECT_EQ(Stat("reserved_bytes.all.current"), static_cast<std::int64_t>(100 * MiB));
}

TEST_F(CachingAllocatorSimTest, Spec6_3_MaxSplitSizeDoesNotStopSplittingInExpandableMode) {
  Make("expandable_segments:True,max_split_size_mb:40", kNewest, 1 * GiB);
  const std::uint64_t L = kResBase;
  Free(Alloc(100 * MiB));  // maps 100 MiB; one cached 100 MiB block before the unmapped rest
  Take();
  // 50 MiB: the search refuses the 100 MiB block (>= 50 + 20); growing finds the same free
  // block followed by unmapped space, already big enough: no mapping. Expandable mode splits
  // any remainder >= 512 even though 50 MiB >= M.
  EXPECT_EQ(Alloc(50 * MiB), L);
  EXPECT_EQ(Actions(Take()), (std::vector<Action>{A::kAlloc}));
  EXPECT_EQ(BlockAt(L).size, 50 * MiB);
  EXPECT_EQ(BlockAt(L + 50 * MiB).state, "inactive");
  EXPECT_EQ(Stat("oversize_allocations.current"), 1);
}

TEST_F(CachingAllocatorSimTest, Spec6_3_FractionLimitComparesTheSegmentSizeNotTheMappedBytes) {
  Make("expandable_segments:True", kNewest, 1 * GiB);
  Fraction(90.0 / 1024.0);  // limit exactly 90 MiB
  // 81 MiB: the check is 0 + 82 MiB (its §4.3 segment size) <= 90 MiB, but 5 pages = 100 MiB
  // get mapped: reserved ends above the limit.
  Alloc(81 * MiB);
  EXPECT_EQ(Stat("reserved_bytes.all.current"), static_cast<std::int64_t>(100 * MiB));
  // 20 MiB: the 19 MiB tail is too small and 100 + 20 MiB > 90 MiB: refused.
  const Status st = TryAlloc(20 * MiB);
  EXPECT_EQ(st.code(), StatusCode::kOutOfMemory);
  EXPECT_NE(st.message().find("90.00 MiB allowed; "), std::string::npos) << st.message();
}

TEST_F(CachingAllocatorSimTest, Spec6_3_TurningExpandableSegmentsOffSkipsExpandableBlocks) {
  Make("expandable_segments:True");
  const std::uint64_t L = kResBase;
  const std::uint64_t a = Alloc(4 * MiB);  // maps [L, L+20), 16 MiB free tail
  EXPECT_EQ(a, L);
  Settings("expandable_segments:False");
  Take();
  // 4 MiB: the only fit is the expandable tail, skipped now: a cudaMalloc'd 20 MiB segment.
  EXPECT_EQ(Alloc(4 * MiB), kBase);
  EXPECT_EQ(Actions(Take()), (std::vector<Action>{A::kSegmentAlloc, A::kAlloc}));
  Free(a);  // the expandable block stays cached: [L, L+20) in one piece
  EXPECT_EQ(BlockAt(L).size, 20 * MiB);
  // The next 4 MiB goes to the non-expandable 16 MiB block.
  EXPECT_EQ(Alloc(4 * MiB), kBase + 4 * MiB);
}

TEST_F(CachingAllocatorSimTest, Spec6_3_ExpandableBlocksAreNotInactiveSplit) {
  Make("expandable_segments:True");
  const std::uint64_t a = Alloc(4 * MiB);  // a 16 MiB free remainder next to it
  EXPECT_EQ(Stat("inactive_split.all.current"), 0);
  EXPECT_EQ(Stat("inactive_split_bytes.all.current"), 0);
  Free(a);
  EXPECT_EQ(Stat("inactive_split.all.allocated"), 0);
  // The same in a cudaMalloc'd segment counts.
  Make();
  Alloc(4 * MiB);
  EXPECT_EQ(Stat("inactive_split.all.current"), 1);
  EXPECT_EQ(Stat("inactive_split_bytes.all.current"), static_cast<std::int64_t>(16 * MiB));
}

TEST_F(CachingAllocatorSimTest, Spec6_3_ReleaseOfOversizeBlocksSkipsExpandableBlocks) {
  Make("expandable_segments:True,max_split_size_mb:40", kNewest, 200 * MiB);
  Free(Alloc(100 * MiB));  // a cached expandable 100 MiB block; driver free 100 MiB
  Settings("expandable_segments:False,max_split_size_mb:40");
  Take();
  // 150 MiB: no fit; cudaMalloc(150) fails; 4c finds only the expandable block and may not
  // cudaFree it ("no"); 4d unmaps its 5 pages (the reservation disappears) and the retry fits.
  EXPECT_EQ(Alloc(150 * MiB), kBase);
  const std::vector<Event> ev = Take();
  EXPECT_EQ(Actions(ev), (std::vector<Action>{A::kSegmentUnmap, A::kSegmentAlloc, A::kAlloc}));
  EXPECT_EQ(ev[0].size, 100 * MiB);
  EXPECT_EQ(Stat("num_alloc_retries"), 1);
}

TEST_F(CachingAllocatorSimTest, Spec6_4_ShrinkingUnmapsWholeFreePagesOnly) {
  Make("expandable_segments:True", kNewest, 1 * GiB);
  const std::uint64_t L = kResBase;
  const std::uint64_t a = Alloc(30 * MiB);  // maps [0, 40); free tail [30, 40)
  Take();
  Empty();  // the tail lies inside page 1 with a: nothing to unmap
  EXPECT_TRUE(Take().empty());
  EXPECT_EQ(Stat("reserved_bytes.all.current"), static_cast<std::int64_t>(40 * MiB));
  Free(a);  // [0, 40) free
  Take();
  Empty();  // both pages unmapped; the whole reservation is unmapped: destroyed
  const std::vector<Event> ev = Take();
  ASSERT_EQ(Actions(ev), (std::vector<Action>{A::kSegmentUnmap}));
  EXPECT_EQ(ev[0].addr, L);
  EXPECT_EQ(ev[0].size, 40 * MiB);
  EXPECT_TRUE(sim_->MemorySnapshot().empty());
  EXPECT_EQ(Stat("reserved_bytes.all.current"), 0);
  EXPECT_EQ(Stat("num_device_free"), 1);
  // A new reservation reuses the lowest address.
  EXPECT_EQ(Alloc(30 * MiB), L);
}

TEST_F(CachingAllocatorSimTest, Spec6_4_PartialPagesStayMappedAsFreeBlocks) {
  Make("expandable_segments:True", kNewest, 1 * GiB);
  const std::uint64_t L = kResBase;
  EXPECT_EQ(Alloc(10 * MiB), L);            // page 0: [0,10) + free [10,20)
  const std::uint64_t b = Alloc(30 * MiB);  // [10,40): grows by page 1
  EXPECT_EQ(b, L + 10 * MiB);
  EXPECT_EQ(Alloc(10 * MiB), L + 40 * MiB);  // page 2: [40,50) + free [50,60)
  Free(b);
  Take();
  Empty();
  // [10,40) holds one whole page, [20,40): unmapped; [10,20) stays mapped and free. The tail
  // [50,60) has no whole page.
  const std::vector<Event> ev = Take();
  ASSERT_EQ(Actions(ev), (std::vector<Action>{A::kSegmentUnmap}));
  EXPECT_EQ(ev[0].addr, L + 20 * MiB);
  EXPECT_EQ(ev[0].size, 20 * MiB);
  const std::vector<SnapshotSegment> snap = sim_->MemorySnapshot();
  ASSERT_EQ(snap.size(), 2u);  // one segment per contiguous mapped range
  EXPECT_EQ(snap[0].address, L);
  EXPECT_EQ(snap[0].total_size, 20 * MiB);
  EXPECT_EQ(snap[1].address, L + 40 * MiB);
  EXPECT_EQ(snap[1].total_size, 20 * MiB);
  EXPECT_EQ(BlockAt(L + 10 * MiB).state, "inactive");
  EXPECT_EQ(Stat("reserved_bytes.all.current"), static_cast<std::int64_t>(40 * MiB));
}

// Why expandable segments can run out of memory sooner than the defaults (the bundled
// gpt_tiny sample on 520 MiB: step 5 instead of step 18, docs/simulator.md "Expandable
// segments"). The large pool maps 20 MiB pages, and the OOM retry gives back only pages lying
// wholly inside a free block. A freed tensor that straddles a page boundary, between live
// tensors, stays mapped in pieces. The defaults' cudaMalloc'd segment of the same tensor is
// rounded to 2 MiB and goes back whole once it is free.
TEST_F(CachingAllocatorSimTest, Spec6_4_FreedPiecesWithoutAWholePageStayMappedSoTheRetryFails) {
  const std::uint64_t cap = 60 * MiB;
  Make("expandable_segments:True", kNewest, cap);
  const std::uint64_t L = kResBase;
  EXPECT_EQ(Alloc(15 * MiB), L);  // maps page 0: [0,15) + free [15,20)
  const std::uint64_t b = Alloc(15 * MiB);
  EXPECT_EQ(b, L + 15 * MiB);                // the free [15,20) grows in place by page 1: [15,30)
  EXPECT_EQ(Alloc(15 * MiB), L + 30 * MiB);  // grows by page 2: [30,45) + free [45,60)
  EXPECT_EQ(Stat("reserved_bytes.all.current"), static_cast<std::int64_t>(cap));
  Free(b);  // [15,30) free: it crosses the page 0/1 boundary and holds no whole page
  Take();
  // 20 MiB: no free block is large enough; growing the free tail [45,60) needs page 3 and the
  // driver has nothing left; the retry's release finds no whole free page. 30 MiB is free, in
  // two 15 MiB pieces.
  const Status st = TryAlloc(20 * MiB);
  EXPECT_EQ(st.code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(Actions(Take()), (std::vector<Action>{A::kOom}));
  EXPECT_NE(st.message().find("of which 0 bytes is free. Of the allocated memory 30.00 MiB is "
                              "allocated by PyTorch, and 30.00 MiB is reserved by PyTorch but "
                              "unallocated."),
            std::string::npos)
      << st.message();

  // The same requests under the defaults: three 16 MiB segments; the retry cudaFrees the
  // freed one whole, and 12 + 16 MiB free holds the new 20 MiB segment.
  Make("", kNewest, cap);
  Alloc(15 * MiB);
  const std::uint64_t d = Alloc(15 * MiB);
  Alloc(15 * MiB);
  Free(d);
  Alloc(20 * MiB);
  EXPECT_EQ(Stat("num_alloc_retries"), 1);
  EXPECT_EQ(Stat("reserved_bytes.all.current"), static_cast<std::int64_t>(52 * MiB));
}

// ---------------------------------------------------------------------------------------------
// §7 Memory fraction

TEST_F(CachingAllocatorSimTest, Spec7_NewestLimitIsOnOnlyBelowOne) {
  Make("", kNewest, 100 * MiB);
  Fraction(1.0);
  Status st = TryAlloc(200 * MiB);
  EXPECT_EQ(st.message().find("allowed"), std::string::npos) << st.message();
  EXPECT_FALSE(sim_->last_oom()->limit.has_value());
  // PyTorch <= 2.8: any call, even with 1.0, turns the limit on (limit = total).
  Make("", kV2, 100 * MiB);
  Fraction(1.0);
  st = TryAlloc(200 * MiB);
  EXPECT_NE(st.message().find("of which 100.00 MiB is free. 100.00 MiB allowed; "),
            std::string::npos)
      << st.message();
  EXPECT_EQ(sim_->last_oom()->limit, 100 * MiB);
  // Without a call, no limit in either version.
  Make("", kV2, 100 * MiB);
  st = TryAlloc(200 * MiB);
  EXPECT_EQ(st.message().find("allowed"), std::string::npos) << st.message();
}

TEST_F(CachingAllocatorSimTest, Spec7_FractionZeroFailsEveryNewSegmentButCachedBlocksServe) {
  Make("", kNewest, 1 * GiB);
  const std::uint64_t a = Alloc(1 * MiB);
  Free(a);
  Fraction(0.0);
  // Cached blocks are always usable: the 2 MiB small segment serves two 1 MiB requests.
  EXPECT_EQ(Alloc(1 * MiB), a);
  EXPECT_EQ(Alloc(1 * MiB), a + 1 * MiB);
  const Status st = TryAlloc(1 * MiB);  // needs a new segment: 2 MiB + 2 MiB > 0 bytes
  EXPECT_EQ(st.code(), StatusCode::kOutOfMemory);
  EXPECT_NE(st.message().find("Tried to allocate 2.00 MiB."), std::string::npos);
  EXPECT_NE(st.message().find(" is free. 0 bytes allowed; "), std::string::npos) << st.message();
}

TEST_F(CachingAllocatorSimTest, Spec7_InvalidFractionsAreRejected) {
  Make();
  EXPECT_EQ(sim_->SetMemoryFraction(-0.5).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(sim_->SetMemoryFraction(1.5).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(sim_->SetMemoryFraction(std::nan("")).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(sim_->SetMemoryFraction(0.25).ok());
  Verify();
}

TEST_F(CachingAllocatorSimTest, Spec7_PerProcessMemoryFractionOptionSetsTheInitialLimit) {
  Make("per_process_memory_fraction:0.5", kNewest, 100 * MiB);
  const Status st = TryAlloc(60 * MiB);  // 60 MiB > 50 MiB allowed
  EXPECT_EQ(st.code(), StatusCode::kOutOfMemory);
  EXPECT_NE(st.message().find("50.00 MiB allowed; "), std::string::npos) << st.message();
}

// ---------------------------------------------------------------------------------------------
// §8 Garbage collection

// The §8 scene: limit 512 MiB (fraction 0.5 of 1 GiB) and GC threshold 0.9, so gc_limit =
// floor(0.9 * 536 870 912) = 483 183 820 bytes (460.8 MiB). The large pool's search counter
// counts every search from the first allocation on (GC is enabled from the start).
TEST_F(CachingAllocatorSimTest, Spec8_GcFreesBlocksAtLeastAsOldAsTheAverage) {
  Make("garbage_collection_threshold:0.9", kNewest, 1 * GiB);
  Fraction(0.5);
  const std::uint64_t a = Alloc(100 * MiB);  // search 1
  const std::uint64_t b = Alloc(100 * MiB);  // search 2
  Alloc(100 * MiB);                          // search 3
  Alloc(100 * MiB);                          // search 4; reserved 400 MiB
  Free(a);                                   // inserted at count 4
  Alloc(20 * MiB, 1);                        // search 5; 400 MiB <= gc_limit; reserved 420
  Free(b);                                   // inserted at count 5
  Alloc(20 * MiB, 1);                        // search 6; 420 <= gc_limit; reserved 440
  Alloc(30 * MiB, 1);                        // search 7; 440 <= gc_limit; reserved 470
  Take();
  // Search 8 fails; 470 MiB = 492 830 720 > gc_limit: target = 9 646 900 bytes. Ages: a 8-4 = 4,
  // b 8-5 = 3; average 3.5. One pass frees a only (4 >= 3.5; 3 < 3.5): 100 MiB >= target.
  // The new 30 MiB segment then takes a's range, the lowest free address.
  EXPECT_EQ(Alloc(30 * MiB, 1), kBase);
  const std::vector<Event> ev = Take();
  EXPECT_EQ(Actions(ev), (std::vector<Action>{A::kSegmentFree, A::kSegmentAlloc, A::kAlloc}));
  EXPECT_EQ(ev[0].addr, a);
  EXPECT_EQ(BlockAt(b).state, "inactive");
  EXPECT_EQ(Stat("num_sync_all_streams"), 0);  // GC does not synchronise
  EXPECT_EQ(Stat("num_alloc_retries"), 0);
}

TEST_F(CachingAllocatorSimTest, Spec8_GcDoesNotStopAtTheTarget) {
  Make("garbage_collection_threshold:0.9", kNewest, 1 * GiB);
  Fraction(0.5);
  const std::uint64_t a = Alloc(100 * MiB);
  const std::uint64_t b = Alloc(100 * MiB);
  Alloc(100 * MiB);
  Alloc(100 * MiB);  // 4 searches
  Free(a);
  Free(b);  // both inserted at count 4
  Alloc(20 * MiB, 1);
  Alloc(20 * MiB, 1);
  Alloc(30 * MiB, 1);  // searches 5-7, reserved 470 MiB
  Take();
  // Search 8: both ages are 4 = the average: both go although 100 MiB would have done.
  EXPECT_EQ(Alloc(30 * MiB, 1), kBase);
  EXPECT_EQ(Actions(Take()),
            (std::vector<Action>{A::kSegmentFree, A::kSegmentFree, A::kSegmentAlloc, A::kAlloc}));
  EXPECT_EQ(Stat("reserved_bytes.all.current"), static_cast<std::int64_t>(300 * MiB));
}

TEST_F(CachingAllocatorSimTest, Spec8_TheSmallPoolIsNeverCollected) {
  Make("garbage_collection_threshold:0.9", kNewest, 1 * GiB);
  Fraction(0.5);
  const std::uint64_t s = Alloc(1000);  // small segment [0, 2) MiB, the oldest cached block
  Free(s);
  const std::uint64_t a = Alloc(100 * MiB);  // large searches 1-4: [2, 402)
  const std::uint64_t b = Alloc(100 * MiB);
  Alloc(100 * MiB);
  Alloc(100 * MiB);
  Free(a);
  Free(b);
  Alloc(20 * MiB, 1);  // 5: reserved 422 MiB
  Alloc(20 * MiB, 1);  // 6: 442 MiB
  Alloc(30 * MiB, 1);  // 7: 472 MiB = 494 927 872 > gc_limit only from the next search on
  Take();
  // Search 8: GC frees a and b (ages 4 = the average) but not the small segment; the 30 MiB
  // segment lands in the hole they leave at kBase + 2 MiB.
  EXPECT_EQ(Alloc(30 * MiB, 1), kBase + 2 * MiB);
  EXPECT_EQ(Actions(Take()),
            (std::vector<Action>{A::kSegmentFree, A::kSegmentFree, A::kSegmentAlloc, A::kAlloc}));
  EXPECT_EQ(BlockAt(s).state, "inactive");
  EXPECT_EQ(Stat("segment.small_pool.current"), 1);
}

TEST_F(CachingAllocatorSimTest, Spec8_GcNeedsTheFractionLimit) {
  Make("garbage_collection_threshold:0.9", kNewest, 1 * GiB);  // no fraction: GC is off
  const std::uint64_t a = Alloc(100 * MiB);
  Alloc(100 * MiB);
  Alloc(100 * MiB);
  Alloc(100 * MiB);
  Free(a);
  Alloc(20 * MiB, 1);
  Alloc(20 * MiB, 1);
  Alloc(30 * MiB, 1);
  Take();
  EXPECT_EQ(Alloc(30 * MiB, 1), kBase + 470 * MiB);
  EXPECT_EQ(Actions(Take()), (std::vector<Action>{A::kSegmentAlloc, A::kAlloc}));
}

// ---------------------------------------------------------------------------------------------
// §9 empty_cache, §10 private pools

TEST_F(CachingAllocatorSimTest, Spec9_EmptyCacheReturnsWholeFreeSegmentsAndCountsASync) {
  Make();
  const std::uint64_t a = Alloc(4 * MiB);  // pins its segment
  const std::uint64_t b = Alloc(24 * MiB);
  Free(b);
  Empty();
  Empty();  // nothing left to release, but still a sync of all streams
  EXPECT_EQ(Stat("num_sync_all_streams"), 2);
  EXPECT_EQ(Stat("reserved_bytes.all.current"), static_cast<std::int64_t>(20 * MiB));
  EXPECT_EQ(BlockAt(a).state, "active_allocated");  // live blocks never move
}

TEST_F(CachingAllocatorSimTest, Spec10_NoPrivatePoolsSoNoPrivatePoolClause) {
  // The simulator models no CUDA graphs or MemPools: the OOM text never has the "allocated in
  // private pools" clause and "allocated by PyTorch" is exactly allocated_bytes.all.current.
  Make("", kNewest, 100 * MiB);
  Alloc(4 * MiB);
  const Status st = TryAlloc(90 * MiB);
  EXPECT_EQ(st.message().find("private pools"), std::string::npos);
  EXPECT_NE(st.message().find("Of the allocated memory 4.00 MiB is allocated by PyTorch, and "
                              "16.00 MiB is reserved by PyTorch but unallocated."),
            std::string::npos)
      << st.message();
}

// ---------------------------------------------------------------------------------------------
// §11 Statistics

TEST_F(CachingAllocatorSimTest, Spec11_1_FlattenedKeysArePyTorchs) {
  Make();
  const auto flat = sim_->stats().Flatten();
  // 9 arrays x 3 pools x 4 metrics + 2 single stats x 4 + 6 scalars.
  EXPECT_EQ(flat.size(), 9u * 3 * 4 + 2 * 4 + 6);
  for (const char* key :
       {"allocation.all.current", "allocation.small_pool.peak", "segment.large_pool.freed",
        "active.all.allocated", "inactive_split.all.current", "allocated_bytes.all.peak",
        "reserved_bytes.large_pool.current", "active_bytes.small_pool.freed",
        "inactive_split_bytes.all.current", "requested_bytes.large_pool.allocated",
        "oversize_allocations.current", "oversize_segments.peak", "num_alloc_retries", "num_ooms",
        "num_sync_all_streams", "num_device_alloc", "num_device_free", "max_split_size"}) {
    EXPECT_EQ(flat.count(key), 1u) << key;
  }
  EXPECT_EQ(flat.count("allocated.all.current"), 0u);  // the docstring's name is not the key
  EXPECT_EQ(flat.at("max_split_size"), -1);            // unlimited
}

TEST_F(CachingAllocatorSimTest, Spec11_2_StatsAfterAScriptedSequence) {
  Make("", kNewest, 1 * GiB);
  // 1. a = 1000 B: small segment (2 MiB), block 1024 split off, remainder 2 096 128 cached.
  const std::uint64_t a = Alloc(1000);
  // 2. b = 5 MiB: large segment 20 MiB, block 5 MiB, remainder 15 MiB = 15 728 640 cached.
  const std::uint64_t b = Alloc(5 * MiB);
  // 3. free a: it merges with its remainder (inactive_split small -1, -2 096 128).
  Free(a);
  // 4. empty_cache: the whole small segment goes; b's segment is pinned.
  Empty();
  // 5. free b: merges with its remainder (inactive_split large -1, -15 728 640).
  Free(b);
  std::map<std::string, std::int64_t> want;
  for (const auto& [key, value] : sim_->stats().Flatten()) want[key] = 0;  // unmoved keys: 0
  auto set4 = [&want](const std::string& k, std::int64_t cur, std::int64_t peak, std::int64_t alloc,
                      std::int64_t freed) {
    want[k + ".current"] = cur;
    want[k + ".peak"] = peak;
    want[k + ".allocated"] = alloc;
    want[k + ".freed"] = freed;
  };
  const std::int64_t s = 1024, l = 5242880;        // the two blocks
  const std::int64_t rs = 2096128, rl = 15728640;  // their split remainders
  for (const char* fam : {"allocation", "active"}) {
    set4(std::string(fam) + ".all", 0, 2, 2, 2);
    set4(std::string(fam) + ".small_pool", 0, 1, 1, 1);
    set4(std::string(fam) + ".large_pool", 0, 1, 1, 1);
  }
  for (const char* fam : {"allocated_bytes", "active_bytes"}) {
    set4(std::string(fam) + ".all", 0, s + l, s + l, s + l);
    set4(std::string(fam) + ".small_pool", 0, s, s, s);
    set4(std::string(fam) + ".large_pool", 0, l, l, l);
  }
  set4("requested_bytes.all", 0, 1000 + l, 1000 + l, 1000 + l);
  set4("requested_bytes.small_pool", 0, 1000, 1000, 1000);
  set4("requested_bytes.large_pool", 0, l, l, l);
  set4("segment.all", 1, 2, 2, 1);
  set4("segment.small_pool", 0, 1, 1, 1);
  set4("segment.large_pool", 1, 1, 1, 0);
  set4("reserved_bytes.all", 20 * MiB, 22 * MiB, 22 * MiB, 2 * MiB);
  set4("reserved_bytes.small_pool", 0, 2 * MiB, 2 * MiB, 2 * MiB);
  set4("reserved_bytes.large_pool", 20 * MiB, 20 * MiB, 20 * MiB, 0);
  set4("inactive_split.all", 0, 2, 2, 2);
  set4("inactive_split.small_pool", 0, 1, 1, 1);
  set4("inactive_split.large_pool", 0, 1, 1, 1);
  set4("inactive_split_bytes.all", 0, rs + rl, rs + rl, rs + rl);
  set4("inactive_split_bytes.small_pool", 0, rs, rs, rs);
  set4("inactive_split_bytes.large_pool", 0, rl, rl, rl);
  want["num_sync_all_streams"] = 1;
  want["num_device_alloc"] = 2;
  want["num_device_free"] = 1;
  want["max_split_size"] = -1;
  const auto have = sim_->stats().Flatten();
  for (const auto& [key, value] : want) EXPECT_EQ(have.at(key), value) << key;
  EXPECT_EQ(have.size(), want.size());
}

TEST_F(CachingAllocatorSimTest, Spec11_3_InactiveSplitAccounting) {
  Make();
  auto count = [this] { return Stat("inactive_split.all.current"); };
  auto bytes = [this] { return Stat("inactive_split_bytes.all.current"); };
  // Hand-out of an unsplit block that gets split: +1, +remainder (16 MiB).
  const std::uint64_t a = Alloc(4 * MiB);
  EXPECT_EQ(count(), 1);
  EXPECT_EQ(bytes(), static_cast<std::int64_t>(16 * MiB));
  // An already-split free block split again: count unchanged, bytes -4 MiB.
  const std::uint64_t b = Alloc(4 * MiB);
  EXPECT_EQ(count(), 1);
  EXPECT_EQ(bytes(), static_cast<std::int64_t>(12 * MiB));
  // An already-split free block handed out whole (11 MiB leaves 1 MiB: no split): -1, -12 MiB.
  const std::uint64_t c = Alloc(11 * MiB);
  EXPECT_EQ(count(), 0);
  EXPECT_EQ(bytes(), 0);
  // free b: no free neighbour, still split: +1, +4 MiB.
  Free(b);
  EXPECT_EQ(count(), 1);
  EXPECT_EQ(bytes(), static_cast<std::int64_t>(4 * MiB));
  // free a: absorbs b (-1, -4 MiB), still split (c follows): +1, +8 MiB. Net: 1, 8 MiB.
  Free(a);
  EXPECT_EQ(count(), 1);
  EXPECT_EQ(bytes(), static_cast<std::int64_t>(8 * MiB));
  // free c: absorbs [0, 8) (-1, -8 MiB) and is then the whole segment: 0, 0.
  Free(c);
  EXPECT_EQ(count(), 0);
  EXPECT_EQ(bytes(), 0);
  // Accumulated: increases 16 + 4 + 4 (net of "free a") = 24 MiB, decreases 4 + 12 + 8 = 24 MiB;
  // counts +1 (a), +1 (free b) and -1 (c), -1 (free c); "free a" nets 0 and moves nothing.
  EXPECT_EQ(Stat("inactive_split.all.allocated"), 2);
  EXPECT_EQ(Stat("inactive_split.all.freed"), 2);
  EXPECT_EQ(Stat("inactive_split.all.peak"), 1);
  EXPECT_EQ(Stat("inactive_split_bytes.all.allocated"), static_cast<std::int64_t>(24 * MiB));
  EXPECT_EQ(Stat("inactive_split_bytes.all.freed"), static_cast<std::int64_t>(24 * MiB));
  EXPECT_EQ(Stat("inactive_split_bytes.all.peak"), static_cast<std::int64_t>(16 * MiB));
}

TEST_F(CachingAllocatorSimTest, Spec11_4_SnapshotAndStatsAgree) {
  // A mixed state: split and unsplit cudaMalloc'd segments, a pending-free block, both pools.
  // Verify() (after every step) checks every §11.4 identity; a few are spelled out here.
  Make();
  const std::uint64_t a = Alloc(4 * MiB - 100);
  const std::uint64_t b = Alloc(3000);
  Alloc(30 * MiB);
  Record(a, 9);
  Free(a);
  Free(b);
  const std::vector<SnapshotSegment> snap = sim_->MemorySnapshot();
  ASSERT_EQ(snap.size(), 3u);
  // Segment at kBase: a pending (active, not allocated), 16 MiB inactive.
  EXPECT_EQ(snap[0].total_size, 20 * MiB);
  EXPECT_EQ(snap[0].allocated_size, 0u);
  EXPECT_EQ(snap[0].active_size, 4 * MiB);
  EXPECT_EQ(snap[0].requested_size, 4 * MiB - 100);  // pending blocks count as active
  EXPECT_EQ(snap[0].segment_type, "large");
  EXPECT_EQ(Stat("requested_bytes.all.current"), static_cast<std::int64_t>(34 * MiB - 100));
  EXPECT_EQ(Stat("active.all.current"), 2);
  EXPECT_EQ(Stat("allocation.all.current"), 1);
  EXPECT_EQ(Stat("inactive_split.all.current"), 1);
  ASSERT_TRUE(sim_->CheckInvariants().ok());
}

TEST_F(CachingAllocatorSimTest, Spec11_5_ResetPeakAndAccumulatedStats) {
  Make();
  const std::uint64_t a = Alloc(1000);
  const std::uint64_t b = Alloc(5 * MiB);
  Free(a);
  Empty();
  Free(b);
  sim_->ResetPeakStats();
  for (const auto& [key, value] : sim_->stats().Flatten()) {
    if (key.size() > 5 && key.compare(key.size() - 5, 5, ".peak") == 0) {
      const std::string cur = key.substr(0, key.size() - 5) + ".current";
      EXPECT_EQ(value, sim_->stats().Flatten().at(cur)) << key;
    }
  }
  EXPECT_EQ(Stat("reserved_bytes.all.peak"), static_cast<std::int64_t>(20 * MiB));
  sim_->ResetAccumulatedStats();
  const auto flat = sim_->stats().Flatten();
  for (const auto& [key, value] : flat) {
    const bool accumulated =
        key.find(".allocated") != std::string::npos || key.find(".freed") != std::string::npos;
    if (accumulated) {
      EXPECT_EQ(value, 0) << key;
    }
  }
  for (const char* counter : {"num_alloc_retries", "num_ooms", "num_sync_all_streams",
                              "num_device_alloc", "num_device_free"}) {
    EXPECT_EQ(flat.at(counter), 0) << counter;
  }
  EXPECT_EQ(flat.at("reserved_bytes.all.current"), static_cast<std::int64_t>(20 * MiB));
  EXPECT_EQ(flat.at("segment.all.current"), 1);  // current values are never reset
  EXPECT_EQ(flat.at("max_split_size"), -1);
  Verify();
}

// ---------------------------------------------------------------------------------------------
// §12 The OOM error

// The scene of the §12 tests: a 1 GiB device; 600 MiB live in its own segment, 4 MiB live in a
// 20 MiB segment (16 MiB cached but pinned). A 410 MiB request needs a 410 MiB segment; the
// driver has 1024 - 620 = 404 MiB; nothing is releasable: OOM.
TEST_F(CachingAllocatorSimTest, Spec12_1_OomMessageText) {
  Make("", kNewest, 1 * GiB, 0, /*device=*/3);
  Alloc(600 * MiB);
  Alloc(4 * MiB);
  const Status st = TryAlloc(410 * MiB);
  ASSERT_EQ(st.code(), StatusCode::kOutOfMemory);
  // §12.1 piece by piece: A = 410 MiB (the segment size), d = 3, T = 1 GiB (<= 1 GiB prints
  // in MiB), F = 404 MiB, P = "" (no NVML), L = "" (no limit), X = 604 MiB, Q = "",
  // U = 620 - 604 = 16 MiB. Note the two double spaces.
  const std::string expected =
      "CUDA out of memory. Tried to allocate 410.00 MiB. GPU 3 has a total capacity of "
      "1024.00 MiB of which 404.00 MiB is free. Of the allocated memory 604.00 MiB is allocated "
      "by PyTorch, and 16.00 MiB is reserved by PyTorch but unallocated. If reserved but "
      "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
      "to avoid fragmentation.  See documentation for Memory Management  "
      "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)";
  ASSERT_EQ(st.message().size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    ASSERT_EQ(st.message()[i], expected[i]) << "at character " << i << ": " << st.message();
  }
  EXPECT_NE(st.message().find("fragmentation.  See"), std::string::npos);
  EXPECT_NE(st.message().find("Management  (https"), std::string::npos);
  ASSERT_TRUE(sim_->last_oom().has_value());
  const OomDetails& d = *sim_->last_oom();
  EXPECT_EQ(d.requested, 410 * MiB);
  EXPECT_EQ(d.rounded, 410 * MiB);
  EXPECT_EQ(d.reported, 410 * MiB);
  EXPECT_EQ(d.device_total, 1 * GiB);
  EXPECT_EQ(d.device_free, 404 * MiB);
  EXPECT_EQ(d.allocated, 604 * MiB);
  EXPECT_EQ(d.reserved, 620 * MiB);
  EXPECT_FALSE(d.limit.has_value());
  EXPECT_EQ(d.message, st.message());
}

TEST_F(CachingAllocatorSimTest, Spec12_1_OomMessageWithTheFractionLimit) {
  Make("", kNewest, 1 * GiB, 0, 3);
  Fraction(0.75);  // 768 MiB allowed
  Alloc(600 * MiB);
  Alloc(4 * MiB);
  const Status st = TryAlloc(410 * MiB);  // 620 + 410 > 768: refused by the limit
  EXPECT_NE(st.message().find("GPU 3 has a total capacity of 1024.00 MiB of which 404.00 MiB is "
                              "free. 768.00 MiB allowed; Of the allocated memory 604.00 MiB"),
            std::string::npos)
      << st.message();
}

TEST_F(CachingAllocatorSimTest, Spec12_1_TriedToAllocateIsTheSegmentSize) {
  Make("", kNewest, /*capacity=*/1 * MiB);  // no segment fits
  Status st = TryAlloc(4 * MiB);            // 4 MiB tensor -> 20 MiB segment
  EXPECT_NE(st.message().find("Tried to allocate 20.00 MiB. GPU 0 has a total capacity of "
                              "1024.00 KiB of which 1024.00 KiB is free."),
            std::string::npos)
      << st.message();
  st = TryAlloc(1024);  // 1 KiB tensor -> 2 MiB segment
  EXPECT_NE(st.message().find("Tried to allocate 2.00 MiB."), std::string::npos) << st.message();
  st = TryAlloc(1000 * MiB);  // <= 1 GiB prints in MiB
  EXPECT_NE(st.message().find("Tried to allocate 1000.00 MiB."), std::string::npos);
  st = TryAlloc(3 * GiB / 2);  // 1.5 GiB
  EXPECT_NE(st.message().find("Tried to allocate 1.50 GiB."), std::string::npos);
  EXPECT_NE(st.message().find("allocated by PyTorch, and 0 bytes is reserved"), std::string::npos);
}

TEST_F(CachingAllocatorSimTest, Spec12_2_OomMessageTextV1_13) {
  Make("", kV1_13, 1 * GiB, 0, 3);
  Alloc(600 * MiB);
  Alloc(4 * MiB);
  Status st = TryAlloc(410 * MiB);
  ASSERT_EQ(st.code(), StatusCode::kOutOfMemory);
  // §12.2 (1.10-2.1): A, d, T, allocated (604), F, L, reserved (620).
  EXPECT_EQ(st.message(),
            "CUDA out of memory. Tried to allocate 410.00 MiB (GPU 3; 1024.00 MiB total capacity; "
            "604.00 MiB already allocated; 404.00 MiB free; 620.00 MiB reserved in total by "
            "PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to "
            "avoid fragmentation.  See documentation for Memory Management and "
            "PYTORCH_CUDA_ALLOC_CONF");
  // With a fraction (any call turns the limit on in 1.13): "{limit} allowed; " before reserved.
  Fraction(1.0);
  st = TryAlloc(410 * MiB);
  EXPECT_NE(st.message().find("404.00 MiB free; 1024.00 MiB allowed; 620.00 MiB reserved in "
                              "total by PyTorch)"),
            std::string::npos)
      << st.message();
}

TEST_F(CachingAllocatorSimTest, Spec12_3_OomSideEffectsAndRetryAfterFreeing) {
  Make("", kNewest, 100 * MiB, 0, /*device=*/2);
  const std::uint64_t a = Alloc(60 * MiB);
  Take();
  const Status st = TryAlloc(50 * MiB + 1);
  ASSERT_EQ(st.code(), StatusCode::kOutOfMemory);
  const std::vector<Event> ev = Take();
  ASSERT_EQ(Actions(ev), (std::vector<Action>{A::kOom}));
  // PyTorch's trace entry for an OOM carries the rounded size and the driver's free bytes.
  EXPECT_EQ(ev[0].size, 50 * MiB + 512);
  EXPECT_EQ(ev[0].device_free, 40 * MiB);
  EXPECT_EQ(ev[0].device, 2);
  EXPECT_EQ(Stat("num_ooms"), 1);
  EXPECT_EQ(memory_->num_ooms(), 1u);
  // The caller frees and retries (test_out_of_memory_retry): success.
  Free(a);
  Alloc(50 * MiB + 1);
  EXPECT_EQ(Stat("num_ooms"), 1);
}

// ---------------------------------------------------------------------------------------------
// §13 Version switches

TEST_F(CachingAllocatorSimTest, Spec13_OldVersionsLeaveRequestsUnroundedWithOneDivision) {
  // 1.13-2.5 tested divisions with "> 0" and returned the size itself for one division.
  Make("roundup_power2_divisions:1", kV2);
  Alloc(1000);
  EXPECT_EQ(LastAlloc().block_size, 1000u);
  Alloc(600);
  EXPECT_EQ(LastAlloc().block_size, 600u);
  EXPECT_EQ(LastAlloc().addr, kBase + 1000);
  Alloc(300);  // < 512: 512
  EXPECT_EQ(LastAlloc().block_size, 512u);
  Make("roundup_power2_divisions:1", kV1_13);
  Alloc(1000);
  EXPECT_EQ(LastAlloc().block_size, 1000u);
  // The newest code treats one division as none: plain 512-byte rounding (issue #161139).
  Make("roundup_power2_divisions:1", kNewest);
  Alloc(1000);
  EXPECT_EQ(LastAlloc().block_size, 1024u);
}

TEST_F(CachingAllocatorSimTest, Spec13_V1_13RoundupBypassThreshold) {
  Make("roundup_power2_divisions:4,roundup_bypass_threshold_mb:8", kV1_13, 4 * GiB);
  Alloc(3000);  // below the threshold: 4 divisions, 3072
  EXPECT_EQ(LastAlloc().block_size, 3072u);
  Alloc(84 * MiB);  // above 8 MiB: plain rounding, 84 MiB (not 96 MiB)
  EXPECT_EQ(LastAlloc().block_size, 84 * MiB);
  Alloc(5 * MiB + 1);  // below: [4 MiB, 8 MiB) in 4 steps of 1 MiB -> 6 MiB
  EXPECT_EQ(LastAlloc().block_size, 6 * MiB);
}

TEST_F(CachingAllocatorSimTest, Spec13_GcGatingFollowsTheVersion) {
  // PyTorch <= 2.8: set_per_process_memory_fraction(1.0) turns GC on (limit = 1 GiB, gc_limit
  // = 0.5 GiB). Newest: 1.0 keeps it off.
  for (const ConfigVersion v : {kV2, kNewest}) {
    SCOPED_TRACE(ConfigVersionName(v));
    Make("garbage_collection_threshold:0.5", v, 1 * GiB);
    Fraction(1.0);
    const std::uint64_t a = Alloc(300 * MiB);
    Alloc(300 * MiB);
    Free(a);
    Take();
    // 100 MiB on stream 1: no fit on its stream; reserved 600 MiB > 512 MiB: GC (when on) frees
    // the cached 300 MiB block (the only candidate, age >= average).
    Alloc(100 * MiB, 1);
    const bool gc = v == kV2;
    EXPECT_EQ(Actions(Take()),
              gc ? (std::vector<Action>{A::kSegmentFree, A::kSegmentAlloc, A::kAlloc})
                 : (std::vector<Action>{A::kSegmentAlloc, A::kAlloc}));
  }
}

// ---------------------------------------------------------------------------------------------
// §15 Driver model and events

TEST_F(CachingAllocatorSimTest, Spec15_AddressesAreLowestFirstIn2MiBGranules) {
  Make();
  const std::uint64_t a = Alloc(4 * MiB);  // 20 MiB at kBase
  EXPECT_EQ(a, kBase);
  const std::uint64_t b = Alloc(20 * MiB);  // 20 MiB at kBase + 20 MiB
  EXPECT_EQ(b, kBase + 20 * MiB);
  Free(a);
  Empty();                        // [kBase, kBase + 20 MiB) is free again
  EXPECT_EQ(Alloc(1000), kBase);  // a 2 MiB small segment at the lowest address
  // A 20 MiB segment does not fit the 18 MiB hole [kBase + 2, kBase + 20): it goes above b.
  EXPECT_EQ(Alloc(4 * MiB), kBase + 40 * MiB);
  // Stream 1 (so that no cached block of stream 0 serves): another 20 MiB segment, above.
  EXPECT_EQ(Alloc(6 * MiB + 1, 1), kBase + 60 * MiB);
  // 17 MiB needs an 18 MiB segment: it fits the hole exactly.
  EXPECT_EQ(Alloc(17 * MiB, 1), kBase + 2 * MiB);
}

TEST_F(CachingAllocatorSimTest, Spec15_RecordedAddressesAreTakenWhenFree) {
  // A replay at the real driver's addresses: the driver model asks segment_address before each
  // cudaMalloc. Taken addresses must end at or below address_base, where the simulator's own
  // placement starts (2 MiB granules upwards, lowest free first), and must not overlap.
  constexpr std::uint64_t kReal = 0x737a00000000ull;  // below kBase, as on newer drivers
  constexpr std::uint64_t kOwn = kReal + GiB;
  std::vector<std::uint64_t> answers = {
      kReal + 100 * MiB,  // 20 MiB segment: taken
      kReal + 110 * MiB,  // overlaps the first: refused, placed at kOwn
      kOwn - 10 * MiB,    // would reach past the base: refused
      0,                  // no answer: the simulator's own placement
      kReal + 120 * MiB,  // 30 MiB segment right after the first: taken
      kOwn + 200 * MiB,   // above the base, among the simulator's own: refused
  };
  std::vector<std::uint64_t> asked;
  std::size_t next = 0;
  driver_.address_base = kOwn;
  driver_.segment_address = [&](std::uint64_t bytes) {
    asked.push_back(bytes);
    return next < answers.size() ? answers[next++] : 0;
  };
  Make();
  EXPECT_EQ(Alloc(4 * MiB), kReal + 100 * MiB);
  EXPECT_EQ(Alloc(4 * MiB, 1), kOwn);
  EXPECT_EQ(Alloc(4 * MiB, 2), kOwn + 20 * MiB);
  EXPECT_EQ(Alloc(4 * MiB, 3), kOwn + 40 * MiB);
  EXPECT_EQ(Alloc(30 * MiB, 4), kReal + 120 * MiB);
  EXPECT_EQ(Alloc(4 * MiB, 5), kOwn + 60 * MiB);
  EXPECT_EQ(asked, (std::vector<std::uint64_t>{20 * MiB, 20 * MiB, 20 * MiB, 20 * MiB, 30 * MiB,
                                               20 * MiB}));
  EXPECT_EQ(sim_->pinned_segments(), 2u);
  EXPECT_EQ(sim_->unpinned_segments(), 3u);
  // Released, a recorded address can be taken again: here by a 2 MiB small segment.
  Free(kReal + 100 * MiB);
  Empty();
  EXPECT_EQ(sim_->MemorySnapshot().size(), 5u);
  answers.push_back(kReal + 100 * MiB);
  EXPECT_EQ(Alloc(1000, 6), kReal + 100 * MiB);
  EXPECT_EQ(asked.back(), 2 * MiB);
  EXPECT_EQ(sim_->pinned_segments(), 3u);
}

TEST_F(CachingAllocatorSimTest, Spec15_AnUnusableAddressBaseKeepsTheDefault) {
  driver_.address_base = kBase + 1;  // not a multiple of 2 MiB
  Make();
  EXPECT_EQ(Alloc(4 * MiB), kBase);
  driver_.address_base = std::uint64_t{1} << 47;  // at or above 2^47
  Make();
  EXPECT_EQ(Alloc(4 * MiB), kBase);
  // With the default base, recorded addresses below it are taken and those above refused,
  // wherever they lie (a hostile file's): nothing is sized by them.
  driver_.address_base = 0;
  driver_.segment_address = [](std::uint64_t) { return kBase + (std::uint64_t{32} << 40); };
  Make();
  EXPECT_EQ(Alloc(4 * MiB), kBase);
  EXPECT_EQ(sim_->unpinned_segments(), 1u);
  driver_.segment_address = [](std::uint64_t) { return std::uint64_t{2} << 20; };
  Make();
  EXPECT_EQ(Alloc(4 * MiB), std::uint64_t{2} << 20);
  EXPECT_EQ(sim_->pinned_segments(), 1u);
  driver_.segment_address = [](std::uint64_t) { return UINT64_MAX - MiB; };  // would wrap
  Make();
  EXPECT_EQ(Alloc(4 * MiB), kBase);
}

TEST_F(CachingAllocatorSimTest, Spec15_EventsCarryDeviceStreamPoolAndBlockSize) {
  Make("", kNewest, 16 * GiB, 0, /*device=*/5);
  const std::uint64_t a = Alloc(3000, /*stream=*/7);
  Free(a);
  Empty();
  const std::vector<Event> ev = Take();
  ASSERT_EQ(Actions(ev), (std::vector<Action>{A::kSegmentAlloc, A::kAlloc, A::kFreeRequested,
                                              A::kFreeCompleted, A::kSegmentFree}));
  for (const Event& e : ev) {
    EXPECT_EQ(e.device, 5);
    EXPECT_EQ(e.stream, 7u);
    EXPECT_EQ(e.time_us, -1);
  }
  EXPECT_EQ(ev[0].pool, Pool::kSmall);
  EXPECT_EQ(ev[0].size, 2 * MiB);
  EXPECT_EQ(ev[1].size, 3000u);        // requested
  EXPECT_EQ(ev[1].block_size, 3072u);  // rounded, split off
  EXPECT_EQ(ev[2].size, 3000u);
  EXPECT_EQ(ev[3].size, 3000u);
  EXPECT_EQ(ev[4].size, 2 * MiB);
}

// ---------------------------------------------------------------------------------------------
// Differential: the deliberately naive ReferenceAllocator (tests/testing) on random traces with
// default settings, one stream and no driver limit. Without empty_cache both place new segments
// at increasing addresses, so the i-th segment of one is the i-th of the other and the layouts
// must agree block by block (offsets, sizes, states, requested sizes).

TEST_F(CachingAllocatorSimTest, MatchesTheReferenceAllocatorOnRandomTraces) {
  Make("", kNewest, std::uint64_t{1} << 40);
  fragscope::testing::ReferenceAllocator ref;
  std::vector<Event> ref_events;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> live;  // (sim address, ref address)
  std::mt19937_64 rng(99);
  for (int step = 0; step < 4000 && !HasFatalFailure(); ++step) {
    if (live.empty() || rng() % 100 < 55) {
      const std::uint64_t size = rng() % 4 == 0 ? 1 + rng() % (48 * MiB) : 1 + rng() % (2 * MiB);
      const std::uint64_t a = Alloc(size);
      live.emplace_back(a, ref.Malloc(size, &ref_events));
    } else {
      const std::size_t i = rng() % live.size();
      Free(live[i].first);
      ref.Free(live[i].second, &ref_events);
      live[i] = live.back();
      live.pop_back();
    }
    const std::vector<SnapshotSegment> snap = sim_->MemorySnapshot();
    const auto& segs = ref.segments();
    ASSERT_EQ(snap.size(), segs.size()) << "step " << step;
    for (std::size_t k = 0; k < segs.size(); ++k) {
      ASSERT_EQ(snap[k].segment_type == "small", segs[k].small) << "step " << step;
      ASSERT_EQ(snap[k].blocks.size(), segs[k].blocks.size()) << "step " << step << " seg " << k;
      for (std::size_t j = 0; j < segs[k].blocks.size(); ++j) {
        const SnapshotBlock& sb = snap[k].blocks[j];
        const fragscope::testing::RefBlock& rb = segs[k].blocks[j];
        ASSERT_EQ(sb.address - snap[k].address, rb.addr - segs[k].addr) << "step " << step;
        ASSERT_EQ(sb.size, rb.size) << "step " << step;
        ASSERT_EQ(sb.state == "active_allocated", rb.allocated) << "step " << step;
        if (rb.allocated) {
          ASSERT_EQ(sb.requested_size, rb.requested) << "step " << step;
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The handle API makes the same decisions as the address API.

// Two simulators, one driven by addresses and one by handles (switching to addresses halfway,
// which builds the address index late), must emit the same events and end in the same state.
TEST(CachingAllocatorSimHandleTest, HandlesAndAddressesDecideAlike) {
  for (const char* conf : {"", "expandable_segments:True", "max_split_size_mb:40"}) {
    SCOPED_TRACE(conf);
    SimOptions options;
    options.config = *ParseAllocatorConfig(conf, kNewest);
    options.driver.capacity_bytes = 512 * MiB;
    CachingAllocatorSim by_addr(options);
    CachingAllocatorSim by_handle(options);
    std::vector<std::string> a_events, h_events;
    auto describe = [](const Event& e) {
      return std::string(ActionName(e.action)) + " " + std::to_string(e.addr) + " " +
             std::to_string(e.size) + " " + std::to_string(e.block_size) + " " +
             std::to_string(e.stream);
    };
    by_addr.SetEventSink([&](const Event& e) { a_events.push_back(describe(e)); });
    by_handle.SetEventSink([&](const Event& e) { h_events.push_back(describe(e)); });
    std::mt19937_64 rng(99);
    struct Live {
      std::uint64_t addr;
      CachingAllocatorSim::BlockHandle handle;
    };
    std::vector<Live> live;
    for (int step = 0; step < 4000; ++step) {
      const bool handles = step < 2000;
      const int op = static_cast<int>(rng() % 100);
      const std::uint64_t stream = rng() % 2;
      if (op < 55 || live.empty()) {
        const std::uint64_t size = rng() % 3 == 0 ? 1 + rng() % (30 * MiB) : 1 + rng() % MiB;
        Result<std::uint64_t> a = by_addr.Malloc(size, stream);
        Result<CachingAllocatorSim::Allocation> h = by_handle.MallocBlock(size, stream);
        ASSERT_EQ(a.ok(), h.ok());
        if (a.ok()) {
          ASSERT_EQ(*a, h->addr);
          live.push_back(Live{*a, h->handle});
        }
      } else if (op < 92) {
        const std::size_t i = rng() % live.size();
        ASSERT_TRUE(by_addr.Free(live[i].addr).ok());
        if (handles) {
          by_handle.FreeBlock(live[i].handle);
        } else {
          ASSERT_TRUE(by_handle.Free(live[i].addr).ok());
        }
        live[i] = live.back();
        live.pop_back();
      } else if (op < 96) {
        const Live& l = live[rng() % live.size()];
        ASSERT_TRUE(by_addr.RecordStream(l.addr, 2).ok());
        if (handles) {
          by_handle.RecordStreamOnBlock(l.handle, 2);
        } else {
          ASSERT_TRUE(by_handle.RecordStream(l.addr, 2).ok());
        }
      } else {
        by_addr.StreamSync(std::nullopt);
        by_handle.StreamSync(std::nullopt);
      }
      ASSERT_TRUE(by_handle.CheckInvariants().ok()) << by_handle.CheckInvariants().ToString();
    }
    EXPECT_EQ(a_events, h_events);
    EXPECT_EQ(by_addr.stats().Flatten(), by_handle.stats().Flatten());
    EXPECT_FALSE(by_handle.Free(0x1234).ok());  // the late-built index knows every block
  }
}

// WouldMatch is a promise: whenever it holds, a simulator with the other settings makes the
// same decisions. Random traces on tight and roomy devices, every pair of a small family.
TEST(CachingAllocatorSimMatchTest, WouldMatchOnlyPromisesWhatHolds) {
  const char* family[] = {"",
                          "max_split_size_mb:40",
                          "max_split_size_mb:200",
                          "garbage_collection_threshold:0.8,per_process_memory_fraction:0.95",
                          "garbage_collection_threshold:0.5,per_process_memory_fraction:0.6",
                          "per_process_memory_fraction:0.7,max_split_size_mb:100"};
  int promised = 0, refused = 0;
  for (std::uint64_t seed = 1; seed <= 24; ++seed) {
    std::mt19937_64 rng(seed);
    const std::uint64_t capacity = (seed % 3 == 0 ? 600 : 4096) * MiB;
    const bool expandable = seed % 2 == 0;
    const std::uint64_t max_request = (seed % 4 < 2 ? 30 : 150) * MiB;
    std::vector<std::string> configs;
    for (const char* f : family) {
      std::string c = f;
      if (expandable) c += c.empty() ? "expandable_segments:True" : ",expandable_segments:True";
      configs.push_back(c);
    }
    std::vector<std::unique_ptr<CachingAllocatorSim>> sims;
    std::vector<std::vector<std::string>> events(configs.size());
    for (std::size_t i = 0; i < configs.size(); ++i) {
      SimOptions options;
      options.config = *ParseAllocatorConfig(configs[i], kNewest);
      options.driver.capacity_bytes = capacity;
      sims.push_back(std::make_unique<CachingAllocatorSim>(options));
      sims[i]->SetEventSink([&events, i](const Event& e) {
        events[i].push_back(std::string(ActionName(e.action)) + " " + std::to_string(e.addr) + " " +
                            std::to_string(e.size));
      });
    }
    // The same request sequence for every simulator; frees pick by position, so they stay
    // meaningful when the simulators diverge.
    std::vector<std::vector<std::uint64_t>> live(configs.size());
    for (int step = 0; step < 600; ++step) {
      const bool alloc = rng() % 100 < 55;
      const std::uint64_t size = 1 + rng() % (rng() % 2 ? MiB : max_request);
      const std::uint64_t pick = rng();
      const bool empty_cache = rng() % 200 == 0;
      for (std::size_t i = 0; i < configs.size(); ++i) {
        if (empty_cache) sims[i]->EmptyCache();
        if (alloc || live[i].empty()) {
          Result<std::uint64_t> a = sims[i]->Malloc(size, 0);
          if (a.ok()) live[i].push_back(*a);
        } else {
          const std::size_t k = pick % live[i].size();
          ASSERT_TRUE(sims[i]->Free(live[i][k]).ok());
          live[i][k] = live[i].back();
          live[i].pop_back();
        }
      }
    }
    for (std::size_t i = 0; i < configs.size(); ++i) {
      for (std::size_t j = 0; j < configs.size(); ++j) {
        if (i == j) continue;
        if (!sims[i]->WouldMatch(sims[j]->config())) {
          ++refused;
          continue;
        }
        ++promised;
        EXPECT_EQ(events[i], events[j]) << configs[i] << " vs " << configs[j] << ", seed " << seed;
        auto a = sims[i]->stats().Flatten();
        auto b = sims[j]->stats().Flatten();
        a.erase("max_split_size");
        b.erase("max_split_size");
        EXPECT_EQ(a, b) << configs[i] << " vs " << configs[j] << ", seed " << seed;
      }
    }
  }
  EXPECT_GT(promised, 50);
  EXPECT_GT(refused, 50);
}

// ---------------------------------------------------------------------------------------------
// Randomised: every invariant after every operation, across settings.

TEST_F(CachingAllocatorSimTest, RandomOperationsKeepEveryInvariant) {
  struct Setting {
    const char* conf;
    ConfigVersion version;
    std::uint64_t capacity;
    double fraction;  // < 0: none
  };
  const Setting settings[] = {
      {"", kNewest, 512 * MiB, -1},
      {"max_split_size_mb:40", kNewest, 512 * MiB, -1},
      {"expandable_segments:True", kNewest, 512 * MiB, -1},
      {"expandable_segments:True,max_split_size_mb:20", kNewest, 400 * MiB, -1},
      {"garbage_collection_threshold:0.6,max_split_size_mb:30", kNewest, 1 * GiB, 0.5},
      {"roundup_power2_divisions:4", kV2, 512 * MiB, 1.0},
      {"roundup_power2_divisions:1", kV1_13, 300 * MiB, -1},
  };
  std::mt19937_64 rng(20240611);
  std::set<Action> seen;  // every allocator action must have been exercised
  for (const Setting& s : settings) {
    SCOPED_TRACE(s.conf);
    Make(s.conf, s.version, s.capacity);
    if (s.fraction >= 0) Fraction(s.fraction);
    std::vector<std::uint64_t> live;
    for (int step = 0; step < 1500 && !HasFatalFailure(); ++step) {
      const int op = static_cast<int>(rng() % 100);
      const std::uint64_t stream = rng() % 3;
      if (op < 50 || live.empty()) {
        std::uint64_t size;
        switch (rng() % 4) {
          case 0:
            size = 1 + rng() % (1 * MiB);
            break;
          case 1:
            size = 1 * MiB + rng() % (9 * MiB);
            break;
          case 2:
            size = 10 * MiB + rng() % (40 * MiB);
            break;
          default:
            size = 512 * (1 + rng() % 64);
            break;
        }
        Result<std::uint64_t> r = sim_->Malloc(size, stream);
        if (r.ok()) {
          live.push_back(*r);
        } else {
          ASSERT_EQ(r.status().code(), StatusCode::kOutOfMemory) << r.status().ToString();
        }
        Verify();
      } else if (op < 85) {
        const std::size_t i = rng() % live.size();
        Free(live[i]);
        live[i] = live.back();
        live.pop_back();
      } else if (op < 91) {
        Record(live[rng() % live.size()], rng() % 4);
      } else if (op < 96) {
        if (rng() % 2)
          Sync(stream);
        else
          Sync(std::nullopt);
      } else if (op < 98) {
        Empty();
      } else if (s.version != kV1_13) {
        Settings(rng() % 2 ? "expandable_segments:True" : "expandable_segments:False");
      }
    }
    for (const std::uint64_t a : live) Free(a);
    Sync(std::nullopt);
    Empty();
    EXPECT_EQ(Stat("allocated_bytes.all.current"), 0);
    EXPECT_EQ(Stat("active_bytes.all.current"), 0);
    for (const Event& e : events_) seen.insert(e.action);
  }
  for (const Action a : {A::kSegmentAlloc, A::kSegmentFree, A::kSegmentMap, A::kSegmentUnmap,
                         A::kAlloc, A::kFreeRequested, A::kFreeCompleted, A::kOom}) {
    EXPECT_EQ(seen.count(a), 1u) << ActionName(a);
  }
}

}  // namespace
}  // namespace fragscope::model
