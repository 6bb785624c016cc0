// RunSummary: what the history keeps of one analyzed run (one device of one trace), and
// BaselineComparison: how a run compares with earlier runs of the same model architecture
// ("fragmenting 2.3x faster than the last 5 runs of gpt-1.3b"). Plain values; the history
// store (src/sinks/history) persists summaries, `fragscope history` and `check` print them.
//
// Thread safety: plain values and pure functions.
#ifndef FRAGSCOPE_ANALYSIS_RUN_SUMMARY_H_
#define FRAGSCOPE_ANALYSIS_RUN_SUMMARY_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "analysis/analysis_result.h"
#include "fragscope/status.h"

namespace fragscope::analysis {

/// The fragmentation ratio at the end of the timeline row that covers `step`.
struct FragmentationMark {
  std::int64_t step = 0;
  double fragmentation_ratio = 0;
};

/// The fixed step marks runs are compared at: 10, 20, 50, 100, 200, 500, 1000, ... (a 1-2-5
/// sequence). Marks past `last_step` are left out.
std::vector<std::int64_t> StepMarks(std::int64_t last_step);

struct RunSummary {
  std::string run;           // run name, the history's key
  std::string architecture;  // model architecture label, the baseline's key
  std::int64_t recorded_unix_s = 0;
  std::string source;  // the analyzed file
  std::int32_t device = 0;
  std::uint64_t steps = 0;  // step markers seen
  std::uint64_t peak_allocated_bytes = 0;
  std::uint64_t peak_reserved_bytes = 0;
  // Request-size profile (every alloc request of the device).
  std::uint64_t request_count = 0;
  std::uint64_t request_p50_bytes = 0;
  std::uint64_t request_p90_bytes = 0;
  std::uint64_t request_p99_bytes = 0;
  std::uint64_t request_max_bytes = 0;
  /// At the StepMarks the run reached, ascending by step.
  std::vector<FragmentationMark> marks;
  /// Least-squares slope of fragmentation_ratio against the step, per 1000 steps, over every
  /// timeline row; unset with fewer than two rows at distinct steps.
  std::optional<double> fragmentation_growth_per_1000_steps;
  std::uint64_t num_ooms = 0;
};

/// Builds the summary of `device` (-1: the only device, or with several the one with the
/// highest peak reserved) from what `fragscope analyze` computed. run, architecture and
/// recorded_unix_s are left for the caller. Errors: InvalidArgument for a request trace (it
/// has no allocator state to summarize) or a timeline without step markers; NotFound for a
/// device without events.
Result<RunSummary> SummarizeRun(const AnalysisResult& result, std::int32_t device);

/// One common step mark: the current run's ratio and the mean of the baseline runs that
/// reached it.
struct MarkComparison {
  std::int64_t step = 0;
  double current = 0;
  double baseline = 0;
  std::size_t baseline_runs = 0;  // how many baseline runs reached this mark
};

struct BaselineComparison {
  std::string architecture;
  std::size_t runs = 0;  // baseline runs compared with (0: no baseline)
  bool has_baseline = false;
  /// current / mean of the baseline runs; unset when the baseline's value is 0.
  std::optional<double> peak_allocated_ratio;
  std::optional<double> peak_reserved_ratio;
  /// current growth / mean baseline growth; unset unless both are known and the baseline's is
  /// clearly positive (see kMinGrowth).
  std::optional<double> growth_ratio;
  std::optional<double> current_growth;   // per 1000 steps
  std::optional<double> baseline_growth;  // mean over the baseline runs that have one
  std::vector<MarkComparison> marks;
  /// Mean over `marks` of current / baseline (marks with a baseline ratio of 0 left out).
  std::optional<double> mark_ratio;
  /// One line for people, e.g. "fragmenting 2.3× faster than the last 5 runs of gpt-1.3b", or
  /// "no baseline for gpt-1.3b: ...".
  std::string sentence;
};

/// Growth below this (fragmentation ratio per 1000 steps) counts as flat.
inline constexpr double kMinGrowth = 1e-4;

/// Compares `current` with `baseline` (e.g. HistoryStore::LastRuns(architecture, n)). Baseline
/// runs with the same non-empty run name as `current` are skipped, so a run is never its own
/// baseline.
BaselineComparison CompareWithBaseline(const RunSummary& current,
                                       std::span<const RunSummary> baseline);

}  // namespace fragscope::analysis

#endif  // FRAGSCOPE_ANALYSIS_RUN_SUMMARY_H_
