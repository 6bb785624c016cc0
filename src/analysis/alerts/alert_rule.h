// AlertRule and AlertObservation: the plain data of fragscope's node-level alerting.
//
// A rule is one threshold ("fragmentation_ratio > 0.4 for 5m") on one metric of a series;
// an observation is what one series (a process on a device, or a GPU) looks like right now:
// identifying labels and metric values by name. The evaluator (alert_evaluator.h) keeps one
// state machine per (rule, series). Rules are read from TOML by sinks/alerts/alert_config.h;
// observations are built from agent samples and NVML facts by sinks/alerts/alert_engine.h,
// so this layer depends on neither. docs/alerts.md documents every metric name.
//
// Thread safety: plain values.
#ifndef FRAGSCOPE_ANALYSIS_ALERTS_ALERT_RULE_H_
#define FRAGSCOPE_ANALYSIS_ALERTS_ALERT_RULE_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fragscope::analysis {

using AlertClock = std::chrono::system_clock;
using AlertTime = AlertClock::time_point;
using AlertDuration = std::chrono::milliseconds;

enum class CompareOp { kGreater, kGreaterEqual, kLess, kLessEqual, kEqual, kNotEqual };

/// ">", ">=", "<", "<=", "==", "!=".
std::string_view CompareOpName(CompareOp op);
std::optional<CompareOp> ParseCompareOp(std::string_view text);
bool Compare(double value, CompareOp op, double threshold);

/// One alert rule. `match` scopes it: every entry must match the series label of that name
/// (a shell-style glob, fnmatch(3) without flags); a series without that label never matches.
struct AlertRule {
  std::string name;    // unique within a config; [A-Za-z0-9_.:-]+
  std::string metric;  // a metric name from docs/alerts.md ("fragmentation_ratio", ...)
  CompareOp op = CompareOp::kGreater;
  double threshold = 0;
  /// Set: the condition applies to the counter's increase over this window (a counter reset
  /// counts from zero), not to its value. Only for counters (num_ooms, num_alloc_retries).
  std::optional<AlertDuration> increase_window;
  AlertDuration for_duration{0};  // the condition must hold this long before the alert fires
  std::string severity = "warning";
  std::string summary;                        // free text for people; may be empty
  std::map<std::string, std::string> labels;  // extra labels copied into every alert
  std::map<std::string, std::string> match;   // series label -> glob
  std::vector<std::string> hooks;             // hook names (sinks/alerts/alert_config.h)
  bool send_resolved = true;                  // deliver the "resolved" notification too
  std::string location;                       // "file:line:column" of the rule, for messages
};

/// What one series looks like at one evaluation.
struct AlertObservation {
  /// Identity: equal labels = the same series. Process series carry device_uuid, pid, rank,
  /// job, run (and gpu, when NVML knows the device); GPU series carry device_uuid and gpu.
  std::map<std::string, std::string> labels;
  /// Metric values by name; a metric the series does not have is absent.
  std::map<std::string, double> values;
};

}  // namespace fragscope::analysis

#endif  // FRAGSCOPE_ANALYSIS_ALERTS_ALERT_RULE_H_
