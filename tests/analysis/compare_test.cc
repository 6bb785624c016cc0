#include "analysis/compare.h"

#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/units.h"

namespace fragscope::analysis {
namespace {

Event Alloc(std::uint64_t addr, std::uint64_t size, std::int32_t frame, std::int32_t device = 0) {
  Event e;
  e.action = Action::kAlloc;
  e.addr = addr;
  e.size = size;
  e.frame = frame;
  e.device = device;
  return e;
}

Event Free(Action action, std::uint64_t addr, std::int32_t device = 0) {
  Event e;
  e.action = action;
  e.addr = addr;
  e.device = device;
  return e;
}

std::vector<Frame> Frames() {
  return {Frame{0, "forward", "model.py", 12}, Frame{1, "step", "optim.py", 40},
          Frame{2, "C++ only: at::_ops::mm", "", 0}, Frame{3, "forward", "model.py", 12}};
}

// ---------------------------------------------------------------------------------------------
// SiteMemoryTracker
// ---------------------------------------------------------------------------------------------

TEST(SiteMemoryTrackerTest, PeakIsOfLiveRequestedBytesPerSite) {
  SiteMemoryTracker t;
  t.Consume(Alloc(0x1000, 100, 0));
  t.Consume(Alloc(0x2000, 300, 0));
  t.Consume(Free(Action::kFreeRequested, 0x1000));
  t.Consume(Free(Action::kFreeCompleted, 0x1000));  // the same free: counted once
  t.Consume(Alloc(0x3000, 50, 0));
  t.Consume(Alloc(0x4000, 1000, 1));
  t.Consume(Free(Action::kFreeCompleted, 0x4000));  // a free_completed alone frees too
  const std::vector<SiteMemory> sites = t.Sites(Frames());
  ASSERT_EQ(sites.size(), 2u);
  EXPECT_EQ(sites[0].site, "optim.py:40 in step");  // largest peak first
  EXPECT_EQ(sites[0].peak_live_bytes, 1000u);
  EXPECT_EQ(sites[0].live_bytes_at_end, 0u);
  EXPECT_EQ(sites[1].site, "model.py:12 in forward");
  EXPECT_EQ(sites[1].peak_live_bytes, 400u);  // 100 + 300 before the free; 350 after
  EXPECT_EQ(sites[1].live_bytes_at_end, 350u);
  EXPECT_EQ(sites[1].allocs, 3u);
  EXPECT_EQ(sites[1].requested_bytes, 450u);
}

TEST(SiteMemoryTrackerTest, StartStateBlocksAreLiveAndDevicesAreApart) {
  SiteMemoryTracker t;
  Event block = Alloc(0x1000, 700, 2);
  block.action = Action::kBlock;
  t.Consume(block);
  t.Consume(Alloc(0x1000, 10, 2, /*device=*/1));  // the same address on another device
  t.Consume(Alloc(0x5000, 5, -1));                // no stack
  const std::vector<SiteMemory> sites = t.Sites(Frames());
  ASSERT_EQ(sites.size(), 3u);
  EXPECT_EQ(sites[0].device, 0);
  EXPECT_EQ(sites[0].site, "C++ only: at::_ops::mm");
  EXPECT_EQ(sites[0].peak_live_bytes, 700u);
  EXPECT_EQ(sites[1].site, "(no stack recorded)");
  EXPECT_EQ(sites[2].device, 1);
  EXPECT_EQ(sites[2].peak_live_bytes, 10u);
}

TEST(SiteMemoryTrackerTest, IdsNamingOneSiteAreOneSiteAndTheFirstOomKeepsItsFrame) {
  SiteMemoryTracker t;
  t.Consume(Alloc(0x1000, 100, 0));
  t.Consume(Alloc(0x2000, 200, 3));  // frame 3 names the same text as frame 0
  Event oom;
  oom.action = Action::kOom;
  oom.size = 1 << 20;
  oom.frame = 1;
  t.Consume(oom);
  oom.frame = 2;
  t.Consume(oom);  // not the first
  const std::vector<SiteMemory> sites = t.Sites(Frames());
  ASSERT_EQ(sites.size(), 1u);
  EXPECT_EQ(sites[0].peak_live_bytes, 300u);
  EXPECT_EQ(sites[0].allocs, 2u);
  EXPECT_EQ(t.FirstOomFrame(0), 1);
  EXPECT_EQ(t.FirstOomFrame(1), -1);
}

// ---------------------------------------------------------------------------------------------
// FiguresOf, UseReplayOoms
// ---------------------------------------------------------------------------------------------

TEST(FiguresOfTest, TakesTheAnalysisFiguresAndTheDeviceSites) {
  AnalysisResult r;
  r.source = "a.pickle";
  DeviceReport d;
  d.device = 1;
  d.peak_reserved.bytes = 5000;
  d.peak_allocated.bytes = 4000;
  d.peak_live_requested.bytes = 3900;
  d.worst_fragmentation.seen = true;
  d.worst_fragmentation_ratio = 0.25;
  d.worst_fragmentation_reserved = 4800;
  d.final_metrics.all.stranded_bytes = 77;
  d.num_ooms = 2;
  OomDiagnosis o;
  o.event_index = 42;
  o.step = 3;
  o.requested = 1000;
  o.rounded = 1024;
  o.cause = OomCause::kFragmentation;
  o.margin = 10;
  d.oom_diagnoses.push_back(o);
  DeviceReport quiet;  // no moment qualified for the worst ratio
  quiet.device = 0;
  r.devices = {d, quiet};
  std::vector<SiteMemory> sites(2);
  sites[0].device = 1;
  sites[0].site = "x";
  sites[1].device = 0;
  sites[1].site = "y";
  const RunFigures run = FiguresOf(r, sites, {{1, "model.py:12 in forward"}});
  ASSERT_EQ(run.devices.size(), 2u);
  EXPECT_EQ(run.devices[0].device, 0);  // ascending
  EXPECT_FALSE(run.devices[0].worst_fragmentation_ratio.has_value());
  const DeviceFigures& f = run.devices[1];
  EXPECT_EQ(f.peak_reserved_bytes, 5000u);
  EXPECT_EQ(f.peak_allocated_bytes, 4000u);
  EXPECT_EQ(f.peak_requested_bytes, 3900u);
  EXPECT_EQ(f.worst_fragmentation_ratio, 0.25);
  EXPECT_EQ(f.worst_fragmentation_reserved_bytes, 4800u);
  EXPECT_EQ(f.stranded_bytes_at_end, 77u);
  EXPECT_EQ(f.num_ooms, 2u);
  ASSERT_TRUE(f.first_oom.has_value());
  EXPECT_EQ(f.first_oom->event_index, 42u);
  EXPECT_FALSE(f.first_oom->request_index);
  EXPECT_EQ(f.first_oom->site, "model.py:12 in forward");
  ASSERT_EQ(f.sites.size(), 1u);
  EXPECT_EQ(f.sites[0].site, "x");

  // A replay names the request that failed, keeping the diagnosis' cause.
  RunFigures replayed = run;
  model::ReplayOom failed;
  failed.device = 1;
  failed.event_index = 7;
  failed.step = 2;
  UseReplayOoms({failed}, &replayed);
  EXPECT_EQ(replayed.devices[1].first_oom->event_index, 7u);
  EXPECT_TRUE(replayed.devices[1].first_oom->request_index);
  EXPECT_EQ(replayed.devices[1].first_oom->step, 2);
  EXPECT_EQ(replayed.devices[1].first_oom->cause, OomCause::kFragmentation);
  EXPECT_FALSE(replayed.devices[0].first_oom.has_value());
}

// ---------------------------------------------------------------------------------------------
// CompareRuns
// ---------------------------------------------------------------------------------------------

SiteMemory Site(std::string name, std::uint64_t peak, std::int32_t device = 0) {
  SiteMemory s;
  s.device = device;
  s.site = std::move(name);
  s.peak_live_bytes = peak;
  return s;
}

DeviceFigures Device(std::int32_t id, std::vector<SiteMemory> sites = {}) {
  DeviceFigures d;
  d.device = id;
  d.peak_reserved_bytes = 100 * kMiB;
  d.peak_allocated_bytes = 80 * kMiB;
  d.peak_requested_bytes = 78 * kMiB;
  d.worst_fragmentation_ratio = 0.2;
  for (SiteMemory& s : sites) s.device = id;
  d.sites = std::move(sites);
  return d;
}

RunFigures RunOf(std::vector<DeviceFigures> devices) {
  RunFigures r;
  r.devices = std::move(devices);
  return r;
}

TEST(CompareRunsTest, SitesThatChangedMostFirstWithOnlyInOneRunMarked) {
  const RunFigures a =
      RunOf({Device(0, {Site("same", 10), Site("grew", 5), Site("gone", 3), Site("shrank", 9)})});
  const RunFigures b =
      RunOf({Device(0, {Site("same", 10), Site("grew", 25), Site("new", 4), Site("shrank", 1)})});
  const RunDiff diff = CompareRuns(a, b, /*top_sites=*/3);
  ASSERT_EQ(diff.devices.size(), 1u);
  const DeviceDiff& d = diff.devices[0];
  EXPECT_EQ(d.sites_changed, 4u);  // every site but "same"
  ASSERT_EQ(d.site_changes.size(), 3u);
  EXPECT_EQ(d.site_changes[0].site, "grew");
  EXPECT_EQ(d.site_changes[0].ChangeBytes(), 20);
  EXPECT_EQ(d.site_changes[1].site, "shrank");
  EXPECT_EQ(d.site_changes[1].ChangeBytes(), -8);
  EXPECT_EQ(d.site_changes[2].site, "new");  // |4| > |-3|
  EXPECT_FALSE(d.site_changes[2].in_a);
  EXPECT_TRUE(d.site_changes[2].in_b);
}

TEST(CompareRunsTest, OneDeviceEachIsPairedWhateverItsIndexElseByIndex) {
  RunDiff single = CompareRuns(RunOf({Device(0)}), RunOf({Device(3)}));
  ASSERT_EQ(single.devices.size(), 1u);
  EXPECT_EQ(single.devices[0].a->device, 0);
  EXPECT_EQ(single.devices[0].b->device, 3);

  RunDiff many = CompareRuns(RunOf({Device(0), Device(1)}), RunOf({Device(1), Device(2)}));
  ASSERT_EQ(many.devices.size(), 3u);
  EXPECT_TRUE(many.devices[0].a && !many.devices[0].b);  // device 0: A only
  EXPECT_TRUE(many.devices[1].a && many.devices[1].b);
  EXPECT_TRUE(!many.devices[2].a && many.devices[2].b);  // device 2: B only
}

// ---------------------------------------------------------------------------------------------
// CompareRanks
// ---------------------------------------------------------------------------------------------

std::vector<RunFigures> Ranks(std::size_t n) {
  std::vector<RunFigures> ranks;
  for (std::size_t i = 0; i < n; ++i) {
    // Each rank records its own device, with slightly different figures.
    DeviceFigures d =
        Device(static_cast<std::int32_t>(i),
               {Site("model.py:12 in forward", 40 * kMiB), Site("optim.py:40 in step", 20 * kMiB)});
    d.peak_requested_bytes += i * kMiB / 4;
    RunFigures r = RunOf({d});
    r.path = "rank" + std::to_string(i) + ".pickle";
    ranks.push_back(r);
  }
  return ranks;
}

TEST(CompareRanksTest, AlikeRanksDoNotDiffer) {
  const RankComparison c = CompareRanks(Ranks(8));
  EXPECT_TRUE(c.differing.empty());
  ASSERT_EQ(c.devices.size(), 8u);
  EXPECT_EQ(c.devices[5], 5);
}

TEST(CompareRanksTest, TheRankThatRequestsMoreIsNamedWithItsFigures) {
  std::vector<RunFigures> ranks = Ranks(8);
  ranks[5].devices[0].peak_requested_bytes = 120 * kMiB;
  const RankComparison c = CompareRanks(ranks);
  ASSERT_EQ(c.differing.size(), 1u);
  const RankFinding& f = c.differing[0];
  EXPECT_EQ(f.rank, 5u);
  EXPECT_EQ(f.device, 5);
  ASSERT_EQ(f.deviations.size(), 1u);
  const RankDeviation& d = f.deviations[0];
  EXPECT_EQ(d.key, "peak_requested_bytes");
  EXPECT_DOUBLE_EQ(d.value, static_cast<double>(120 * kMiB));
  // The others: 78 MiB + i/4 MiB for i in {0..7} \ {5}; the median is the 4th of 7.
  EXPECT_DOUBLE_EQ(d.median_of_others, static_cast<double>(78 * kMiB + 3 * kMiB / 4));
  // Their MAD is tiny, so the floor (5% of the median) is the scale.
  EXPECT_DOUBLE_EQ(d.scale, kRankMinRelativeScale * d.median_of_others);
  EXPECT_NEAR(d.z, (d.value - d.median_of_others) / d.scale, 1e-9);
  EXPECT_GT(d.z, kRankZThreshold);
}

TEST(CompareRanksTest, MoreFragmentedAndLessReservedPointBothWays) {
  std::vector<RunFigures> ranks = Ranks(4);
  ranks[2].devices[0].worst_fragmentation_ratio = 0.6;
  ranks[1].devices[0].peak_reserved_bytes = 10 * kMiB;
  const RankComparison c = CompareRanks(ranks);
  ASSERT_EQ(c.differing.size(), 2u);
  for (const RankFinding& f : c.differing) {
    ASSERT_EQ(f.deviations.size(), 1u) << f.rank;
    if (f.rank == 2) {
      EXPECT_EQ(f.deviations[0].key, "worst_fragmentation_ratio");
      EXPECT_FALSE(f.deviations[0].bytes);
      EXPECT_GT(f.deviations[0].z, 0);
    } else {
      EXPECT_EQ(f.rank, 1u);
      EXPECT_EQ(f.deviations[0].key, "peak_reserved_bytes");
      EXPECT_LT(f.deviations[0].z, 0);
    }
  }
  // Most different first.
  EXPECT_GE(c.differing[0].score, c.differing[1].score);
}

TEST(CompareRanksTest, AnExtraAndAMissingCallSiteAreNamed) {
  std::vector<RunFigures> ranks = Ranks(4);
  ranks[0].devices[0].sites.push_back(Site("eval.py:3 in evaluate", 8 * kMiB, 0));
  ranks[0].devices[0].sites.push_back(Site("log.py:1 in tiny", 4096, 0));  // below 1 MiB
  ranks[3].devices[0].sites.pop_back();  // no optimizer step on rank 3
  const RankComparison c = CompareRanks(ranks);
  ASSERT_EQ(c.differing.size(), 2u);
  const RankFinding& first = c.differing[0].rank == 0 ? c.differing[0] : c.differing[1];
  const RankFinding& second = c.differing[0].rank == 0 ? c.differing[1] : c.differing[0];
  EXPECT_EQ(first.rank, 0u);
  ASSERT_EQ(first.extra_sites.size(), 1u);
  EXPECT_EQ(first.extra_sites[0].site, "eval.py:3 in evaluate");
  EXPECT_TRUE(first.missing_sites.empty());
  EXPECT_EQ(second.rank, 3u);
  ASSERT_EQ(second.missing_sites.size(), 1u);
  EXPECT_EQ(second.missing_sites[0].site, "optim.py:40 in step");
  EXPECT_EQ(second.missing_sites[0].peak_live_bytes, 20 * kMiB);
  EXPECT_TRUE(second.deviations.empty());
}

TEST(CompareRanksTest, OneWildRankDoesNotMakeTheOthersDiffer) {
  // The median and MAD of the others are robust: rank 0's huge figure moves neither.
  std::vector<RunFigures> ranks = Ranks(6);
  ranks[0].devices[0].peak_requested_bytes = 10 * kGiB;
  const RankComparison c = CompareRanks(ranks);
  ASSERT_EQ(c.differing.size(), 1u);
  EXPECT_EQ(c.differing[0].rank, 0u);
}

TEST(CompareRanksTest, TheMainDeviceIsTheOneWithTheHighestPeakReserved) {
  RunFigures r = RunOf({Device(0), Device(1)});
  r.devices[1].peak_reserved_bytes = 200 * kMiB;
  ASSERT_NE(MainDevice(r), nullptr);
  EXPECT_EQ(MainDevice(r)->device, 1);
  EXPECT_EQ(MainDevice(RunOf({})), nullptr);
}

}  // namespace
}  // namespace fragscope::analysis
