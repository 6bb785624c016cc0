// Check: the verdict of `fragscope check`, a gate for CI pipelines that guard a model's memory
// behaviour. It turns what the analysis found (peaks, fragmentation, OOMs, the forecast, the
// comparison with the baseline runs) into a list of named checks, each passed or failed, with
// the measured value and the limit. Pure: the caller computes the inputs, a sink prints the
// result (docs/check.md).
//
// Thread safety: plain values and pure functions.
#ifndef FRAGSCOPE_ANALYSIS_CHECK_H_
#define FRAGSCOPE_ANALYSIS_CHECK_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "analysis/analysis_result.h"
#include "analysis/run_summary.h"
#include "fragscope/risk.h"

namespace fragscope::analysis {

/// The limits; an unset one is not checked.
struct CheckLimits {
  std::optional<std::uint64_t> max_peak_reserved;  // bytes
  std::optional<double> max_fragmentation;         // worst per-step fragmentation_ratio
  /// Device capacity: an allocator trace or snapshot must fit (peak reserved + memory used by
  /// others <= capacity); a request trace is replayed on a device of this size.
  std::optional<std::uint64_t> capacity;
  std::uint64_t used_by_others = 0;
  /// Regression against the baseline: fail when the run fragments this many times faster than
  /// the baseline runs, or its peak allocated grows by more than this fraction.
  double max_growth_ratio = 1.5;
  double max_peak_increase = 0.10;
  /// Fail when the forecast reaches this level (kUnknown: the forecast is not checked).
  RiskLevel fail_at_level = RiskLevel::kCritical;
  /// A --baseline without earlier runs fails the baseline check (a gate with nothing to compare
  /// with would pass anything), unless this says it is the label's first run.
  bool allow_new_baseline = false;
  /// Fail the forecast item too when P(OOM within the risk horizon, 100 steps) reached this
  /// at any sample (`--max-oom-risk`); nullopt: not checked.
  std::optional<double> max_oom_risk;
  /// The user asked for the forecast check (an explicit --fail-at or --max-oom-risk), not only
  /// the default level: then a forecast that cannot be made fails the check.
  bool forecast_asked = false;
  /// A check whose input is missing (a forecast asked for without enough steps or without an
  /// OOM risk, a fragmentation limit on a device that never reserved memory) fails: a gate that
  /// cannot judge must not pass. With this set (`--allow-missing`) it is skipped instead.
  bool allow_missing = false;
};

/// Everything known about one device.
struct CheckDeviceInput {
  const DeviceReport* report = nullptr;  // its `forecast`, when set, feeds the forecast check
  std::optional<BaselineComparison> baseline;
  /// The run came from replaying a request trace on a device of CheckLimits::capacity.
  bool replayed = false;
  /// Replays: the first OOM message PyTorch would print (used when no diagnosis exists).
  std::string replay_oom_message;
  /// The input has step markers (AnalysisResult::steps > 0). Without any, figures are not
  /// placed relative to steps ("before the first step" would be true of every event).
  bool has_steps = true;
};

enum class CheckOutcome { kPass, kFail, kSkipped };

struct CheckItem {
  std::int32_t device = 0;
  std::string name;  // "oom", "peak_reserved", "capacity", "fragmentation", "forecast",
                     // "baseline"
  CheckOutcome outcome = CheckOutcome::kPass;
  std::string measured;  // e.g. "13.2 GiB", "0.41 at step 300"
  std::string limit;     // e.g. "<= 16 GiB"
  std::string detail;    // one sentence: why it failed, or what was seen
};

struct CheckResult {
  std::string source;
  std::string mode;  // "analyzed" (allocator trace, snapshot) or "replayed" (request trace)
  std::vector<CheckItem> items;
  std::vector<std::string> notes;
  std::size_t failed() const;
  bool passed() const { return failed() == 0; }
};

/// The checks of one device, in a fixed order: oom, capacity, peak_reserved, fragmentation,
/// forecast, baseline.
std::vector<CheckItem> CheckDevice(const CheckDeviceInput& input, const CheckLimits& limits);

std::string_view CheckOutcomeName(CheckOutcome outcome);  // "pass", "FAIL", "skipped"

}  // namespace fragscope::analysis

#endif  // FRAGSCOPE_ANALYSIS_CHECK_H_
