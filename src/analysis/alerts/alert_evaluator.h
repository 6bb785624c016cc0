// AlertEvaluator: one state machine per (rule, series), advanced by the caller's clock.
//
//   inactive --condition true--> pending --held for `for`--> firing --condition false--> resolved
//                                   |                          (or series gone)
//                                   +--condition false / series gone--> inactive (no notice)
//
// A rule with `for = 0` goes from inactive straight to firing. A series whose metric is
// absent counts as "condition false" (no data is not an alert). Deterministic: the only
// time it knows is the `now` passed to Evaluate, so tests drive it with a fake clock.
//
// Thread safety: not thread-safe; one evaluator per evaluation loop.
#ifndef FRAGSCOPE_ANALYSIS_ALERTS_ALERT_EVALUATOR_H_
#define FRAGSCOPE_ANALYSIS_ALERTS_ALERT_EVALUATOR_H_

#include <cstddef>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "analysis/alerts/alert_rule.h"

namespace fragscope::analysis {

enum class AlertState { kInactive, kPending, kFiring, kResolved };
/// "inactive", "pending", "firing", "resolved".
std::string_view AlertStateName(AlertState state);

/// One change of state of one (rule, series), as Evaluate reports it.
struct AlertTransition {
  const AlertRule* rule = nullptr;  // points into the evaluator's rules; valid while it lives
  AlertState state = AlertState::kPending;    // the new state: pending, firing or resolved
  std::map<std::string, std::string> series;  // the series' labels
  std::map<std::string, std::string> labels;  // rule labels, then series labels over them
  std::optional<double> value;  // the value compared (the increase, for increase rules)
  AlertTime active_since;       // when the condition started to hold
  AlertTime at;                 // the evaluation that made this transition
};

class AlertEvaluator {
 public:
  /// Window of counter history kept per series for increase rules: the longest window.
  explicit AlertEvaluator(std::vector<AlertRule> rules);

  /// Advances every (rule, series) state machine to `now` given the current observations and
  /// returns the transitions, in rule order, then series-label order. `now` should not go
  /// backwards; if it does, durations are measured as zero (nothing fires early).
  std::vector<AlertTransition> Evaluate(AlertTime now,
                                        const std::vector<AlertObservation>& observations);

  const std::vector<AlertRule>& rules() const { return rules_; }
  /// Number of (rule, series) pairs currently pending or firing.
  std::size_t active_count() const;
  /// The pairs currently firing, with their labels (for a status page / CLI).
  std::vector<AlertTransition> Firing() const;

 private:
  struct SeriesState {
    AlertState state = AlertState::kInactive;
    AlertTime active_since;
    std::optional<double> value;
    std::map<std::string, std::string> series;
  };
  using Labels = std::map<std::string, std::string>;
  // Counter history of one series: (time, value), oldest first.
  using CounterHistory = std::deque<std::pair<AlertTime, double>>;

  std::optional<double> RuleValue(const AlertRule& rule, const AlertObservation& observation,
                                  AlertTime now);
  void RecordCounters(AlertTime now, const std::vector<AlertObservation>& observations);
  static bool Matches(const AlertRule& rule, const AlertObservation& observation);
  AlertTransition MakeTransition(const AlertRule& rule, const SeriesState& s, AlertState state,
                                 AlertTime now) const;

  std::vector<AlertRule> rules_;
  std::vector<std::map<Labels, SeriesState>> states_;  // per rule
  // Counter history per (series, metric), only for metrics some increase rule uses.
  std::map<std::pair<Labels, std::string>, CounterHistory> counters_;
  std::map<std::string, AlertDuration> counter_windows_;  // metric -> longest window
  AlertTime last_now_{};
};

}  // namespace fragscope::analysis

#endif  // FRAGSCOPE_ANALYSIS_ALERTS_ALERT_EVALUATOR_H_
