#include "sinks/alerts/alert_engine.h"

#include <algorithm>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace fragscope::sinks {
namespace {

using analysis::AlertState;
using std::chrono::seconds;

analysis::AlertTime T(int s) { return analysis::AlertTime(seconds(1'800'000'000 + s)); }

AlertConfig Config(std::string_view toml) {
  Result<AlertConfig> config = ParseAlertConfig(toml, "test.toml");
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  return config.ok() ? std::move(config).value() : AlertConfig{};
}

agent::AgentSample Sample(std::uint32_t pid, RiskLevel level, double frag = 0.1) {
  agent::AgentSample s;
  s.pid = pid;
  s.rank = static_cast<std::int32_t>(pid % 8);
  s.job = "llama";
  s.run = "run-1";
  s.device_uuid = "GPU-aaaa";
  s.step = 100;
  s.reserved_bytes = 8ull << 30;
  s.allocated_bytes = 5ull << 30;
  s.max_allocatable = 300ull << 20;
  s.fragmentation_ratio = frag;
  s.forecast_level = level;
  return s;
}

gpu::NodeGpuInfo Gpus(std::uint64_t used_bytes) {
  gpu::NodeGpuInfo node;
  gpu::GpuInfo g;
  g.uuid = "GPU-aaaa";
  g.index = 2;
  g.memory_total_bytes = 80ull << 30;
  g.memory_used_bytes = used_bytes;
  g.memory_free_bytes = (80ull << 30) - used_bytes;
  node.gpus.push_back(g);
  gpu::GpuInfo no_nvml;  // known from /proc only: no memory, so no GPU series
  no_nvml.uuid = "GPU-bbbb";
  node.gpus.push_back(no_nvml);
  return node;
}

TEST(AlertEngineTest, ForecastLevelRuleFiresPerProcessAndResolves) {
  AlertConfig config = Config(R"(
[[rules]]
name = "ForecastWarning"
metric = "forecast_level"
op = ">="
value = "warning"
for = "30s"
severity = "critical"
labels = { team = "ml" }
hooks = ["h"]
[hooks.h]
type = "exec"
command = ["/bin/true"]
)");
  AlertEngine engine(config.rules, "node-7");
  gpu::NodeGpuInfo gpus = Gpus(10ull << 30);
  auto n = engine.Evaluate(T(0), {Sample(1, RiskLevel::kWarning), Sample(2, RiskLevel::kOk)}, gpus);
  ASSERT_EQ(n.size(), 1u);
  EXPECT_EQ(n[0].state, AlertState::kPending);
  n = engine.Evaluate(T(30), {Sample(1, RiskLevel::kCritical), Sample(2, RiskLevel::kOk)}, gpus);
  ASSERT_EQ(n.size(), 1u);
  const AlertNotification& fired = n[0];
  EXPECT_EQ(fired.state, AlertState::kFiring);
  EXPECT_EQ(fired.rule, "ForecastWarning");
  EXPECT_EQ(fired.severity, "critical");
  EXPECT_EQ(*fired.value, 4);
  EXPECT_EQ(fired.series.at("pid"), "1");
  EXPECT_EQ(fired.series.at("rank"), "1");
  EXPECT_EQ(fired.series.at("gpu"), "2");  // joined with NVML by UUID
  EXPECT_EQ(fired.labels.at("team"), "ml");
  EXPECT_EQ(fired.labels.at("Hostname"), "node-7");
  EXPECT_EQ(fired.hooks, std::vector<std::string>{"h"});
  EXPECT_EQ(fired.for_duration, "30s");

  nlohmann::json j = nlohmann::json::parse(NotificationJson(fired));
  EXPECT_EQ(j["state"], "firing");
  EXPECT_EQ(j["series"]["job"], "llama");
  EXPECT_EQ(j["hostname"], "node-7");
  EXPECT_EQ(j["active_since"], "2027-01-15T08:00:00.000Z");
  EXPECT_EQ(j["at"], "2027-01-15T08:00:30.000Z");

  n = engine.Evaluate(T(40), {Sample(1, RiskLevel::kWatch), Sample(2, RiskLevel::kOk)}, gpus);
  ASSERT_EQ(n.size(), 1u);
  EXPECT_EQ(n[0].state, AlertState::kResolved);
  EXPECT_EQ(*n[0].value, 2);
}

// A rule on the daemon's risk, and the notification says where the risk comes from
// (issue 31 item 5); a series without a risk has no oom_risk value and no "why".
TEST(AlertEngineTest, OomRiskRuleCarriesWhereTheRiskComesFrom) {
  AlertConfig config = Config(R"(
[[rules]]
name = "OomRisk"
metric = "oom_risk"
op = ">="
value = 0.1
severity = "warning"
[[rules]]
name = "Level"
metric = "forecast_level"
op = ">="
value = "warning"
severity = "warning"
)");
  AlertEngine engine(config.rules, "node-7");
  agent::AgentSample risky = Sample(1, RiskLevel::kWarning);
  risky.oom_risk = {{50, 0.05}, {100, 0.23}, {500, 0.7}};
  risky.oom_risk_explanation = "step demand came within one spread of the limit 3 times";
  const agent::AgentSample own = Sample(2, RiskLevel::kWarning);  // the agent's own forecast
  const auto n = engine.Evaluate(T(0), {risky, own}, Gpus(10ull << 30));
  ASSERT_EQ(n.size(), 3u);  // OomRisk for pid 1; Level for pids 1 and 2
  EXPECT_EQ(n[0].rule, "OomRisk");
  EXPECT_EQ(n[0].series.at("pid"), "1");
  EXPECT_DOUBLE_EQ(*n[0].value, 0.23);  // the 100-step horizon
  const std::string why =
      "P(OOM within 100 steps) = 23%: step demand came within one spread of the limit 3 times";
  EXPECT_EQ(n[0].why, why);
  EXPECT_EQ(n[1].why, why);  // any rule on the series carries it
  EXPECT_EQ(n[2].series.at("pid"), "2");
  EXPECT_EQ(n[2].why, "");
  EXPECT_EQ(nlohmann::json::parse(NotificationJson(n[0]))["why"], why);
  EXPECT_FALSE(nlohmann::json::parse(NotificationJson(n[2])).contains("why"));
  const std::vector<std::string> env = NotificationEnvironment(n[0]);
  EXPECT_NE(std::find(env.begin(), env.end(), "FRAGSCOPE_ALERT_WHY=" + why), env.end());
}

TEST(AlertEngineTest, GpuMemoryRuleUsesNvmlSeries) {
  AlertConfig config = Config(R"(
[[rules]]
name = "GpuFull"
metric = "gpu_memory_used_ratio"
op = ">"
value = 0.9
)");
  AlertEngine engine(config.rules);
  EXPECT_TRUE(engine.Evaluate(T(0), {}, Gpus(40ull << 30)).empty());
  auto n = engine.Evaluate(T(1), {Sample(1, RiskLevel::kOk)}, Gpus(76ull << 30));
  ASSERT_EQ(n.size(), 1u);  // the GPU series only; process series have no NVML ratio
  EXPECT_EQ(n[0].series.at("device_uuid"), "GPU-aaaa");
  EXPECT_EQ(n[0].series.at("gpu"), "2");
  EXPECT_FALSE(n[0].series.contains("pid"));
  EXPECT_DOUBLE_EQ(*n[0].value, 0.95);
  // NVML gone (a GpuInfo without memory): the series vanishes and the alert resolves.
  gpu::NodeGpuInfo none;
  n = engine.Evaluate(T(2), {}, none);
  ASSERT_EQ(n.size(), 1u);
  EXPECT_EQ(n[0].state, AlertState::kResolved);
}

TEST(AlertEngineTest, ByteThresholdScopedByRank) {
  AlertConfig config = Config(R"(
[[rules]]
name = "Small"
metric = "max_allocatable"
op = "<"
value = "512MiB"
match = { rank = 1, job = "ll*" }
)");
  AlertEngine engine(config.rules);
  auto n = engine.Evaluate(T(0), {Sample(1, RiskLevel::kOk), Sample(2, RiskLevel::kOk)}, {});
  ASSERT_EQ(n.size(), 1u);
  EXPECT_EQ(n[0].series.at("rank"), "1");
  EXPECT_EQ(*n[0].value, 300.0 * 1024 * 1024);
}

TEST(AlertEngineTest, EnvironmentNamesEveryField) {
  AlertNotification n;
  n.rule = "R";
  n.state = AlertState::kResolved;
  n.severity = "info";
  n.threshold = 536870912;
  n.value = 0.5;
  n.series = {{"device_uuid", "GPU-1"}, {"pid", "7"}, {"rank", "-1"}, {"job", "j\nk"}};
  n.labels = {{"weird-label.name", std::string("v\0x", 3)}};
  std::vector<std::string> env = NotificationEnvironment(n);
  auto has = [&](const std::string& entry) {
    return std::find(env.begin(), env.end(), entry) != env.end();
  };
  EXPECT_TRUE(has("FRAGSCOPE_ALERT_NAME=R"));
  EXPECT_TRUE(has("FRAGSCOPE_ALERT_STATE=resolved"));
  EXPECT_TRUE(has("FRAGSCOPE_ALERT_SEVERITY=info"));
  EXPECT_TRUE(has("FRAGSCOPE_ALERT_THRESHOLD=536870912"));
  EXPECT_TRUE(has("FRAGSCOPE_ALERT_VALUE=0.5"));
  EXPECT_TRUE(has("FRAGSCOPE_ALERT_DEVICE_UUID=GPU-1"));
  EXPECT_TRUE(has("FRAGSCOPE_ALERT_PID=7"));
  EXPECT_TRUE(has("FRAGSCOPE_ALERT_RANK=-1"));
  EXPECT_TRUE(has("FRAGSCOPE_ALERT_JOB=j\nk"));
  EXPECT_TRUE(has("FRAGSCOPE_ALERT_LABEL_WEIRD_LABEL_NAME=vx"));
}

TEST(AlertEngineTest, InvalidUtf8InLabelsStillMakesJson) {
  AlertNotification n;
  n.rule = "R";
  n.series = {{"job", "bad\xff\xfe"}};
  nlohmann::json j = nlohmann::json::parse(NotificationJson(n));
  EXPECT_EQ(j["series"]["job"], "bad\xEF\xBF\xBD\xEF\xBF\xBD");
}

}  // namespace
}  // namespace fragscope::sinks
