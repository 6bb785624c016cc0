#include "analysis/live_forecast.h"

#include <algorithm>
#include <random>

#include <gtest/gtest.h>

#include "common/units.h"

namespace fragscope::analysis {
namespace {

// What a live agent reports at `step`: PyTorch's memory_stats() peaks are since the process
// started, so `peak_so_far` is the record of every step before.
LiveSample Live(std::int64_t step, std::uint64_t peak_so_far, std::uint64_t reserved,
                std::optional<std::uint64_t> capacity = 10 * kGiB) {
  LiveSample s;
  s.step = step;
  s.capacity_bytes = capacity;
  s.retries_total = 0;
  TimelineSample& w = s.window;
  w.peak_allocated_bytes = peak_so_far;
  w.peak_reserved_bytes = reserved;
  w.reserved_bytes = reserved;
  w.allocated_bytes = peak_so_far / 2;
  w.cached_free_bytes = reserved - w.allocated_bytes;
  w.fragmentation_ratio = 0.1;
  w.largest_free_block = kGiB;
  w.max_allocatable = 3 * kGiB;
  return s;
}

LiveForecasts Make(std::size_t max_series = 16) {
  Result<LiveForecasts> made = LiveForecasts::Create(ForecastOptions{}, max_series);
  EXPECT_TRUE(made.ok()) << made.status().message();
  return std::move(*made);
}

// A leak: the job's peak grows by 8 MiB a step from 6 GiB and passes the 10 GiB device at step
// 512. Sampled every 10 steps with since-start peaks, the daemon warns well ahead.
TEST(LiveForecastTest, WarnsOfALeakFromSinceStartPeaks) {
  LiveForecasts live = Make();
  std::optional<std::int64_t> first_warning;
  std::optional<std::uint64_t> steps_to_oom;
  for (std::int64_t step = 0; step < 512; step += 10) {
    const std::uint64_t peak = 6 * kGiB + static_cast<std::uint64_t>(step) * 8 * kMiB;
    const LiveVerdict v = live.Observe("pid 7 GPU-a", Live(step, peak, peak + kGiB / 2));
    EXPECT_EQ(v.point.step, step);
    if (v.point.level >= RiskLevel::kWarning && !first_warning) {
      first_warning = step;
      steps_to_oom = v.point.steps_to_oom;
    }
  }
  ASSERT_TRUE(first_warning.has_value());
  EXPECT_LE(*first_warning, 512 - 20);
  ASSERT_TRUE(steps_to_oom.has_value());
  EXPECT_GT(*steps_to_oom, 0u);
}

// A healthy job: per-step peaks jitter around 6 GiB on a 10 GiB device. Since-start peaks
// climb to the record within the first steps and stay: no warning, and the level is ok once
// warm.
TEST(LiveForecastTest, FlatJobStaysOkWithSinceStartPeaks) {
  LiveForecasts live = Make();
  std::mt19937_64 rng(3);
  std::uniform_int_distribution<std::uint64_t> jitter(0, 256 * kMiB);
  std::uint64_t record = 0;
  for (std::int64_t step = 0; step < 3000; ++step) {
    record = std::max(record, 6 * kGiB + jitter(rng));
    if (step % 10) continue;
    const LiveVerdict v = live.Observe("k", Live(step, record, 7 * kGiB));
    if (step >= 20) {
      EXPECT_EQ(v.point.level, RiskLevel::kOk) << step << ": " << v.point.reason;
    }
  }
}

TEST(LiveForecastTest, RetriesAreCountedFromTheCumulativeCounter) {
  LiveForecasts live = Make();
  LiveSample s = Live(0, 6 * kGiB, 7 * kGiB);
  s.retries_total = 5;  // retries before the first sample are not this sample's
  EXPECT_NE(live.Observe("k", s).point.reason.find("warming up"), std::string::npos);
  s.step = 10;
  EXPECT_EQ(live.Observe("k", s).point.level, RiskLevel::kOk) << "no new retry";
  s.step = 20;
  s.retries_total = 8;
  const LiveVerdict v = live.Observe("k", s);
  EXPECT_EQ(v.point.level, RiskLevel::kWatch);
  EXPECT_NE(v.point.reason.find("3 allocation retries"), std::string::npos) << v.point.reason;
  EXPECT_EQ(v.previous, RiskLevel::kOk);
}

TEST(LiveForecastTest, RepeatedStepAddsNothingAndAnEarlierStepRestarts) {
  LiveForecasts live = Make();
  for (std::int64_t step = 0; step <= 40; step += 10)
    live.Observe("k", Live(step, 6 * kGiB, 7 * kGiB));
  const LiveVerdict again = live.Observe("k", Live(40, 9 * kGiB, 7 * kGiB));
  EXPECT_EQ(again.point.step, 40);
  EXPECT_EQ(again.point.level, again.previous);
  // The job restarted: step 0 again, warming up from scratch.
  const LiveVerdict restarted = live.Observe("k", Live(0, 6 * kGiB, 7 * kGiB));
  EXPECT_NE(restarted.point.reason.find("warming up (1 of 20 steps)"), std::string::npos)
      << restarted.point.reason;
  EXPECT_EQ(live.size(), 1u);
}

TEST(LiveForecastTest, CapacityChangeRestartsAndUnknownCapacityGivesNoStepsToOom) {
  LiveForecasts live = Make();
  for (std::int64_t step = 0; step <= 40; step += 10) {
    live.Observe("k", Live(step, 6 * kGiB, 7 * kGiB, std::nullopt));
  }
  EXPECT_NE(live.Observe("k", Live(50, 6 * kGiB, 7 * kGiB, std::nullopt))
                .point.reason.find("capacity unknown"),
            std::string::npos);
  // The capacity becomes known: a fresh series.
  EXPECT_NE(live.Observe("k", Live(60, 6 * kGiB, 7 * kGiB)).point.reason.find("warming up"),
            std::string::npos);
  // 2% less (another process took some): the same series; 10% less: afresh.
  EXPECT_EQ(live.Observe("k", Live(70, 6 * kGiB, 7 * kGiB, 98 * kGiB / 10))
                .point.reason.find("warming up (1 of"),
            std::string::npos);
  EXPECT_NE(live.Observe("k", Live(80, 6 * kGiB, 7 * kGiB, 9 * kGiB))
                .point.reason.find("warming up (1 of"),
            std::string::npos);
}

TEST(LiveForecastTest, KeepsAtMostMaxSeriesDroppingTheLeastRecent) {
  LiveForecasts live = Make(2);
  live.Observe("a", Live(0, 6 * kGiB, 7 * kGiB));
  live.Observe("b", Live(0, 6 * kGiB, 7 * kGiB));
  live.Observe("a", Live(10, 6 * kGiB, 7 * kGiB));  // a is now the most recent
  live.Observe("c", Live(0, 6 * kGiB, 7 * kGiB));   // drops b
  EXPECT_EQ(live.size(), 2u);
  EXPECT_EQ(live.Observe("a", Live(20, 6 * kGiB, 7 * kGiB)).previous, RiskLevel::kOk)
      << "a was kept (warming up is ok)";
  EXPECT_EQ(live.Observe("b", Live(10, 6 * kGiB, 7 * kGiB)).previous, RiskLevel::kUnknown)
      << "b was dropped: it starts afresh";
  EXPECT_EQ(live.size(), 2u);
}

TEST(LiveForecastTest, NoStepNoForecastAndOptionsAreValidated) {
  LiveForecasts live = Make();
  const LiveVerdict v = live.Observe("k", Live(-1, 6 * kGiB, 7 * kGiB));
  EXPECT_EQ(v.point.level, RiskLevel::kUnknown);
  EXPECT_EQ(live.size(), 0u);
  ForecastOptions bad;
  bad.every = 0;
  EXPECT_FALSE(LiveForecasts::Create(bad, 4).ok());
  EXPECT_FALSE(LiveForecasts::Create(ForecastOptions{}, 0).ok());
}

}  // namespace
}  // namespace fragscope::analysis
