// AnalysisResult: everything `fragscope analyze` reports about a trace, as plain values. The
// analysis stage fills it; sinks (text, JSON) only format it.
#ifndef FRAGSCOPE_ANALYSIS_ANALYSIS_RESULT_H_
#define FRAGSCOPE_ANALYSIS_ANALYSIS_RESULT_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "analysis/diagnosis.h"
#include "fragscope/metrics.h"
#include "fragscope/risk.h"
#include "fragscope/trace.h"
#include "model/device_memory.h"
#include "model/free_size_index.h"

namespace fragscope::analysis {

/// When a value was reached: the event index (0-based, counting events of all devices), the
/// step in progress (-1 = before the first step marker) and the event time (-1 = unknown).
struct When {
  std::uint64_t event_index = 0;
  std::int64_t step = -1;
  std::int64_t time_us = -1;
};

struct Extreme {
  std::uint64_t bytes = 0;
  When when;
  bool seen = false;  // false: no sample qualified (e.g. no segment ever existed)
};

/// One row of the timeline: the state at the end of a window (a step, or N events) and the
/// peaks inside it. Rows may cover several steps after downsampling (step_first..step_last).
struct TimelineSample {
  std::int64_t step_first = -1;
  std::int64_t step_last = -1;
  std::uint64_t first_event = 0;  // event index range [first_event, end_event)
  std::uint64_t end_event = 0;
  std::int64_t time_us = -1;  // time of the last event in the window
  // State at the end of the window.
  std::uint64_t reserved_bytes = 0;
  std::uint64_t allocated_bytes = 0;
  std::uint64_t live_requested_bytes = 0;
  std::uint64_t cached_free_bytes = 0;
  double fragmentation_ratio = 0;
  std::uint64_t largest_free_block = 0;
  std::uint64_t max_allocatable = 0;
  std::uint64_t stranded_bytes = 0;
  // Peaks inside the window.
  std::uint64_t peak_reserved_bytes = 0;
  std::uint64_t peak_allocated_bytes = 0;
  std::uint64_t peak_live_requested_bytes = 0;
  std::uint64_t allocs = 0;  // alloc events in the window
  std::uint64_t largest_request = 0;
  // Allocator traces: segments released in the window (segment_free / segment_unmap). Without
  // empty_cache calls, a release near the device limit is the allocator's release-and-retry
  // path. Summed by MergeSamples.
  std::uint64_t segment_frees = 0;
  // Allocation retries in the window (num_alloc_retries deltas), when the source reports them:
  // replays through the simulator read its memory_stats() (TraceAnalyzer::SetAllocRetrySource).
  // Traces and snapshots do not record them: alloc_retries_known is false and the count 0.
  // Summed (and known if either is) by MergeSamples.
  std::uint64_t alloc_retries = 0;
  bool alloc_retries_known = false;
};

struct LayoutBlock {
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
  std::uint64_t requested = 0;
  model::BlockState state = model::BlockState::kFree;
  bool stranded = false;    // free and smaller than its pool's stranding threshold
  std::int32_t frame = -1;  // call site of the allocation (TraceReader::frames()), -1 = unknown
  /// The allocation in the block (allocated or pending free): an index into its device's
  /// DeviceFrames::allocations (layout_frames.h); -1 = none (free, or not recorded).
  std::int32_t allocation = -1;
};

struct LayoutSegment {
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
  std::uint64_t stream = 0;
  Pool pool = Pool::kLarge;
  bool expandable = false;
  std::vector<LayoutBlock> blocks;
};

struct RequestProfile {
  std::uint64_t count = 0;
  std::uint64_t bytes = 0;
  std::uint64_t min = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
  bool exact = true;
  std::uint64_t distinct_sizes = 0;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> top_sizes;  // (size, count)
  model::SizeHistogram histogram;
};

/// The calibrated OOM risk of one device at one sample (analysis/oom_risk.h, docs/forecast.md
/// "OOM risk"). Bytes are of demand: peak allocated plus the cache's cost (stranded bytes).
struct OomRisk {
  struct Horizon {
    std::uint64_t steps = 0;
    double probability = 0;  // P(an OOM within the next `steps` steps)
  };
  std::vector<Horizon> horizons;  // ascending steps
  double limit_low_bytes = 0;     // the demand the device serves lies in [low, high]
  double limit_high_bytes = 0;    // (the capacity less the cache's overhead)
  /// The cache's measured overhead at the largest step (peak reserved / step demand), when the
  /// limit comes from it (nullopt: the constant allowance, no reserved bytes known).
  std::optional<double> overhead_ratio;
  /// What overhead_ratio was measured from: the sample that set the largest step demand.
  struct Overhead {
    double ratio = 0;           // used: the measured one, at least the allowance
    double measured_ratio = 0;  // reserved_bytes / demand_bytes
    double reserved_bytes = 0;  // the cache's peak reserved bytes in that sample
    double demand_bytes = 0;    // its step demand (peak allocated + stranded)
    std::int64_t step = -1;     // its last step
  };
  std::optional<Overhead> overhead;
  double mean_demand_bytes = 0;               // weighted over the kept samples, trend-adjusted
  double largest_demand_bytes = 0;            // largest kept (trend-adjusted)
  double spread_bytes = 0;                    // standard deviation of the step demand
  double headroom_bytes = 0;                  // midpoint of the limit minus the mean demand
  std::optional<double> headroom_spreads;     // headroom / spread (spread > 0)
  std::optional<std::uint64_t> steps_to_oom;  // median: steps until P(OOM) reaches 50%
  double cost_bytes = 0;                      // the cache's cost beyond allocated now (stranded)
  double slope_bytes_per_step = 0;            // significant demand trend (0: none)
  /// The one change that would lower the risk most: "expandable_segments:True" (the cost
  /// removed), or a shape cap ("steps needing more than N bytes at their peak will not fit").
  std::string advice;
  std::optional<std::uint64_t> shape_cap_bytes;  // N of the shape cap (peak allocated)
  bool tail_only = false;  // every kept step fits: the risk comes from the fitted tail alone
  /// A young tail (OomRiskOptions::tail_warning_steps): the level from this risk is watch at
  /// most, and the sample is not a candidate for the run's riskiest (what check gates on).
  bool young_tail = false;
  /// Where the number comes from, one line for users (issue 31 item 5): how often step demand
  /// came near the limit, how far the largest step is below it, the chance of a new largest.
  std::string explanation;
  /// P(OOM within `steps`) if that horizon is reported.
  std::optional<double> At(std::uint64_t steps) const {
    for (const Horizon& h : horizons) {
      if (h.steps == steps) return h.probability;
    }
    return std::nullopt;
  }
};

/// One verdict of the forecaster (docs/forecast.md): the level at the end of a sampled step.
struct ForecastPoint {
  std::int64_t step = -1;  // last step of the sample (or window index without step markers)
  RiskLevel level = RiskLevel::kUnknown;
  std::optional<std::uint64_t> steps_to_oom;  // when a trend or the demand's spread gives one
  std::string reason;
  std::optional<OomRisk> risk;  // with a capacity, once enough samples were seen
};

/// How the run compares with the earlier runs of its architecture in the history, shown with
/// the forecast (`analyze --forecast --baseline`): what analysis::CompareWithBaseline gives,
/// as `check --baseline` and `history compare` print it.
struct ForecastBaseline {
  std::string architecture;
  std::size_t runs = 0;  // baseline runs compared with (0: no baseline)
  bool has_baseline = false;
  std::optional<double> growth_ratio;  // fragmentation growth: current / baseline
  std::string sentence;  // "fragmenting 2.3× faster than the last 5 runs of gpt-1.3b", ...
};

/// The forecast of one device: its level changes and the first warning and critical steps.
struct DeviceForecast {
  /// "step", or "window" when the trace has no step markers (one window = `every_events`
  /// events, counted as one step).
  std::string unit = "step";
  std::uint64_t every = 1;             // steps (or windows) per sample the forecaster saw
  std::uint64_t samples = 0;           // samples it saw
  std::uint64_t steps_covered = 0;     // steps (windows) those samples span
  bool enough_data = false;            // false: fewer than two steps; no levels were given
  std::vector<ForecastPoint> changes;  // the first sample and every level change after it
  std::uint64_t changes_dropped = 0;   // changes beyond kMaxForecastChanges (not kept)
  std::optional<std::int64_t> first_warning_step;   // first sample at warning or worse
  std::optional<std::int64_t> first_critical_step;  // first sample at critical
  RiskLevel worst = RiskLevel::kUnknown;
  ForecastPoint last;  // the verdict of the last sample
  /// The sample with the highest P(OOM within the warning horizon, 100 steps by default), when
  /// one reached 0.1% (`check --max-oom-risk` gates on it).
  std::optional<ForecastPoint> riskiest;
  std::uint64_t risk_horizon = 100;          // that horizon
  std::vector<std::string> notes;            // not enough data, fallbacks, missing capacity
  std::optional<ForecastBaseline> baseline;  // set by the caller (analyze --baseline)
};
inline constexpr std::size_t kMaxForecastChanges = 1000;

struct DeviceReport {
  std::int32_t device = 0;
  std::string name;
  std::optional<std::uint64_t> capacity_bytes;
  std::uint64_t events = 0;
  std::uint64_t allocs = 0;
  std::uint64_t frees = 0;
  Extreme peak_reserved;
  Extreme peak_allocated;
  Extreme peak_live_requested;
  // Extremes over every event of the recorded history (and its start state), never over the
  // timeline's samples: the same whatever the sampling (docs/metrics.md, "Extremes").
  Extreme max_cached_free;  // most bytes reserved but not allocated, any event
  /// The highest (reserved - allocated) / reserved among the moments with something allocated
  /// and at least half the peak reserved (worst_fragmentation_min_reserved); bytes = cached
  /// free then. Unseen when no moment qualified.
  Extreme worst_fragmentation;
  double worst_fragmentation_ratio = 0;
  std::uint64_t worst_fragmentation_reserved = 0;      // reserved at that moment
  std::uint64_t worst_fragmentation_min_reserved = 0;  // the condition: ceil(peak reserved / 2)
  Extreme min_largest_free_block;                      // over events with reserved > 0
  Extreme min_max_allocatable;                         // over events with reserved > 0
  DeviceMetrics final_metrics;                         // allocator traces only
  model::SizeHistogram free_block_histogram;           // final free blocks, both pools
  std::uint64_t live_requested_bytes = 0;              // at the end
  std::uint64_t live_requests = 0;                     // at the end
  RequestProfile requests;
  std::vector<TimelineSample> timeline;
  std::vector<LayoutSegment> layout;  // final layout, allocator traces only
  std::uint64_t num_ooms = 0;
  /// Allocator traces: the first kMaxOomDiagnoses oom events, each against the state before it.
  std::vector<OomDiagnosis> oom_diagnoses;
  /// Allocator traces: call sites whose live blocks strand free gaps (top 10), taken at the
  /// first oom event, else at the end; "first oom" or "end" says which.
  std::vector<SiteStranding> stranding_sites;
  std::string stranding_sites_at;
  /// With a forecast requested (AnalysisOptions::forecast): the forecaster's verdicts.
  std::optional<DeviceForecast> forecast;
};
inline constexpr std::size_t kMaxOomDiagnoses = 16;

/// The condition a worst ratio is taken under, as printed beside it: "among moments with at
/// least 10.9 GiB reserved (half the peak)".
std::string RatioCondition(std::uint64_t min_reserved_bytes);
inline constexpr std::size_t kTopStrandingSites = 10;

struct AnalysisResult {
  std::string source;  // file name
  TraceKind kind = TraceKind::kUnknown;
  std::vector<std::pair<std::string, std::string>> labels;
  std::string producer;
  /// "step" when the timeline follows step markers, else "events" (every `every_events`).
  std::string timeline_unit = "step";
  std::uint64_t every_events = 0;
  std::uint64_t steps_per_sample = 1;  // > 1 after downsampling a long run
  std::uint64_t total_events = 0;
  std::uint64_t steps = 0;  // step markers seen
  /// The earliest event time (microseconds, as the input gives them); -1 when no event has one.
  /// Wall-clock axes count from it.
  std::int64_t first_time_us = -1;
  double stranded_quantile = 0.5;
  std::optional<std::uint64_t> stranded_threshold;  // when fixed by the user
  std::vector<DeviceReport> devices;
  std::vector<std::string> notes;  // things the reader should know (fallbacks, caps)
};

}  // namespace fragscope::analysis

#endif  // FRAGSCOPE_ANALYSIS_ANALYSIS_RESULT_H_
