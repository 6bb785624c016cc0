// Tune's per-device sizes (a snapshot's devices whose recorded OOM tells their capacity). The
// CLI tests (tests/cli/test_replay.py) cover the grid, the ranking and snapshots end to end.
#include "analysis/tune.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/units.h"
#include "model/alloc_conf.h"

namespace fragscope::analysis {
namespace {

constexpr std::uint64_t MiB = kMiB;

Event Alloc(std::int32_t device, std::uint64_t id, std::uint64_t size) {
  Event e;
  e.action = Action::kAlloc;
  e.device = device;
  e.addr = id;
  e.size = size;
  return e;
}

// Device 0 asks for 9 MiB, device 1 for 30 MiB. A request over 1 MiB and under 10 MiB gets a
// 20 MiB segment; from 10 MiB up, its size rounded up to 2 MiB. So device 0 reserves 20 MiB and
// device 1 exactly 30 MiB.
const std::vector<Event> kTwoDevices = {Alloc(0, 1, 9 * MiB), Alloc(1, 2, 30 * MiB)};

Event Free(std::int32_t device, std::uint64_t id, std::uint64_t size) {
  Event e = Alloc(device, id, size);
  e.action = Action::kFreeRequested;
  return e;
}

TuneOptions OneSetting() {
  TuneOptions o;
  o.settings = {""};
  o.threads = 1;
  o.capacity_bytes = 1024 * MiB;
  return o;
}

// The default grid is valid for the version it is made for: --torch-version 2 and 1.13 must not
// fail on keys those releases lack (per_process_memory_fraction is 2.9+, expandable_segments
// 2.1+).
TEST(TuneTest, TheDefaultGridParsesForEveryVersion) {
  for (model::ConfigVersion v :
       {model::ConfigVersion::kV1_13, model::ConfigVersion::kV2, model::ConfigVersion::kNewest}) {
    const std::vector<std::string> grid = DefaultTuneGrid(v);
    EXPECT_EQ(grid.size(), v == model::ConfigVersion::kV1_13 ? 36u : 72u);
    EXPECT_EQ(grid.front(), "");
    for (const std::string& conf : grid) {
      Result<model::AllocatorConfig> c = model::ParseAllocatorConfig(conf, v);
      ASSERT_TRUE(c.ok()) << model::ConfigVersionName(v) << ": " << c.status().ToString();
      EXPECT_EQ(model::ToConfString(*c), conf);  // printed by the one printer
    }
  }
}

TEST(TuneTest, EveryDeviceHasTheCommonCapacityUnlessItsOwnIsGiven) {
  Result<std::vector<TuneOutcome>> fits = Tune(kTwoDevices, OneSetting());
  ASSERT_TRUE(fits.ok()) << fits.status().ToString();
  EXPECT_FALSE(fits->front().oom);
  EXPECT_EQ(fits->front().peak_reserved, 30 * MiB);  // the device with the highest peak

  // Device 1 on 29 MiB: its 30 MiB segment cannot be had, at its first request (event 1).
  TuneOptions small = OneSetting();
  small.device_capacity_bytes[1] = 29 * MiB;
  Result<std::vector<TuneOutcome>> oom = Tune(kTwoDevices, small);
  ASSERT_TRUE(oom.ok()) << oom.status().ToString();
  EXPECT_TRUE(oom->front().oom);
  EXPECT_EQ(oom->front().oom_event, 1u);

  // Device 0 on 19 MiB instead: its 20 MiB segment fails at event 0; device 1 is not limited.
  TuneOptions other = OneSetting();
  other.device_capacity_bytes[0] = 19 * MiB;
  Result<std::vector<TuneOutcome>> first = Tune(kTwoDevices, other);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_TRUE(first->front().oom);
  EXPECT_EQ(first->front().oom_event, 0u);
}

TEST(TuneTest, TheMinimumCapacityIsOneSizeForEveryDevice) {
  // Device 1 takes two 12 MiB segments, frees the first block, then asks for 14 MiB: a third
  // segment (the cached 12 MiB block is too small), 38 MiB reserved with room enough. On a
  // smaller device the failed cudaMalloc releases the cached 12 MiB segment and retries, so
  // 12 + 14 = 26 MiB is the least it needs; device 0 needs 20 MiB.
  std::vector<Event> events = {Alloc(0, 1, 9 * MiB), Alloc(1, 2, 12 * MiB), Alloc(1, 3, 12 * MiB)};
  Event free_first;
  free_first.action = Action::kFreeRequested;
  free_first.device = 1;
  free_first.addr = 2;
  events.push_back(free_first);
  events.push_back(Alloc(1, 4, 14 * MiB));

  // Given 25 MiB of its own, device 1 runs out of memory; the bisection gives every device the
  // size it tries instead, and both fit from 26 MiB.
  TuneOptions o = OneSetting();
  o.device_capacity_bytes[1] = 25 * MiB;
  o.find_min_capacity = true;
  Result<std::vector<TuneOutcome>> tuned = Tune(events, o);
  ASSERT_TRUE(tuned.ok()) << tuned.status().ToString();
  EXPECT_TRUE(tuned->front().oom);
  EXPECT_EQ(tuned->front().oom_event, 4u);
  ASSERT_TRUE(tuned->front().min_capacity.has_value());
  EXPECT_EQ(*tuned->front().min_capacity, 26 * MiB);
}

// Three requests just over 3 MiB share one 20 MiB segment under both settings, so the peak
// reserved is the same; roundup_power2_divisions:4 rounds each up to 3.5 MiB. Those bytes buy
// nothing here and would bring an OOM closer as requests grow: the setting without them ranks
// first, whichever order they are given in (before, the lower reserved-minus-allocated of the
// rounding setting ranked it first).
TEST(TuneTest, RoundingThatBuysNothingRanksBelowTheSettingWithoutIt) {
  const std::vector<Event> three = {Alloc(0, 1, 3 * MiB + 1), Alloc(0, 2, 3 * MiB + 1),
                                    Alloc(0, 3, 3 * MiB + 1)};
  TuneOptions o = OneSetting();
  o.settings = {"roundup_power2_divisions:4", ""};
  Result<std::vector<TuneOutcome>> ranked = Tune(three, o);
  ASSERT_TRUE(ranked.ok()) << ranked.status().ToString();
  ASSERT_EQ(ranked->size(), 2u);
  EXPECT_EQ((*ranked)[0].peak_reserved, (*ranked)[1].peak_reserved);
  EXPECT_EQ((*ranked)[0].conf, "");
  EXPECT_LT((*ranked)[0].peak_allocated, (*ranked)[1].peak_allocated);
  // The requests, the same in both, are what waste is measured against: rounding is waste, so
  // the two waste the same (reserved minus allocated called the rounding setting thriftier).
  EXPECT_EQ((*ranked)[0].peak_requested, 3 * (3 * MiB + 1));
  EXPECT_EQ((*ranked)[1].peak_requested, 3 * (3 * MiB + 1));
  EXPECT_DOUBLE_EQ((*ranked)[1].waste_at_peak, (*ranked)[0].waste_at_peak);
}

// Outcomes equal in every figure: the smallest change wins, whatever order they come in.
TEST(TuneTest, AmongEqualOutcomesTheFewestKeysRankFirst) {
  const std::vector<Event> one = {Alloc(0, 1, 4 * MiB)};
  TuneOptions o = OneSetting();
  o.settings = {"max_split_size_mb:64,garbage_collection_threshold:0.5", "max_split_size_mb:64",
                ""};
  Result<std::vector<TuneOutcome>> ranked = Tune(one, o);
  ASSERT_TRUE(ranked.ok()) << ranked.status().ToString();
  ASSERT_EQ(ranked->size(), 3u);
  EXPECT_EQ((*ranked)[0].conf, "");
  EXPECT_EQ((*ranked)[1].conf, "max_split_size_mb:64");
}

// Issue 29 item 5: a snapshot whose segments were all reserved before recording began. The
// start state's 20 MiB segment is rebuilt by requests 0-1; the recorded history holds no device
// allocation, so whatever the replays of the rebuild give, the history cannot tell the settings
// apart. A history that allocates, or a request trace, can.
TEST(TuneTest, SaysWhenTheRecordedHistoryCannotTellTheSettingsApart) {
  std::vector<Event> events = {Alloc(0, 1, 20 * MiB), Free(0, 1, 20 * MiB)};
  for (std::uint64_t id = 2; id < 12; ++id) {
    events.push_back(Alloc(0, id, (id % 3 + 2) * MiB));
    events.push_back(Free(0, id, (id % 3 + 2) * MiB));
  }
  TuneOptions o = OneSetting();
  o.settings = {"", "expandable_segments:True", "max_split_size_mb:64",
                "roundup_power2_divisions:4"};
  o.recorded_from[0] = 2;  // requests 0-1 rebuild the start state
  o.recorded_device_allocs = 0;
  Result<std::vector<TuneOutcome>> rebuilt = Tune(events, o);
  ASSERT_TRUE(rebuilt.ok()) << rebuilt.status().ToString();
  for (const TuneOutcome& t : *rebuilt) {
    EXPECT_EQ(t.device_allocs_recorded, 0u) << t.conf;  // the requests fit in the rebuild
    EXPECT_FALSE(t.oom) << t.conf;
  }
  const std::string why = TuneCannotRank(*rebuilt, o);
  EXPECT_NE(why.find("cannot tell the settings apart"), std::string::npos) << why;
  EXPECT_NE(why.find("reserved before recording began"), std::string::npos) << why;
  EXPECT_EQ(why.find("needed more memory"), std::string::npos) << why;

  // The recorded history allocated a segment: the replays rank the settings.
  o.recorded_device_allocs = 1;
  EXPECT_EQ(TuneCannotRank(*rebuilt, o), "");
  // A request trace (counted from its start: the segment is allocated by every setting).
  o.recorded_from.clear();
  o.recorded_device_allocs.reset();
  Result<std::vector<TuneOutcome>> traced = Tune(events, o);
  ASSERT_TRUE(traced.ok()) << traced.status().ToString();
  for (const TuneOutcome& t : *traced) EXPECT_GT(t.device_allocs_recorded, 0u) << t.conf;
  EXPECT_EQ(TuneCannotRank(*traced, o), "");

  // A rebuild under which a recorded request no longer fits: still the rebuild's doing, and
  // the sentence says how many settings it made allocate.
  o.recorded_from[0] = 2;
  o.recorded_device_allocs = 0;
  events.push_back(Alloc(0, 100, 64 * MiB));
  Result<std::vector<TuneOutcome>> grown = Tune(events, o);
  ASSERT_TRUE(grown.ok()) << grown.status().ToString();
  const std::string grew = TuneCannotRank(*grown, o);
  EXPECT_NE(grew.find("4 of the 4 needed more memory"), std::string::npos) << grew;
}

}  // namespace
}  // namespace fragscope::analysis
