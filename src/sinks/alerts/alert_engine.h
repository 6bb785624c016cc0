// AlertEngine: the daemon's alert rules over what it knows right now (the latest sample of
// every agent, NVML's view of every GPU), and AlertNotification, what a hook receives.
//
// The engine turns samples and GPUs into series (analysis/alerts/alert_rule.h), runs the
// evaluator and returns its transitions as notifications; delivering them is HookRunner's
// job (hook_runner.h). docs/alerts.md describes the series, labels and JSON.
//
// Thread safety: not thread-safe; call Evaluate from one thread (the daemon's tick).
#ifndef FRAGSCOPE_SINKS_ALERTS_ALERT_ENGINE_H_
#define FRAGSCOPE_SINKS_ALERTS_ALERT_ENGINE_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "analysis/alerts/alert_evaluator.h"
#include "sinks/alerts/alert_config.h"
#include "sources/agent/agent_sample.h"
#include "sources/gpu/gpu_info.h"

namespace fragscope::sinks {

/// One alert state change to deliver: self-contained (no pointers into the engine), so it can
/// cross to the delivery thread.
struct AlertNotification {
  std::string rule;
  analysis::AlertState state = analysis::AlertState::kFiring;  // pending, firing or resolved
  std::string severity;
  std::string summary;
  std::string metric;
  std::string op;
  double threshold = 0;
  std::optional<std::string> increase_over;  // "10m" for increase rules
  std::optional<double> value;
  std::string for_duration;                   // "5m"
  std::map<std::string, std::string> labels;  // alertname, severity, rule labels, series
  std::map<std::string, std::string> series;  // device_uuid, gpu, pid, rank, job, run
  analysis::AlertTime active_since;
  analysis::AlertTime at;
  std::vector<std::string> hooks;  // where to deliver
  bool send_resolved = true;
  std::string hostname;  // the node's name, when the engine was given one
  /// Where the process series' OOM risk comes from, when the daemon computed one for its
  /// latest sample (issue 31 item 5): "P(OOM within 100 steps) = 23%: <the risk's one line>".
  std::string why;
};

/// The notification as JSON (docs/alerts.md, "What a hook receives").
std::string NotificationJson(const AlertNotification& n);
/// Its FRAGSCOPE_ALERT_* environment, as NAME=value strings (docs/alerts.md).
std::vector<std::string> NotificationEnvironment(const AlertNotification& n);

/// The series of one agent sample: labels and metric values by AlertMetrics() name.
analysis::AlertObservation ObserveSample(const agent::AgentSample& sample,
                                         const gpu::NodeGpuInfo& gpus);
/// The series of one GPU (NVML memory); nullopt when NVML reported no memory for it.
std::optional<analysis::AlertObservation> ObserveGpu(const gpu::GpuInfo& gpu);

class AlertEngine {
 public:
  explicit AlertEngine(std::vector<analysis::AlertRule> rules, std::string hostname = "");

  /// Evaluates every rule at `now` (the caller's clock: the daemon passes system_clock::now(),
  /// tests a fake one) against the latest sample of every live agent and the GPUs, and
  /// returns the state changes: pending (informational), firing and resolved.
  std::vector<AlertNotification> Evaluate(analysis::AlertTime now,
                                          const std::vector<agent::AgentSample>& latest,
                                          const gpu::NodeGpuInfo& gpus);

  const analysis::AlertEvaluator& evaluator() const { return evaluator_; }

 private:
  analysis::AlertEvaluator evaluator_;
  std::string hostname_;
};

}  // namespace fragscope::sinks

#endif  // FRAGSCOPE_SINKS_ALERTS_ALERT_ENGINE_H_
