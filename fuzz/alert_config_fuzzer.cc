// Fuzz target for ParseAlertConfig (the node daemon's TOML alert rules), with oracles:
//   * a rejected file gives kInvalidArgument and a message that starts with "fuzz.toml" (every
//     error names the file and, for anything past the TOML syntax, the line and key);
//   * an accepted config is consistent: unique rule names, known metrics, every hook a rule
//     names exists, increase windows only on counters, finite thresholds;
//   * its rules evaluate: an AlertEngine runs them over a few samples at advancing times
//     without crashing, and every transition names one of the rules.
//
// Built two ways: with libFuzzer (fuzz/CMakeLists.txt, preset "fuzz") and with replay_main.cc
// (alert_config_fuzz_replay, a ctest that runs fuzz/corpus/alert_config/).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <string_view>

#include "fragscope/status.h"
#include "sinks/alerts/alert_config.h"
#include "sinks/alerts/alert_engine.h"

namespace {

using fragscope::sinks::AlertConfig;
using fragscope::sinks::AlertMetricKind;

// A rules file is a few KiB; 16 KiB leaves room for many rules and long strings, and smaller
// inputs reach the parser faster.
constexpr std::size_t kMaxInputBytes = 16384;

void Check(bool ok, const std::string& what, std::string_view input) {
  if (ok) return;
  std::fprintf(stderr, "alert_config oracle failed: %s\ninput: %.*s\n", what.c_str(),
               static_cast<int>(input.size()), input.data());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > kMaxInputBytes) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  fragscope::Result<AlertConfig> parsed = fragscope::sinks::ParseAlertConfig(text, "fuzz.toml");
  if (!parsed.ok()) {
    const fragscope::Status& status = parsed.status();
    Check(status.code() == fragscope::StatusCode::kInvalidArgument,
          "unexpected code: " + status.ToString(), text);
    Check(status.message().rfind("fuzz.toml", 0) == 0, "error without file: " + status.message(),
          text);
    return 0;
  }
  std::set<std::string> names;
  for (const fragscope::analysis::AlertRule& rule : parsed->rules) {
    Check(names.insert(rule.name).second, "duplicate rule " + rule.name, text);
    const auto* info = fragscope::sinks::FindAlertMetric(rule.metric);
    Check(info != nullptr, "unknown metric " + rule.metric, text);
    Check(!rule.increase_window || info->kind == AlertMetricKind::kCounter,
          "increase on a non-counter", text);
    Check(std::isfinite(rule.threshold), "threshold not finite", text);
    for (const std::string& hook : rule.hooks) {
      Check(parsed->hooks.contains(hook), "dangling hook " + hook, text);
    }
    (void)fragscope::sinks::DescribeRule(rule);
  }

  fragscope::sinks::AlertEngine engine(parsed->rules, "fuzz");
  fragscope::agent::AgentSample sample;
  sample.pid = 1;
  sample.rank = 0;
  sample.job = "job";
  sample.device_uuid = "GPU-1";
  fragscope::gpu::NodeGpuInfo gpus;
  gpus.gpus.push_back({});
  gpus.gpus[0].uuid = "GPU-1";
  gpus.gpus[0].index = 0;
  gpus.gpus[0].memory_total_bytes = 100;
  auto now = fragscope::analysis::AlertTime(std::chrono::seconds(1'800'000'000));
  for (int i = 0; i < 8; ++i) {
    sample.forecast_level = static_cast<fragscope::RiskLevel>(i % 5);
    sample.fragmentation_ratio = 0.125 * i;
    sample.num_ooms = static_cast<std::uint64_t>(i / 2);
    sample.max_allocatable = std::uint64_t{1} << (i * 5);
    gpus.gpus[0].memory_used_bytes = static_cast<std::uint64_t>(i * 14);
    std::vector<fragscope::agent::AgentSample> samples;
    if (i != 6) samples.push_back(sample);  // the series vanishes once
    for (const auto& n : engine.Evaluate(now, samples, gpus)) {
      bool known = false;
      for (const auto& rule : parsed->rules) known = known || rule.name == n.rule;
      Check(known, "transition of an unknown rule " + n.rule, text);
      (void)fragscope::sinks::NotificationJson(n);
      (void)fragscope::sinks::NotificationEnvironment(n);
    }
    now += std::chrono::seconds(7 * i + 1);
  }
  return 0;
}
