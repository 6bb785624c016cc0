#include "sinks/alerts/alert_engine.h"

#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace fragscope::sinks {

using analysis::AlertObservation;

namespace {

std::int64_t UnixMs(analysis::AlertTime t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

// RFC 3339 UTC with milliseconds: "2026-11-22T06:30:00.250Z".
std::string Rfc3339(analysis::AlertTime t) {
  std::int64_t ms = UnixMs(t);
  std::time_t seconds = static_cast<std::time_t>(ms >= 0 ? ms / 1000 : (ms - 999) / 1000);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z", tm.tm_year + 1900, tm.tm_mon + 1,
                     tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ((ms % 1000) + 1000) % 1000);
}

std::string FormatValue(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 9e15) {
    return fmt::format("{}", static_cast<std::int64_t>(v));
  }
  return fmt::format("{}", v);
}

const gpu::GpuInfo* FindGpu(const gpu::NodeGpuInfo& gpus, const std::string& uuid) {
  if (uuid.empty()) return nullptr;
  for (const gpu::GpuInfo& g : gpus.gpus) {
    if (g.uuid == uuid) return &g;
  }
  return nullptr;
}

std::optional<double> RiskWithin(const agent::AgentSample& s, std::uint64_t horizon) {
  for (const auto& [steps, p] : s.oom_risk) {
    if (steps == horizon) return p;
  }
  return std::nullopt;
}

std::string RiskWhy(const agent::AgentSample& s) {
  const std::optional<double> p = RiskWithin(s, kHeadlineRiskHorizonSteps);
  if (!p || s.oom_risk_explanation.empty()) return {};
  return fmt::format("P(OOM within {} steps) = {:.0f}%: {}", kHeadlineRiskHorizonSteps, 100 * *p,
                     s.oom_risk_explanation);
}

}  // namespace

AlertObservation ObserveSample(const agent::AgentSample& s, const gpu::NodeGpuInfo& gpus) {
  AlertObservation o;
  o.labels["device_uuid"] = s.device_uuid;
  o.labels["pid"] = std::to_string(s.pid);
  if (s.uid) o.labels["uid"] = std::to_string(*s.uid);  // the sender's, from the kernel
  o.labels["rank"] = std::to_string(s.rank);
  o.labels["job"] = s.job;
  o.labels["run"] = s.run;
  if (const gpu::GpuInfo* g = FindGpu(gpus, s.device_uuid); g != nullptr && g->index) {
    o.labels["gpu"] = std::to_string(*g->index);
  }
  auto set = [&](const char* name, double v) { o.values[name] = v; };
  set("reserved_bytes", static_cast<double>(s.reserved_bytes));
  set("allocated_bytes", static_cast<double>(s.allocated_bytes));
  set("active_bytes", static_cast<double>(s.active_bytes));
  set("requested_bytes", static_cast<double>(s.requested_bytes));
  set("peak_reserved_bytes", static_cast<double>(s.peak_reserved_bytes));
  set("peak_allocated_bytes", static_cast<double>(s.peak_allocated_bytes));
  set("num_alloc_retries", static_cast<double>(s.num_alloc_retries));
  set("num_ooms", static_cast<double>(s.num_ooms));
  // Unknown summary figures are left out (a rule on them does not fire), never read as 0.
  auto set_known = [&](const char* name, const std::optional<std::uint64_t>& v) {
    if (v) set(name, static_cast<double>(*v));
  };
  set_known("cached_free_bytes", s.cached_free_bytes);
  set_known("largest_free_block", s.largest_free_block);
  set_known("max_allocatable", s.max_allocatable);
  set_known("stranded_bytes", s.stranded_bytes);
  if (s.largest_request_bytes > 0) {
    set("largest_request_bytes", static_cast<double>(s.largest_request_bytes));
  }
  if (s.fragmentation_ratio) set("fragmentation_ratio", *s.fragmentation_ratio);
  set("forecast_level", static_cast<double>(s.forecast_level));
  if (s.step >= 0) set("step", static_cast<double>(s.step));
  if (s.steps_to_oom) set("steps_to_oom", static_cast<double>(*s.steps_to_oom));
  if (const std::optional<double> p = RiskWithin(s, kHeadlineRiskHorizonSteps)) set("oom_risk", *p);
  return o;
}

std::optional<AlertObservation> ObserveGpu(const gpu::GpuInfo& g) {
  if (g.uuid.empty() || !g.memory_total_bytes) return std::nullopt;
  AlertObservation o;
  o.labels["device_uuid"] = g.uuid;
  if (g.index) o.labels["gpu"] = std::to_string(*g.index);
  double total = static_cast<double>(*g.memory_total_bytes);
  o.values["gpu_memory_total_bytes"] = total;
  if (g.memory_used_bytes) {
    double used = static_cast<double>(*g.memory_used_bytes);
    o.values["gpu_memory_used_bytes"] = used;
    if (total > 0) o.values["gpu_memory_used_ratio"] = used / total;
  }
  if (g.memory_free_bytes) {
    o.values["gpu_memory_free_bytes"] = static_cast<double>(*g.memory_free_bytes);
  }
  return o;
}

AlertEngine::AlertEngine(std::vector<analysis::AlertRule> rules, std::string hostname)
    : evaluator_(std::move(rules)), hostname_(std::move(hostname)) {}

std::vector<AlertNotification> AlertEngine::Evaluate(analysis::AlertTime now,
                                                     const std::vector<agent::AgentSample>& latest,
                                                     const gpu::NodeGpuInfo& gpus) {
  std::vector<AlertObservation> observations;
  observations.reserve(latest.size() + gpus.gpus.size());
  std::map<std::map<std::string, std::string>, std::string> why;  // by the series' labels
  for (const agent::AgentSample& sample : latest) {
    observations.push_back(ObserveSample(sample, gpus));
    if (std::string w = RiskWhy(sample); !w.empty()) {
      why.emplace(observations.back().labels, std::move(w));
    }
  }
  for (const gpu::GpuInfo& g : gpus.gpus) {
    if (std::optional<AlertObservation> o = ObserveGpu(g)) observations.push_back(std::move(*o));
  }
  std::vector<AlertNotification> out;
  for (analysis::AlertTransition& t : evaluator_.Evaluate(now, observations)) {
    const analysis::AlertRule& rule = *t.rule;
    AlertNotification n;
    n.rule = rule.name;
    n.state = t.state;
    n.severity = rule.severity;
    n.summary = rule.summary;
    n.metric = rule.metric;
    n.op = std::string(analysis::CompareOpName(rule.op));
    n.threshold = rule.threshold;
    if (rule.increase_window) n.increase_over = FormatAlertDuration(*rule.increase_window);
    n.value = t.value;
    n.for_duration = FormatAlertDuration(rule.for_duration);
    if (const auto w = why.find(t.series); w != why.end()) n.why = w->second;
    n.labels = std::move(t.labels);
    n.series = std::move(t.series);
    if (!hostname_.empty()) n.labels["Hostname"] = hostname_;
    n.active_since = t.active_since;
    n.at = t.at;
    n.hooks = rule.hooks;
    n.send_resolved = rule.send_resolved;
    n.hostname = hostname_;
    out.push_back(std::move(n));
  }
  return out;
}

// ---- What a hook receives ----------------------------------------------------------------

std::string NotificationJson(const AlertNotification& n) {
  nlohmann::json j;
  j["version"] = 1;
  j["alert"] = n.rule;
  j["state"] = std::string(analysis::AlertStateName(n.state));
  j["severity"] = n.severity;
  j["summary"] = n.summary;
  j["metric"] = n.metric;
  j["op"] = n.op;
  j["threshold"] = n.threshold;
  if (n.increase_over) j["increase_over"] = *n.increase_over;
  j["value"] = n.value ? nlohmann::json(*n.value) : nlohmann::json(nullptr);
  j["for"] = n.for_duration;
  j["labels"] = n.labels;
  j["series"] = n.series;
  j["hostname"] = n.hostname;
  if (!n.why.empty()) j["why"] = n.why;
  j["active_since"] = Rfc3339(n.active_since);
  j["at"] = Rfc3339(n.at);
  // Replace, don't throw, on invalid UTF-8 in a label an agent sent.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::vector<std::string> NotificationEnvironment(const AlertNotification& n) {
  auto series = [&](const char* key) -> std::string {
    auto it = n.series.find(key);
    return it == n.series.end() ? std::string() : it->second;
  };
  std::vector<std::string> env = {
      "FRAGSCOPE_ALERT_NAME=" + n.rule,
      "FRAGSCOPE_ALERT_STATE=" + std::string(analysis::AlertStateName(n.state)),
      "FRAGSCOPE_ALERT_SEVERITY=" + n.severity,
      "FRAGSCOPE_ALERT_SUMMARY=" + n.summary,
      "FRAGSCOPE_ALERT_METRIC=" + n.metric,
      "FRAGSCOPE_ALERT_OP=" + n.op,
      "FRAGSCOPE_ALERT_THRESHOLD=" + FormatValue(n.threshold),
      "FRAGSCOPE_ALERT_VALUE=" + (n.value ? FormatValue(*n.value) : std::string()),
      "FRAGSCOPE_ALERT_DEVICE_UUID=" + series("device_uuid"),
      "FRAGSCOPE_ALERT_GPU=" + series("gpu"),
      "FRAGSCOPE_ALERT_PID=" + series("pid"),
      "FRAGSCOPE_ALERT_UID=" + series("uid"),
      "FRAGSCOPE_ALERT_RANK=" + series("rank"),
      "FRAGSCOPE_ALERT_JOB=" + series("job"),
      "FRAGSCOPE_ALERT_RUN=" + series("run"),
      "FRAGSCOPE_ALERT_HOSTNAME=" + n.hostname,
      "FRAGSCOPE_ALERT_ACTIVE_SINCE=" + Rfc3339(n.active_since),
      "FRAGSCOPE_ALERT_AT=" + Rfc3339(n.at),
      "FRAGSCOPE_ALERT_WHY=" + n.why,
  };
  // Rule labels as FRAGSCOPE_ALERT_LABEL_<NAME>: upper case, anything but [A-Z0-9_] -> '_'.
  for (const auto& [key, value] : n.labels) {
    std::string name = "FRAGSCOPE_ALERT_LABEL_";
    for (char c : key) {
      if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
      name += ((c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) ? c : '_';
    }
    env.push_back(name + "=" + value);
  }
  // A NUL would end the variable early; an agent's label cannot smuggle one in.
  for (std::string& e : env) std::erase(e, '\0');
  return env;
}

}  // namespace fragscope::sinks
