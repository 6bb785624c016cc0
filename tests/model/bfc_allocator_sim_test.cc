// Unit tests of model::BfcAllocatorSim: one test per documented rule (docs/simulator.md, "The
// BFC allocator model"), with figures worked out by hand from the rule.
#include "model/bfc_allocator_sim.h"

#include <gtest/gtest.h>

#include "common/units.h"
#include "model/device_memory.h"

namespace fragscope::model {
namespace {

BfcSettings Limit(std::uint64_t bytes) {
  BfcSettings s;
  s.memory_limit = bytes;
  return s;
}

TEST(BfcAllocatorSimTest, BinsDoubleFrom256AndStopAtTwenty) {
  EXPECT_EQ(BfcBinForSize(256), 0);
  EXPECT_EQ(BfcBinForSize(511), 0);
  EXPECT_EQ(BfcBinForSize(512), 1);
  EXPECT_EQ(BfcBinForSize(256ull << 19), 19);
  EXPECT_EQ(BfcBinForSize(256ull << 20), 20);
  EXPECT_EQ(BfcBinForSize(256ull << 30), 20);
}

TEST(BfcAllocatorSimTest, HumanBytesAsTensorFlowLogsThem) {
  EXPECT_EQ(TfHumanBytes(256), "256B");
  EXPECT_EQ(TfHumanBytes(1024), "1.0KiB");
  EXPECT_EQ(TfHumanBytes(13517), "13.2KiB");
  EXPECT_EQ(TfHumanBytes(80 * kMiB), "80.00MiB");
  EXPECT_EQ(TfHumanBytes(3 * kGiB / 2), "1.50GiB");
}

TEST(BfcAllocatorSimTest, RoundsTo256AndGrowsFromTwoMiB) {
  BfcAllocatorSim sim(Limit(64 * kMiB), {}, 0);
  Result<std::uint64_t> a = sim.Malloc(4);
  ASSERT_TRUE(a.ok());
  const auto regions = sim.Regions();
  ASSERT_EQ(regions.size(), 1u);
  EXPECT_EQ(regions[0].size, 2 * kMiB);
  ASSERT_EQ(regions[0].chunks.size(), 2u);
  EXPECT_EQ(regions[0].chunks[0].size, 256u);
  EXPECT_EQ(regions[0].chunks[0].requested_size, 4u);
  EXPECT_EQ(sim.next_region_bytes(), 4 * kMiB);  // doubled after a region that was big enough
  EXPECT_TRUE(sim.CheckInvariants().ok());
}

TEST(BfcAllocatorSimTest, OlderVersionsGrowFromOneMiB) {
  BfcSettings s = Limit(64 * kMiB);
  s.version = BfcVersion::kTf2;
  BfcAllocatorSim sim(s, {}, 0);
  ASSERT_TRUE(sim.Malloc(1).ok());
  EXPECT_EQ(sim.Regions()[0].size, kMiB);
}

TEST(BfcAllocatorSimTest, ARequestAboveTheNextRegionDoublesItWithoutAnExtraDoubling) {
  BfcAllocatorSim sim(Limit(64 * kMiB), {}, 0);
  ASSERT_TRUE(sim.Malloc(5 * kMiB).ok());  // 2 -> 4 -> 8 MiB: grown to fit, not doubled again
  EXPECT_EQ(sim.Regions()[0].size, 8 * kMiB);
  EXPECT_EQ(sim.next_region_bytes(), 8 * kMiB);
  ASSERT_TRUE(sim.Malloc(6 * kMiB).ok());  // 3 MiB free in the first: a second region
  EXPECT_EQ(sim.Regions().size(), 2u);
  EXPECT_EQ(sim.Regions()[1].size, 8 * kMiB);
  EXPECT_EQ(sim.next_region_bytes(), 16 * kMiB);
}

TEST(BfcAllocatorSimTest, SplitsOnlyAtTwiceTheRequest) {
  BfcAllocatorSim sim(Limit(64 * kMiB), {}, 0);
  const std::uint64_t a = *sim.Malloc(1024);
  ASSERT_TRUE(sim.Malloc(256).ok());  // keeps `a` from merging with the rest when freed
  ASSERT_TRUE(sim.Free(a).ok());
  // 1024 >= 2 x 512: split; the 512-byte remainder stays free.
  EXPECT_EQ(*sim.Malloc(512), a);
  EXPECT_EQ(sim.Regions()[0].chunks[0].size, 512u);
  EXPECT_FALSE(sim.Regions()[0].chunks[1].in_use);
  // The free 512 serves 300 (rounded 512): 512 < 2 x 512, not split.
  const std::uint64_t b = *sim.Malloc(300);
  EXPECT_EQ(b, a + 512);
  EXPECT_EQ(sim.Regions()[0].chunks[1].size, 512u);
  // A 768-byte chunk for 512 is 1.5x and not split: 256 bytes of internal waste.
  ASSERT_TRUE(sim.Free(b).ok());
  ASSERT_TRUE(sim.Free(a).ok());  // a and b coalesce: 1024 free
  EXPECT_EQ(sim.Regions()[0].chunks[0].size, 1024u);
  EXPECT_TRUE(sim.CheckInvariants().ok());
}

TEST(BfcAllocatorSimTest, SplitsWhenTheRemainderIsAtLeast128MiBFromVersion2) {
  for (BfcVersion v : {BfcVersion::kTf0, BfcVersion::kTf2, BfcVersion::kNewest}) {
    BfcSettings s = Limit(1 * kGiB);
    s.allow_growth = false;
    s.version = v;
    BfcAllocatorSim sim(s, {}, 0);
    const std::uint64_t a = *sim.Malloc(300 * kMiB);  // 1024 >= 2 x 300: split in every version
    const std::uint64_t b = *sim.Malloc(300 * kMiB);  // 724 >= 2 x 300
    ASSERT_TRUE(sim.Malloc(424 * kMiB - 256).ok());   // the whole 424 MiB tail: not split
    ASSERT_TRUE(sim.Free(a).ok());
    ASSERT_TRUE(sim.Free(b).ok());
    // 600 MiB free for 400 MiB: < 2x, remainder 200 MiB >= 128 MiB.
    ASSERT_TRUE(sim.Malloc(400 * kMiB).ok());
    EXPECT_EQ(sim.Regions()[0].chunks[0].size, v == BfcVersion::kTf0 ? 600 * kMiB : 400 * kMiB)
        << BfcVersionName(v);
  }
}

TEST(BfcAllocatorSimTest, FragmentationFractionSetsTheRemainderThreshold) {
  BfcSettings s = Limit(1 * kGiB);
  s.allow_growth = false;
  s.fragmentation_fraction = 0.05;  // 51.2 MiB
  BfcAllocatorSim sim(s, {}, 0);
  const std::uint64_t a = *sim.Malloc(100 * kMiB);
  ASSERT_TRUE(sim.Malloc(256).ok());
  ASSERT_TRUE(sim.Free(a).ok());
  ASSERT_TRUE(sim.Malloc(40 * kMiB).ok());  // remainder 60 MiB < 2x but >= 51.2 MiB: split
  EXPECT_EQ(sim.Regions()[0].chunks[0].size, 40 * kMiB);
  ASSERT_TRUE(sim.Malloc(30 * kMiB).ok());  // 60 MiB free for 30: exactly 2x: split
  const std::uint64_t left = sim.largest_free_chunk();
  EXPECT_GT(left, 800 * kMiB);  // the rest of the region
}

TEST(BfcAllocatorSimTest, BestFitBySizeThenAddress) {
  BfcAllocatorSim sim(Limit(64 * kMiB), {}, 0);
  std::vector<std::uint64_t> p;
  for (std::uint64_t size : {4096, 256, 2048, 256, 2048, 256}) p.push_back(*sim.Malloc(size));
  ASSERT_TRUE(sim.Free(p[0]).ok());    // 4096 free
  ASSERT_TRUE(sim.Free(p[4]).ok());    // 2048 free (higher address)
  ASSERT_TRUE(sim.Free(p[2]).ok());    // 2048 free (lower address)
  EXPECT_EQ(*sim.Malloc(1500), p[2]);  // smallest fit, lowest address among equals
  EXPECT_EQ(*sim.Malloc(1500), p[4]);
  EXPECT_EQ(*sim.Malloc(1500), p[0]);  // 4096 >= 2 x 1536: split
}

TEST(BfcAllocatorSimTest, WithoutGrowthOneRegionOfTheLimit) {
  BfcSettings s = Limit(64 * kMiB);
  s.allow_growth = false;
  BfcAllocatorSim sim(s, {}, 0);
  ASSERT_TRUE(sim.Malloc(1).ok());
  ASSERT_EQ(sim.Regions().size(), 1u);
  EXPECT_EQ(sim.Regions()[0].size, 64 * kMiB);
  Result<std::uint64_t> over = sim.Malloc(64 * kMiB);
  EXPECT_EQ(over.status().code(), StatusCode::kOutOfMemory);
  ASSERT_TRUE(sim.last_oom().has_value());
  EXPECT_EQ(sim.last_oom()->rounded, 64 * kMiB);
  EXPECT_EQ(over.status().message(),
            "Allocator (bfc) ran out of memory trying to allocate 64.00MiB (rounded to 67108864)");
}

TEST(BfcAllocatorSimTest, TheLastRegionIsWhatIsLeftUnderTheLimit) {
  BfcAllocatorSim sim(Limit(5 * kMiB), {}, 0);
  ASSERT_TRUE(sim.Malloc(2 * kMiB).ok());  // region of 2 MiB
  ASSERT_TRUE(sim.Malloc(1 * kMiB).ok());  // wants 4 MiB, 3 MiB left: region of 3 MiB
  EXPECT_EQ(sim.Regions()[1].size, 3 * kMiB);
  EXPECT_EQ(sim.Malloc(2 * kMiB + 1).status().code(), StatusCode::kOutOfMemory);
  EXPECT_TRUE(sim.Malloc(2 * kMiB).ok());  // the 2 MiB left in the second region
}

TEST(BfcAllocatorSimTest, BacksOffByNineTenthsOnceWhenTheDeviceIsShort) {
  BfcSettings s = Limit(1 * kGiB);
  s.allow_growth = false;
  BfcDevice d;
  d.capacity_bytes = 800 * kMiB;  // less than the limit: the first region fails
  BfcAllocatorSim sim(s, d, 0);
  ASSERT_TRUE(sim.Malloc(kMiB).ok());
  // 1024 MiB -> 921.6 -> 829.44 -> 746.5 MiB (each rounded up to 256 bytes) fits in 800.
  const std::uint64_t got = sim.Regions()[0].size;
  EXPECT_LE(got, 800 * kMiB);
  EXPECT_GT(got, 740 * kMiB);
  EXPECT_EQ(got % 256, 0u);
}

TEST(BfcAllocatorSimTest, GarbageCollectionReturnsIdleRegionsToFitALargerOne) {
  for (bool gc : {false, true}) {
    BfcSettings s = Limit(8 * kMiB);
    s.garbage_collection = gc;
    BfcAllocatorSim sim(s, {}, 0);
    const std::uint64_t a = *sim.Malloc(2 * kMiB);  // region 2 MiB
    const std::uint64_t b = *sim.Malloc(4 * kMiB);  // region 4 MiB
    ASSERT_TRUE(sim.Free(a).ok());
    ASSERT_TRUE(sim.Free(b).ok());
    // 6 MiB is in two idle regions, 2 MiB left under the limit: only GC can fit 5 MiB.
    Result<std::uint64_t> c = sim.Malloc(5 * kMiB);
    EXPECT_EQ(c.ok(), gc);
    if (gc) {
      EXPECT_EQ(sim.stats().num_regions_freed, 2);
      ASSERT_EQ(sim.Regions().size(), 1u);
    }
    EXPECT_TRUE(sim.CheckInvariants().ok());
  }
}

TEST(BfcAllocatorSimTest, EventsRebuildTheSameLayoutInDeviceMemory) {
  BfcSettings s = Limit(16 * kMiB);
  s.garbage_collection = true;
  BfcAllocatorSim sim(s, {}, 3);
  DeviceMemory mem(3);
  Status applied;
  sim.SetEventSink([&](const Event& e) {
    if (applied.ok()) applied = mem.Apply(e);
  });
  std::vector<std::uint64_t> live;
  for (int i = 0; i < 40; ++i) live.push_back(*sim.Malloc(1000 + 9000 * i));
  for (std::size_t i = 0; i < live.size(); i += 2) ASSERT_TRUE(sim.Free(live[i]).ok());
  ASSERT_TRUE(applied.ok()) << applied.ToString();
  std::uint64_t in_use = 0;
  for (const BfcRegion& r : sim.Regions()) {
    for (const BfcChunk& c : r.chunks) in_use += c.in_use ? c.size : 0;
  }
  EXPECT_EQ(mem.allocated(), in_use);
  EXPECT_EQ(mem.reserved(), static_cast<std::uint64_t>(sim.stats().pool_bytes));
  EXPECT_TRUE(mem.CheckInvariants().ok());
}

TEST(BfcAllocatorSimTest, DescendingRegionsTurnTheTieBetweenRegions) {
  for (bool descending : {false, true}) {
    BfcSettings s = Limit(64 * kMiB);
    s.descending_regions = descending;
    BfcAllocatorSim sim(s, {}, 0);
    const std::uint64_t r1a = *sim.Malloc(kMiB);  // region 1 (2 MiB), split
    ASSERT_TRUE(sim.Malloc(kMiB).ok());           // its other half, exactly
    const std::uint64_t r2a = *sim.Malloc(kMiB);  // region 2 (4 MiB)
    ASSERT_TRUE(sim.Malloc(kMiB).ok());           // keeps r2a from merging when freed
    EXPECT_EQ(r2a < r1a, descending);
    ASSERT_TRUE(sim.Free(r1a).ok());
    ASSERT_TRUE(sim.Free(r2a).ok());
    // Two free 1 MiB chunks, one per region: best fit takes the lower address.
    EXPECT_EQ(*sim.Malloc(kMiB), descending ? r2a : r1a);
    EXPECT_TRUE(sim.CheckInvariants().ok());
  }
}

TEST(BfcAllocatorSimTest, FreeOfAnUnknownAddressIsAnError) {
  BfcAllocatorSim sim(Limit(kMiB), {}, 0);
  EXPECT_EQ(sim.Free(0x1234).code(), StatusCode::kInvalidArgument);
}

TEST(BfcSettingsTest, ParsesEveryKeyAndRefusesTheUnknown) {
  Result<BfcSettings> s = ParseBfcSettings(
      "preallocate:true, memory_limit:12GiB, garbage_collection:true, "
      "fragmentation_fraction:0.1");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_FALSE(s->allow_growth);
  EXPECT_EQ(*s->memory_limit, 12 * kGiB);
  EXPECT_TRUE(s->garbage_collection);
  EXPECT_DOUBLE_EQ(s->fragmentation_fraction, 0.1);
  EXPECT_EQ(ToBfcConfString(*s),
            "allow_growth:false,memory_limit:12884901888,garbage_collection:true,"
            "fragmentation_fraction:0.1");
  EXPECT_EQ(*ParseBfcSettings(ToBfcConfString(*s)), *s);
  EXPECT_EQ(ParseBfcSettings("").value(), BfcSettings{});
  EXPECT_NE(ParseBfcSettings("allow_grwoth:true").status().message().find("allow_grwoth"),
            std::string::npos);
  EXPECT_FALSE(ParseBfcSettings("memory_fraction:1.5").ok());
  EXPECT_FALSE(ParseBfcSettings("memory_fraction:0").ok());
  EXPECT_FALSE(ParseBfcSettings("allow_growth:maybe").ok());
  EXPECT_FALSE(ParseBfcSettings("version:0.x,garbage_collection:true").ok());
  EXPECT_FALSE(ParseBfcSettings("version:2.x,fragmentation_fraction:0.2").ok());
  EXPECT_FALSE(ParseBfcSettings("memory_limit:12").ok());
  EXPECT_TRUE(ParseBfcSettings("regions:descending")->descending_regions);
  EXPECT_FALSE(ParseBfcSettings("regions:sideways").ok());
}

TEST(BfcSettingsTest, TheLimitIsAFractionOfTheDeviceWhenNotGiven) {
  BfcSettings s;
  s.memory_fraction = 0.75;
  BfcDevice d;
  d.capacity_bytes = 16 * kGiB;
  d.used_by_others_bytes = 4 * kGiB;
  BfcAllocatorSim sim(s, d, 0);
  EXPECT_EQ(sim.memory_limit(), 9 * kGiB);
}

}  // namespace
}  // namespace fragscope::model
