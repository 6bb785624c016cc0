#include "analysis/run_summary.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace fragscope::analysis {
namespace {

// A device whose fragmentation ratio is `slope_per_step * step` at the end of each step
// 0..last_step, one timeline row per `rows_per` steps.
DeviceReport Device(std::int32_t id, std::int64_t last_step, double slope_per_step,
                    std::int64_t steps_per_row = 1) {
  DeviceReport d;
  d.device = id;
  d.peak_allocated.bytes = 1000;
  d.peak_reserved.bytes = 2000;
  d.requests.count = 7;
  d.requests.p50 = 512;
  d.requests.p90 = 4096;
  d.requests.p99 = 1 << 20;
  d.requests.max = 1 << 21;
  d.num_ooms = 2;
  for (std::int64_t s = 0; s <= last_step; s += steps_per_row) {
    TimelineSample row;
    row.step_first = s;
    row.step_last = std::min(last_step, s + steps_per_row - 1);
    row.fragmentation_ratio = slope_per_step * static_cast<double>(row.step_last);
    d.timeline.push_back(row);
  }
  return d;
}

AnalysisResult Result1(DeviceReport d) {
  AnalysisResult r;
  r.source = "run.jsonl";
  r.kind = TraceKind::kAllocator;
  r.steps = static_cast<std::uint64_t>(d.timeline.empty() ? 0 : d.timeline.back().step_last + 1);
  r.devices.push_back(std::move(d));
  return r;
}

TEST(StepMarksTest, OneTwoFiveSequenceUpToTheLastStep) {
  EXPECT_EQ(StepMarks(1200), (std::vector<std::int64_t>{10, 20, 50, 100, 200, 500, 1000}));
  EXPECT_EQ(StepMarks(10), (std::vector<std::int64_t>{10}));
  EXPECT_TRUE(StepMarks(9).empty());
  EXPECT_TRUE(StepMarks(-1).empty());
  EXPECT_EQ(StepMarks(INT64_MAX).back(), 5'000'000'000'000'000'000);
}

TEST(SummarizeRunTest, PeaksProfileMarksAndGrowth) {
  Result<RunSummary> s = SummarizeRun(Result1(Device(0, 120, 0.001)), -1);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->source, "run.jsonl");
  EXPECT_EQ(s->steps, 121u);
  EXPECT_EQ(s->peak_allocated_bytes, 1000u);
  EXPECT_EQ(s->peak_reserved_bytes, 2000u);
  EXPECT_EQ(s->request_count, 7u);
  EXPECT_EQ(s->request_p50_bytes, 512u);
  EXPECT_EQ(s->request_p90_bytes, 4096u);
  EXPECT_EQ(s->request_p99_bytes, 1u << 20);
  EXPECT_EQ(s->request_max_bytes, 1u << 21);
  EXPECT_EQ(s->num_ooms, 2u);
  ASSERT_EQ(s->marks.size(), 4u);  // 10, 20, 50, 100
  EXPECT_EQ(s->marks[0].step, 10);
  EXPECT_DOUBLE_EQ(s->marks[0].fragmentation_ratio, 0.010);
  EXPECT_EQ(s->marks[3].step, 100);
  EXPECT_DOUBLE_EQ(s->marks[3].fragmentation_ratio, 0.100);
  ASSERT_TRUE(s->fragmentation_growth_per_1000_steps.has_value());
  EXPECT_NEAR(*s->fragmentation_growth_per_1000_steps, 1.0, 1e-9);
}

TEST(SummarizeRunTest, DownsampledRowsCoverTheirMarks) {
  // Rows of 8 steps: the mark at step 10 falls in the row 8..15, whose end ratio it takes.
  Result<RunSummary> s = SummarizeRun(Result1(Device(0, 63, 0.002, 8)), 0);
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(s->marks.size(), 3u);
  EXPECT_EQ(s->marks[0].step, 10);
  EXPECT_DOUBLE_EQ(s->marks[0].fragmentation_ratio, 0.002 * 15);
  EXPECT_EQ(s->marks[2].step, 50);
  EXPECT_DOUBLE_EQ(s->marks[2].fragmentation_ratio, 0.002 * 55);
  EXPECT_NEAR(*s->fragmentation_growth_per_1000_steps, 2.0, 1e-9);
}

TEST(SummarizeRunTest, PicksTheDeviceWithTheHighestPeakReserved) {
  AnalysisResult r = Result1(Device(0, 20, 0.001));
  DeviceReport big = Device(3, 20, 0.001);
  big.peak_reserved.bytes = 9999;
  r.devices.push_back(big);
  Result<RunSummary> s = SummarizeRun(r, -1);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->device, 3);
  Result<RunSummary> zero = SummarizeRun(r, 0);
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(zero->device, 0);
  Result<RunSummary> missing = SummarizeRun(r, 5);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("device 5"), std::string::npos);
}

TEST(SummarizeRunTest, RequestTraceIsRefused) {
  AnalysisResult r = Result1(Device(0, 20, 0.001));
  r.kind = TraceKind::kRequest;
  Result<RunSummary> s = SummarizeRun(r, -1);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("replay"), std::string::npos);
}

TEST(SummarizeRunTest, EventWindowsGiveNoMarksAndNoGrowth) {
  AnalysisResult r = Result1(Device(0, 200, 0.001));
  r.timeline_unit = "events";
  for (TimelineSample& row : r.devices[0].timeline) row.step_first = row.step_last = -1;
  Result<RunSummary> s = SummarizeRun(r, -1);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->marks.empty());
  EXPECT_FALSE(s->fragmentation_growth_per_1000_steps.has_value());
  EXPECT_EQ(s->peak_reserved_bytes, 2000u);
}

TEST(SummarizeRunTest, SingleStepHasNoGrowth) {
  Result<RunSummary> s = SummarizeRun(Result1(Device(0, 0, 0.001)), -1);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->marks.empty());
  EXPECT_FALSE(s->fragmentation_growth_per_1000_steps.has_value());
}

RunSummary MakeRun(std::string name, double growth, std::vector<FragmentationMark> marks,
                   std::uint64_t peak = 1000) {
  RunSummary r;
  r.run = std::move(name);
  r.architecture = "gpt-1.3b";
  r.peak_allocated_bytes = peak;
  r.peak_reserved_bytes = peak * 2;
  r.fragmentation_growth_per_1000_steps = growth;
  r.marks = std::move(marks);
  return r;
}

TEST(CompareWithBaselineTest, FasterThanTheLastFiveRuns) {
  std::vector<RunSummary> base;
  for (int i = 0; i < 5; ++i) {
    base.push_back(MakeRun("old" + std::to_string(i), 0.1, {{10, 0.05}, {100, 0.10}}, 1000));
  }
  RunSummary now = MakeRun("new", 0.23, {{10, 0.05}, {100, 0.20}, {1000, 0.3}}, 1100);
  BaselineComparison c = CompareWithBaseline(now, base);
  EXPECT_TRUE(c.has_baseline);
  EXPECT_EQ(c.runs, 5u);
  ASSERT_TRUE(c.growth_ratio.has_value());
  EXPECT_NEAR(*c.growth_ratio, 2.3, 1e-9);
  EXPECT_EQ(c.sentence.rfind("fragmenting 2.3× faster than the last 5 runs of gpt-1.3b", 0), 0u)
      << c.sentence;
  EXPECT_NE(c.sentence.find("peak allocated 1.1× theirs"), std::string::npos) << c.sentence;
  ASSERT_EQ(c.marks.size(), 2u);  // step 1000 has no baseline
  EXPECT_EQ(c.marks[1].step, 100);
  EXPECT_DOUBLE_EQ(c.marks[1].baseline, 0.10);
  EXPECT_EQ(c.marks[1].baseline_runs, 5u);
  EXPECT_NEAR(*c.mark_ratio, (1.0 + 2.0) / 2, 1e-12);
  EXPECT_NEAR(*c.peak_allocated_ratio, 1.1, 1e-12);
}

TEST(CompareWithBaselineTest, SlowerAndSameRate) {
  std::vector<RunSummary> base = {MakeRun("a", 0.4, {}), MakeRun("b", 0.2, {})};
  BaselineComparison slower = CompareWithBaseline(MakeRun("n", 0.1, {}), base);
  EXPECT_EQ(slower.sentence.rfind("fragmenting 3.0× slower than the last 2 runs of gpt-1.3b", 0),
            0u)
      << slower.sentence;
  BaselineComparison same = CompareWithBaseline(MakeRun("n", 0.3, {}), base);
  EXPECT_EQ(same.sentence.rfind("fragmenting at the same rate as the last 2 runs", 0), 0u)
      << same.sentence;
}

TEST(CompareWithBaselineTest, NoRunsMeansNoBaseline) {
  BaselineComparison c = CompareWithBaseline(MakeRun("n", 0.1, {{10, 0.1}}), {});
  EXPECT_FALSE(c.has_baseline);
  EXPECT_EQ(c.runs, 0u);
  EXPECT_EQ(c.sentence, "no baseline for gpt-1.3b: no earlier runs are recorded");
}

TEST(CompareWithBaselineTest, ARunIsNotItsOwnBaseline) {
  std::vector<RunSummary> base = {MakeRun("n", 0.1, {{10, 0.1}})};
  BaselineComparison c = CompareWithBaseline(MakeRun("n", 0.1, {{10, 0.1}}), base);
  EXPECT_FALSE(c.has_baseline);
  EXPECT_EQ(c.runs, 0u);
}

TEST(CompareWithBaselineTest, NoCommonMarksAndNoGrowth) {
  RunSummary old = MakeRun("a", 0, {{10, 0.1}});
  old.fragmentation_growth_per_1000_steps.reset();
  RunSummary now = MakeRun("n", 0, {{20, 0.1}});
  now.fragmentation_growth_per_1000_steps.reset();
  std::vector<RunSummary> base = {old};
  BaselineComparison c = CompareWithBaseline(now, base);
  EXPECT_FALSE(c.has_baseline);
  EXPECT_EQ(c.sentence.rfind("no fragmentation baseline for gpt-1.3b: the last run of gpt-1.3b "
                             "share",
                             0),
            0u)
      << c.sentence;
}

TEST(CompareWithBaselineTest, FlatBaselineGivesNoRatio) {
  std::vector<RunSummary> base = {MakeRun("a", 0.0, {{10, 0.1}})};
  BaselineComparison c = CompareWithBaseline(MakeRun("n", 0.05, {{10, 0.1}}), base);
  EXPECT_TRUE(c.has_baseline);
  EXPECT_FALSE(c.growth_ratio.has_value());
  EXPECT_EQ(c.sentence.rfind("fragmenting (+0.050 per 1000 steps) while the last run of gpt-1.3b "
                             "stayed flat",
                             0),
            0u)
      << c.sentence;
}

TEST(CompareWithBaselineTest, MarksOnlyWhenGrowthIsUnknown) {
  RunSummary old = MakeRun("a", 0, {{10, 0.1}, {20, 0.2}});
  old.fragmentation_growth_per_1000_steps.reset();
  RunSummary now = MakeRun("n", 0, {{10, 0.2}, {20, 0.4}});
  std::vector<RunSummary> base = {old};
  BaselineComparison c = CompareWithBaseline(now, base);
  EXPECT_TRUE(c.has_baseline);
  EXPECT_NEAR(*c.mark_ratio, 2.0, 1e-12);
  EXPECT_EQ(c.sentence.rfind("fragmentation at the common step marks is 2.0× that of the last run "
                             "of gpt-1.3b (0.400 vs 0.200 at step 20)",
                             0),
            0u)
      << c.sentence;
}

}  // namespace
}  // namespace fragscope::analysis
