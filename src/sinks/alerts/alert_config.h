// AlertConfig: the node daemon's alert rules, hooks and delivery limits, read from a TOML
// file (format and a complete example: docs/alerts.md, deploy/fragscope.toml.example).
//
// Every error names the place and the key: "rules.toml:12:7: rules[2].for: expected a
// duration like "30s", got 30". Unknown keys are errors too (a typo must not silently
// disable an alert).
//
// Thread safety: plain values and pure functions.
#ifndef FRAGSCOPE_SINKS_ALERTS_ALERT_CONFIG_H_
#define FRAGSCOPE_SINKS_ALERTS_ALERT_CONFIG_H_

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "analysis/alerts/alert_rule.h"
#include "fragscope/status.h"

namespace fragscope::sinks {

/// What a rule's metric measures; decides which threshold spellings are accepted.
enum class AlertMetricKind {
  kBytes,    // 1073741824 or "1GiB"
  kRatio,    // a number, usually in [0, 1]
  kCount,    // a number
  kCounter,  // cumulative; compare its value or, with increase_over, its increase
  kLevel,    // forecast level: "ok", "watch", "warning", "critical" (or 0..4)
};

struct AlertMetricInfo {
  std::string_view name;
  AlertMetricKind kind;
  bool per_gpu;  // from NVML (one series per GPU), else per process and device (agent)
  std::string_view help;
};
/// Every metric a rule may name, in documentation order.
const std::vector<AlertMetricInfo>& AlertMetrics();
const AlertMetricInfo* FindAlertMetric(std::string_view name);

/// How a hook delivers.
struct HookSpec {
  enum class Kind { kExec, kWebhook };
  std::string name;
  Kind kind = Kind::kExec;
  std::vector<std::string> command;            // kExec: argv; command[0] is an absolute path
  std::string url;                             // kWebhook: http://host[:port]/path or https://...
  std::map<std::string, std::string> headers;  // kWebhook: extra request headers
  analysis::AlertDuration timeout{10000};
  std::size_t max_output_bytes = 64 * 1024;  // kExec: stdout+stderr kept for the log
  std::string location;
};

/// Delivery limits: at most `per_rule_limit` notifications of one rule and `global_limit` of
/// all rules in any `rate_window`; the excess is counted and summarized, never queued.
struct DeliveryOptions {
  std::size_t per_rule_limit = 10;
  std::size_t global_limit = 60;
  analysis::AlertDuration rate_window{std::chrono::minutes(10)};
  std::size_t queue_capacity = 256;  // notifications waiting for the delivery thread
  bool dry_run = false;              // log what would be delivered; deliver nothing
};

struct AlertConfig {
  std::vector<analysis::AlertRule> rules;
  std::map<std::string, HookSpec> hooks;
  DeliveryOptions delivery;
};

/// Parses `text` (the contents of `path`; the path is only used in messages).
Result<AlertConfig> ParseAlertConfig(std::string_view text, std::string_view path);
/// Reads and parses the file at `path`.
Result<AlertConfig> LoadAlertConfig(const std::string& path);

/// "30s", "5m", "1h30m", "250ms", "2d"; nullopt for anything else (including negatives).
std::optional<analysis::AlertDuration> ParseAlertDuration(std::string_view text);
/// The shortest spelling ParseAlertDuration reads back ("90s" -> "1m30s").
std::string FormatAlertDuration(analysis::AlertDuration duration);

/// One line per rule, as `fragscope alerts check` prints it.
std::string DescribeRule(const analysis::AlertRule& rule);

}  // namespace fragscope::sinks

#endif  // FRAGSCOPE_SINKS_ALERTS_ALERT_CONFIG_H_
