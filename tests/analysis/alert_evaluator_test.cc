#include "analysis/alerts/alert_evaluator.h"

#include <gtest/gtest.h>

namespace fragscope::analysis {
namespace {

using std::chrono::seconds;

// A fake clock: seconds since an arbitrary epoch.
AlertTime T(int s) { return AlertTime(seconds(1'800'000'000 + s)); }

AlertRule Rule(std::string name, std::string metric, CompareOp op, double threshold,
               int for_seconds = 0) {
  AlertRule r;
  r.name = std::move(name);
  r.metric = std::move(metric);
  r.op = op;
  r.threshold = threshold;
  r.for_duration = seconds(for_seconds);
  return r;
}

AlertObservation Series(std::string pid, std::map<std::string, double> values,
                        std::string job = "train") {
  AlertObservation o;
  o.labels = {{"pid", std::move(pid)}, {"job", std::move(job)}, {"device_uuid", "GPU-1"}};
  o.values = std::move(values);
  return o;
}

std::vector<AlertState> States(const std::vector<AlertTransition>& ts) {
  std::vector<AlertState> out;
  for (const auto& t : ts) out.push_back(t.state);
  return out;
}

TEST(AlertEvaluatorTest, ForDurationMustHoldContinuously) {
  AlertEvaluator e({Rule("frag", "fragmentation_ratio", CompareOp::kGreater, 0.4, 60)});
  EXPECT_TRUE(e.Evaluate(T(0), {Series("1", {{"fragmentation_ratio", 0.3}})}).empty());
  EXPECT_EQ(States(e.Evaluate(T(10), {Series("1", {{"fragmentation_ratio", 0.5}})})),
            std::vector<AlertState>{AlertState::kPending});
  EXPECT_TRUE(e.Evaluate(T(60), {Series("1", {{"fragmentation_ratio", 0.5}})}).empty());
  // Dips below for one evaluation: the clock starts again.
  EXPECT_TRUE(e.Evaluate(T(65), {Series("1", {{"fragmentation_ratio", 0.1}})}).empty());
  EXPECT_EQ(e.active_count(), 0u);
  EXPECT_EQ(States(e.Evaluate(T(70), {Series("1", {{"fragmentation_ratio", 0.5}})})),
            std::vector<AlertState>{AlertState::kPending});
  EXPECT_TRUE(e.Evaluate(T(129), {Series("1", {{"fragmentation_ratio", 0.5}})}).empty());
  auto fired = e.Evaluate(T(130), {Series("1", {{"fragmentation_ratio", 0.6}})});
  ASSERT_EQ(States(fired), std::vector<AlertState>{AlertState::kFiring});
  EXPECT_EQ(fired[0].active_since, T(70));
  EXPECT_EQ(fired[0].at, T(130));
  EXPECT_DOUBLE_EQ(*fired[0].value, 0.6);
  EXPECT_EQ(fired[0].labels.at("alertname"), "frag");
  EXPECT_EQ(fired[0].labels.at("pid"), "1");
  // Still firing: no new transition.
  EXPECT_TRUE(e.Evaluate(T(200), {Series("1", {{"fragmentation_ratio", 0.6}})}).empty());
  ASSERT_EQ(e.Firing().size(), 1u);
  auto resolved = e.Evaluate(T(210), {Series("1", {{"fragmentation_ratio", 0.2}})});
  ASSERT_EQ(States(resolved), std::vector<AlertState>{AlertState::kResolved});
  EXPECT_DOUBLE_EQ(*resolved[0].value, 0.2);
  EXPECT_TRUE(e.Firing().empty());
}

TEST(AlertEvaluatorTest, ZeroForFiresAtOnceWithoutPending) {
  AlertEvaluator e({Rule("lvl", "forecast_level", CompareOp::kGreaterEqual, 3)});
  EXPECT_EQ(States(e.Evaluate(T(0), {Series("1", {{"forecast_level", 3}})})),
            std::vector<AlertState>{AlertState::kFiring});
}

TEST(AlertEvaluatorTest, SeriesAreIndependentAndVanishingSeriesResolve) {
  AlertEvaluator e({Rule("lvl", "forecast_level", CompareOp::kGreaterEqual, 3)});
  auto t =
      e.Evaluate(T(0), {Series("1", {{"forecast_level", 4}}), Series("2", {{"forecast_level", 1}}),
                        Series("3", {{"forecast_level", 3}})});
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].series.at("pid"), "1");
  EXPECT_EQ(t[1].series.at("pid"), "3");
  // pid 3's agent is gone: its alert resolves; pid 1 keeps firing silently.
  t = e.Evaluate(T(10), {Series("1", {{"forecast_level", 4}})});
  ASSERT_EQ(States(t), std::vector<AlertState>{AlertState::kResolved});
  EXPECT_EQ(t[0].series.at("pid"), "3");
  EXPECT_EQ(e.active_count(), 1u);
}

TEST(AlertEvaluatorTest, MissingMetricIsNotAnAlertAndPendingIsForgottenSilently) {
  AlertEvaluator e({Rule("oom", "steps_to_oom", CompareOp::kLess, 100, 30)});
  EXPECT_TRUE(e.Evaluate(T(0), {Series("1", {})}).empty());
  EXPECT_EQ(States(e.Evaluate(T(1), {Series("1", {{"steps_to_oom", 50}})})),
            std::vector<AlertState>{AlertState::kPending});
  EXPECT_TRUE(e.Evaluate(T(2), {Series("1", {})}).empty());  // forecast gone: no notice
  EXPECT_EQ(e.active_count(), 0u);
  EXPECT_EQ(States(e.Evaluate(T(3), {Series("1", {{"steps_to_oom", 50}})})),
            std::vector<AlertState>{AlertState::kPending});
  EXPECT_TRUE(e.Evaluate(T(4), {}).empty());  // series gone while pending: no notice
  EXPECT_EQ(e.active_count(), 0u);
}

TEST(AlertEvaluatorTest, MatchScopesByGlob) {
  AlertRule r = Rule("lvl", "forecast_level", CompareOp::kGreaterEqual, 3);
  r.match = {{"job", "llama-*"}};
  AlertEvaluator e({r});
  auto t = e.Evaluate(T(0), {Series("1", {{"forecast_level", 4}}, "llama-70b"),
                             Series("2", {{"forecast_level", 4}}, "bert"),
                             Series("3", {{"forecast_level", 4}}, "xllama-1")});
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].series.at("job"), "llama-70b");
  // A label the series lacks never matches.
  AlertRule r2 = Rule("lvl", "forecast_level", CompareOp::kGreaterEqual, 3);
  r2.match = {{"gpu", "*"}};
  AlertEvaluator e2({r2});
  EXPECT_TRUE(e2.Evaluate(T(0), {Series("1", {{"forecast_level", 4}})}).empty());
}

TEST(AlertEvaluatorTest, IncreaseOverWindowWithCounterReset) {
  AlertRule r = Rule("ooms", "num_ooms", CompareOp::kGreater, 0);
  r.increase_window = seconds(60);
  AlertEvaluator e({r});
  // A process that starts with OOMs already counted is not an increase.
  EXPECT_TRUE(e.Evaluate(T(0), {Series("1", {{"num_ooms", 3}})}).empty());
  EXPECT_TRUE(e.Evaluate(T(30), {Series("1", {{"num_ooms", 3}})}).empty());
  auto t = e.Evaluate(T(40), {Series("1", {{"num_ooms", 5}})});
  ASSERT_EQ(States(t), std::vector<AlertState>{AlertState::kFiring});
  EXPECT_DOUBLE_EQ(*t[0].value, 2);
  // The increase at T(40) stays inside the 60 s window until T(100).
  EXPECT_TRUE(e.Evaluate(T(90), {Series("1", {{"num_ooms", 5}})}).empty());
  t = e.Evaluate(T(101), {Series("1", {{"num_ooms", 5}})});
  ASSERT_EQ(States(t), std::vector<AlertState>{AlertState::kResolved});
  EXPECT_DOUBLE_EQ(*t[0].value, 0);
  // A reset (5 -> 1) counts as an increase of 1.
  t = e.Evaluate(T(110), {Series("1", {{"num_ooms", 1}})});
  ASSERT_EQ(States(t), std::vector<AlertState>{AlertState::kFiring});
  EXPECT_DOUBLE_EQ(*t[0].value, 1);
}

TEST(AlertEvaluatorTest, ClockGoingBackwardsNeverFiresEarly) {
  AlertEvaluator e({Rule("frag", "fragmentation_ratio", CompareOp::kGreater, 0.4, 60)});
  EXPECT_EQ(e.Evaluate(T(100), {Series("1", {{"fragmentation_ratio", 0.5}})}).size(), 1u);
  EXPECT_TRUE(e.Evaluate(T(0), {Series("1", {{"fragmentation_ratio", 0.5}})}).empty());
  EXPECT_TRUE(e.Evaluate(T(159), {Series("1", {{"fragmentation_ratio", 0.5}})}).empty());
  EXPECT_EQ(States(e.Evaluate(T(160), {Series("1", {{"fragmentation_ratio", 0.5}})})),
            std::vector<AlertState>{AlertState::kFiring});
}

TEST(AlertEvaluatorTest, CompareOps) {
  EXPECT_TRUE(Compare(2, CompareOp::kGreater, 1));
  EXPECT_FALSE(Compare(1, CompareOp::kGreater, 1));
  EXPECT_TRUE(Compare(1, CompareOp::kGreaterEqual, 1));
  EXPECT_TRUE(Compare(0, CompareOp::kLess, 1));
  EXPECT_TRUE(Compare(1, CompareOp::kLessEqual, 1));
  EXPECT_TRUE(Compare(1, CompareOp::kEqual, 1));
  EXPECT_TRUE(Compare(2, CompareOp::kNotEqual, 1));
  for (std::string_view s : {">", ">=", "<", "<=", "==", "!="}) {
    ASSERT_TRUE(ParseCompareOp(s).has_value()) << s;
    EXPECT_EQ(CompareOpName(*ParseCompareOp(s)), s);
  }
  EXPECT_FALSE(ParseCompareOp("=>").has_value());
}

}  // namespace
}  // namespace fragscope::analysis
