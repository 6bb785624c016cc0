#include "analysis/check.h"

#include <gtest/gtest.h>

namespace fragscope::analysis {
namespace {

const CheckItem& Item(const std::vector<CheckItem>& items, std::string_view name) {
  for (const CheckItem& i : items) {
    if (i.name == name) return i;
  }
  ADD_FAILURE() << "no check named " << name;
  return items.front();
}

DeviceReport Report() {
  DeviceReport r;
  r.device = 2;
  r.peak_reserved = Extreme{1000, When{10, 5, -1}, true};
  r.worst_fragmentation = Extreme{300, When{20, 7, -1}, true};
  r.worst_fragmentation_ratio = 0.3;
  r.worst_fragmentation_min_reserved = 512;
  return r;
}

TEST(CheckTest, EveryCheckInItsOrderAndUnsetLimitsAreSkipped) {
  const DeviceReport r = Report();
  CheckDeviceInput in;
  in.report = &r;
  const std::vector<CheckItem> items = CheckDevice(in, CheckLimits{});
  ASSERT_EQ(items.size(), 6u);
  const char* names[] = {"oom",           "capacity", "peak_reserved",
                         "fragmentation", "forecast", "baseline"};
  for (std::size_t i = 0; i < items.size(); ++i) {
    EXPECT_EQ(items[i].name, names[i]);
    EXPECT_EQ(items[i].device, 2);
    EXPECT_EQ(items[i].outcome, i == 0 ? CheckOutcome::kPass : CheckOutcome::kSkipped) << i;
  }
}

TEST(CheckTest, LimitsAreInclusive) {
  const DeviceReport r = Report();
  CheckDeviceInput in;
  in.report = &r;
  CheckLimits limits;
  limits.max_peak_reserved = 1000;
  limits.max_fragmentation = 0.3;
  limits.capacity = 1000;
  std::vector<CheckItem> items = CheckDevice(in, limits);
  EXPECT_EQ(Item(items, "peak_reserved").outcome, CheckOutcome::kPass);
  EXPECT_EQ(Item(items, "fragmentation").outcome, CheckOutcome::kPass);
  EXPECT_EQ(Item(items, "capacity").outcome, CheckOutcome::kPass);
  limits.max_peak_reserved = 999;
  limits.max_fragmentation = 0.29;
  limits.used_by_others = 1;
  items = CheckDevice(in, limits);
  EXPECT_EQ(Item(items, "peak_reserved").outcome, CheckOutcome::kFail);
  EXPECT_EQ(Item(items, "fragmentation").outcome, CheckOutcome::kFail);
  EXPECT_EQ(Item(items, "fragmentation").measured,
            "0.30 at step 7 (over moments with at least 512 B reserved, half the peak)");
  EXPECT_EQ(Item(items, "capacity").outcome, CheckOutcome::kFail);
}

TEST(CheckTest, OomDiagnosisExplainsTheFailure) {
  DeviceReport r = Report();
  r.num_ooms = 2;
  OomDiagnosis o;
  o.step = 9;
  o.cause = OomCause::kFragmentation;
  o.requested = 3 << 20;
  o.needed = 4 << 20;
  o.free_unusable = 10 << 20;
  o.largest_free_block = 1 << 20;
  r.oom_diagnoses.push_back(o);
  CheckDeviceInput in;
  in.report = &r;
  const CheckItem item = Item(CheckDevice(in, CheckLimits{}), "oom");
  EXPECT_EQ(item.outcome, CheckOutcome::kFail);
  EXPECT_EQ(item.measured, "2 OOMs, the first at step 9");
  EXPECT_NE(item.detail.find("fragmentation: 3.0 MiB requested"), std::string::npos) << item.detail;
}

TEST(CheckTest, ForecastFailsAtTheChosenLevel) {
  DeviceReport r = Report();
  DeviceForecast f;
  f.enough_data = true;
  f.worst = RiskLevel::kWarning;
  f.changes = {
      ForecastPoint{0, RiskLevel::kOk, std::nullopt, "fine", std::nullopt},
      ForecastPoint{40, RiskLevel::kWarning, 12, "largest free block shrinks", std::nullopt},
      ForecastPoint{90, RiskLevel::kWatch, std::nullopt, "calmer", std::nullopt}};
  r.forecast = f;
  CheckDeviceInput in;
  in.report = &r;
  CheckLimits limits;
  EXPECT_EQ(Item(CheckDevice(in, limits), "forecast").outcome, CheckOutcome::kPass);
  limits.fail_at_level = RiskLevel::kWarning;
  const CheckItem item = Item(CheckDevice(in, limits), "forecast");
  EXPECT_EQ(item.outcome, CheckOutcome::kFail);
  EXPECT_EQ(item.measured, "warning at step 40 (~12 steps to OOM)");
  EXPECT_EQ(item.detail, "largest free block shrinks");
  limits.fail_at_level = RiskLevel::kUnknown;  // --fail-at never
  EXPECT_EQ(Item(CheckDevice(in, limits), "forecast").outcome, CheckOutcome::kSkipped);
  r.forecast->enough_data = false;  // a single step: no verdict, not a failure
  limits.fail_at_level = RiskLevel::kWatch;
  EXPECT_EQ(Item(CheckDevice(in, limits), "forecast").outcome, CheckOutcome::kSkipped);
}

TEST(CheckTest, OomRiskLimitFailsTheForecast) {
  DeviceReport r = Report();
  DeviceForecast f;
  f.enough_data = true;
  f.worst = RiskLevel::kWatch;
  ForecastPoint p{70, RiskLevel::kWatch, std::nullopt, "watch", std::nullopt};
  p.risk = OomRisk{};
  p.risk->horizons = {{50, 0.05}, {100, 0.2}, {500, 0.6}};
  p.risk->advice = "cap step shapes";
  f.changes = {p};
  f.riskiest = p;
  r.forecast = f;
  CheckDeviceInput in;
  in.report = &r;
  CheckLimits limits;
  limits.fail_at_level = RiskLevel::kUnknown;  // --fail-at never: only the risk limit
  limits.max_oom_risk = 0.1;
  CheckItem item = Item(CheckDevice(in, limits), "forecast");
  EXPECT_EQ(item.outcome, CheckOutcome::kFail);
  EXPECT_NE(item.measured.find("P(OOM within 100 steps) up to 20.0% at step 70"), std::string::npos)
      << item.measured;
  EXPECT_NE(item.detail.find("cap step shapes"), std::string::npos) << item.detail;
  limits.max_oom_risk = 0.3;
  EXPECT_EQ(Item(CheckDevice(in, limits), "forecast").outcome, CheckOutcome::kPass);
  limits.max_oom_risk.reset();
  EXPECT_EQ(Item(CheckDevice(in, limits), "forecast").outcome, CheckOutcome::kSkipped);
}

TEST(CheckTest, AskedForChecksWithoutTheirInputFailUnlessAllowed) {
  DeviceReport r = Report();
  r.worst_fragmentation.seen = false;  // the device never reserved memory
  DeviceForecast f;
  f.enough_data = false;  // too few steps
  f.notes = {"5 steps; the forecast needs 20"};
  r.forecast = f;
  CheckDeviceInput in;
  in.report = &r;
  CheckLimits limits;
  limits.max_fragmentation = 0.3;
  // The default --fail-at alone does not fail a short run; a fragmentation limit does.
  std::vector<CheckItem> items = CheckDevice(in, limits);
  EXPECT_EQ(Item(items, "forecast").outcome, CheckOutcome::kSkipped);
  EXPECT_EQ(Item(items, "fragmentation").outcome, CheckOutcome::kFail);
  EXPECT_NE(Item(items, "fragmentation").detail.find("--allow-missing"), std::string::npos);
  limits.forecast_asked = true;  // --fail-at warning given
  items = CheckDevice(in, limits);
  EXPECT_EQ(Item(items, "forecast").outcome, CheckOutcome::kFail);
  EXPECT_NE(Item(items, "forecast").detail.find("5 steps"), std::string::npos);
  limits.allow_missing = true;
  items = CheckDevice(in, limits);
  EXPECT_EQ(Item(items, "forecast").outcome, CheckOutcome::kSkipped);
  EXPECT_EQ(Item(items, "fragmentation").outcome, CheckOutcome::kSkipped);
  EXPECT_NE(Item(items, "fragmentation").detail.find("skipped (--allow-missing)"),
            std::string::npos);
}

TEST(CheckTest, AnOomRiskLimitWithoutARiskFailsUnlessAllowed) {
  DeviceReport r = Report();
  DeviceForecast f;
  f.enough_data = true;
  f.worst = RiskLevel::kOk;
  f.last = ForecastPoint{70, RiskLevel::kOk, std::nullopt, "fine", std::nullopt};  // no risk
  r.forecast = f;
  CheckDeviceInput in;
  in.report = &r;
  CheckLimits limits;
  limits.max_oom_risk = 0.1;
  limits.forecast_asked = true;
  EXPECT_EQ(Item(CheckDevice(in, limits), "forecast").outcome, CheckOutcome::kFail);
  limits.allow_missing = true;  // the level's verdict stands
  EXPECT_EQ(Item(CheckDevice(in, limits), "forecast").outcome, CheckOutcome::kPass);
}

TEST(CheckTest, BaselineFailsOnGrowthOrPeak) {
  const DeviceReport r = Report();
  CheckDeviceInput in;
  in.report = &r;
  BaselineComparison b;
  b.has_baseline = true;
  b.runs = 5;
  b.growth_ratio = 1.5;
  b.peak_allocated_ratio = 1.10;
  b.sentence = "fragmenting 1.5x faster";
  in.baseline = b;
  CheckLimits limits;  // 1.5x and +10% are the limits themselves: pass
  EXPECT_EQ(Item(CheckDevice(in, limits), "baseline").outcome, CheckOutcome::kPass);
  in.baseline->growth_ratio = 1.51;
  EXPECT_EQ(Item(CheckDevice(in, limits), "baseline").outcome, CheckOutcome::kFail);
  in.baseline->growth_ratio.reset();
  in.baseline->peak_allocated_ratio = 1.2;
  EXPECT_EQ(Item(CheckDevice(in, limits), "baseline").outcome, CheckOutcome::kFail);
  // No earlier runs: the gate fails rather than turn itself off, unless told it is a first run.
  in.baseline->has_baseline = false;
  EXPECT_EQ(Item(CheckDevice(in, limits), "baseline").outcome, CheckOutcome::kFail);
  EXPECT_NE(Item(CheckDevice(in, limits), "baseline").detail.find("--allow-new-baseline"),
            std::string::npos);
  limits.allow_new_baseline = true;
  EXPECT_EQ(Item(CheckDevice(in, limits), "baseline").outcome, CheckOutcome::kSkipped);
}

TEST(CheckTest, ResultCountsFailures) {
  CheckResult result;
  EXPECT_TRUE(result.passed());
  result.items.push_back(CheckItem{0, "oom", CheckOutcome::kFail, "", "", ""});
  result.items.push_back(CheckItem{0, "baseline", CheckOutcome::kSkipped, "", "", ""});
  EXPECT_EQ(result.failed(), 1u);
  EXPECT_FALSE(result.passed());
}

}  // namespace
}  // namespace fragscope::analysis
