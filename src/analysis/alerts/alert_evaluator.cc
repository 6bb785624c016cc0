#include "analysis/alerts/alert_evaluator.h"

#include <fnmatch.h>

#include <algorithm>
#include <set>

namespace fragscope::analysis {

// ---- Comparisons -------------------------------------------------------------------------

std::string_view CompareOpName(CompareOp op) {
  switch (op) {
    case CompareOp::kGreater:
      return ">";
    case CompareOp::kGreaterEqual:
      return ">=";
    case CompareOp::kLess:
      return "<";
    case CompareOp::kLessEqual:
      return "<=";
    case CompareOp::kEqual:
      return "==";
    case CompareOp::kNotEqual:
      return "!=";
  }
  return "?";
}

std::optional<CompareOp> ParseCompareOp(std::string_view text) {
  for (CompareOp op : {CompareOp::kGreater, CompareOp::kGreaterEqual, CompareOp::kLess,
                       CompareOp::kLessEqual, CompareOp::kEqual, CompareOp::kNotEqual}) {
    if (CompareOpName(op) == text) return op;
  }
  return std::nullopt;
}

bool Compare(double value, CompareOp op, double threshold) {
  switch (op) {
    case CompareOp::kGreater:
      return value > threshold;
    case CompareOp::kGreaterEqual:
      return value >= threshold;
    case CompareOp::kLess:
      return value < threshold;
    case CompareOp::kLessEqual:
      return value <= threshold;
    case CompareOp::kEqual:
      return value == threshold;
    case CompareOp::kNotEqual:
      return value != threshold;
  }
  return false;
}

std::string_view AlertStateName(AlertState state) {
  switch (state) {
    case AlertState::kInactive:
      return "inactive";
    case AlertState::kPending:
      return "pending";
    case AlertState::kFiring:
      return "firing";
    case AlertState::kResolved:
      return "resolved";
  }
  return "?";
}

// ---- Evaluator ---------------------------------------------------------------------------

AlertEvaluator::AlertEvaluator(std::vector<AlertRule> rules)
    : rules_(std::move(rules)), states_(rules_.size()) {
  for (const AlertRule& rule : rules_) {
    if (!rule.increase_window) continue;
    AlertDuration& window = counter_windows_[rule.metric];
    window = std::max(window, *rule.increase_window);
  }
}

bool AlertEvaluator::Matches(const AlertRule& rule, const AlertObservation& observation) {
  for (const auto& [label, pattern] : rule.match) {
    auto it = observation.labels.find(label);
    if (it == observation.labels.end()) return false;
    if (fnmatch(pattern.c_str(), it->second.c_str(), 0) != 0) return false;
  }
  return true;
}

void AlertEvaluator::RecordCounters(AlertTime now,
                                    const std::vector<AlertObservation>& observations) {
  std::set<std::pair<Labels, std::string>> seen;
  for (const AlertObservation& observation : observations) {
    for (const auto& [metric, window] : counter_windows_) {
      auto value = observation.values.find(metric);
      if (value == observation.values.end()) continue;
      auto key = std::make_pair(observation.labels, metric);
      CounterHistory& history = counters_[key];
      history.emplace_back(now, value->second);
      // Keep one sample at or before now - window as the baseline, and everything after it.
      while (history.size() >= 2 && history[1].first <= now - window) history.pop_front();
      seen.insert(std::move(key));
    }
  }
  // A series that is gone takes its history with it (a new process is a new series).
  std::erase_if(counters_, [&](const auto& entry) { return !seen.contains(entry.first); });
}

std::optional<double> AlertEvaluator::RuleValue(const AlertRule& rule,
                                                const AlertObservation& observation,
                                                AlertTime now) {
  if (!rule.increase_window) {
    auto it = observation.values.find(rule.metric);
    if (it == observation.values.end()) return std::nullopt;
    return it->second;
  }
  auto it = counters_.find(std::make_pair(observation.labels, rule.metric));
  if (it == counters_.end() || it->second.empty()) return std::nullopt;
  const CounterHistory& history = it->second;
  // Baseline: the last sample at or before now - window (or the oldest one we have).
  std::size_t begin = 0;
  for (std::size_t i = 0; i < history.size(); ++i) {
    if (history[i].first <= now - *rule.increase_window) begin = i;
  }
  double increase = 0;
  for (std::size_t i = begin + 1; i < history.size(); ++i) {
    double previous = history[i - 1].second;
    double current = history[i].second;
    increase += current >= previous ? current - previous : current;  // a reset counts from 0
  }
  return increase;
}

AlertTransition AlertEvaluator::MakeTransition(const AlertRule& rule, const SeriesState& s,
                                               AlertState state, AlertTime now) const {
  AlertTransition t;
  t.rule = &rule;
  t.state = state;
  t.series = s.series;
  t.labels = rule.labels;
  for (const auto& [key, value] : s.series) t.labels[key] = value;
  t.labels["alertname"] = rule.name;
  t.labels["severity"] = rule.severity;
  t.value = s.value;
  t.active_since = s.active_since;
  t.at = now;
  return t;
}

std::vector<AlertTransition> AlertEvaluator::Evaluate(
    AlertTime now, const std::vector<AlertObservation>& observations) {
  if (now < last_now_) now = last_now_;  // time never goes backwards inside the evaluator
  last_now_ = now;
  RecordCounters(now, observations);

  std::vector<AlertTransition> out;
  for (std::size_t r = 0; r < rules_.size(); ++r) {
    const AlertRule& rule = rules_[r];
    std::map<Labels, SeriesState>& states = states_[r];
    std::set<const Labels*> present;
    for (const AlertObservation& observation : observations) {
      if (!Matches(rule, observation)) continue;
      std::optional<double> value = RuleValue(rule, observation, now);
      bool holds = value && Compare(*value, rule.op, rule.threshold);
      auto it = states.find(observation.labels);
      if (it == states.end()) {
        if (!holds) continue;
        it = states.emplace(observation.labels, SeriesState{}).first;
        it->second.series = observation.labels;
      }
      SeriesState& s = it->second;
      if (value) s.value = value;
      if (!holds) {
        if (s.state == AlertState::kFiring) {
          out.push_back(MakeTransition(rule, s, AlertState::kResolved, now));
        }
        states.erase(it);
        continue;
      }
      present.insert(&it->first);
      if (s.state == AlertState::kInactive) {
        s.state = AlertState::kPending;
        s.active_since = now;
        if (rule.for_duration.count() > 0) {
          out.push_back(MakeTransition(rule, s, AlertState::kPending, now));
        }
      }
      if (s.state == AlertState::kPending && now - s.active_since >= rule.for_duration) {
        s.state = AlertState::kFiring;
        out.push_back(MakeTransition(rule, s, AlertState::kFiring, now));
      }
    }
    // Series that vanished (agent gone, GPU gone): a firing alert resolves, a pending one is
    // forgotten.
    for (auto it = states.begin(); it != states.end();) {
      if (present.contains(&it->first)) {
        ++it;
        continue;
      }
      if (it->second.state == AlertState::kFiring) {
        out.push_back(MakeTransition(rule, it->second, AlertState::kResolved, now));
      }
      it = states.erase(it);
    }
  }
  return out;
}

std::size_t AlertEvaluator::active_count() const {
  std::size_t n = 0;
  for (const auto& states : states_) n += states.size();
  return n;
}

std::vector<AlertTransition> AlertEvaluator::Firing() const {
  std::vector<AlertTransition> out;
  for (std::size_t r = 0; r < rules_.size(); ++r) {
    for (const auto& [labels, s] : states_[r]) {
      if (s.state == AlertState::kFiring) {
        out.push_back(MakeTransition(rules_[r], s, AlertState::kFiring, last_now_));
      }
    }
  }
  return out;
}

}  // namespace fragscope::analysis
