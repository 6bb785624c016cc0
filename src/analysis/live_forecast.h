// LiveForecasts: the OOM forecaster (forecast.h) run over many live series at once — the
// daemon's agents, one series per process and device — fed one sample at a time as samples
// arrive, not from a recorded timeline. It turns what live sources report into what the
// Forecaster reads: steps since the series' previous sample, allocation retries per sample from
// a cumulative counter, and a fresh start when a series' step goes backwards (the job was
// restarted). docs/forecast.md, "In the daemon".
//
// Bounded: at most max_series series; the least recently updated one is dropped first.
// Thread safety: none; one thread observes.
#ifndef FRAGSCOPE_ANALYSIS_LIVE_FORECAST_H_
#define FRAGSCOPE_ANALYSIS_LIVE_FORECAST_H_

#include <algorithm>
#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <unordered_map>

#include "analysis/analysis_result.h"
#include "analysis/forecast.h"
#include "fragscope/risk.h"
#include "fragscope/status.h"

namespace fragscope::analysis {

/// One live sample of one series.
struct LiveSample {
  /// The state at the sample; peaks as the source reports them (for PyTorch's memory_stats,
  /// since the process started or since its last reset_peak_memory_stats()).
  TimelineSample window;
  std::int64_t step = -1;  // training step, >= 0
  /// The source's cumulative allocation-retry counter (num_alloc_retries), if it has one.
  std::optional<std::uint64_t> retries_total;
  /// What the process may use: device capacity minus other processes' memory. Unknown: the
  /// classic signals only, no steps-to-OOM.
  std::optional<std::uint64_t> capacity_bytes;
};

struct LiveVerdict {
  ForecastPoint point;
  /// The series' level before this sample (kUnknown for a new series).
  RiskLevel previous = RiskLevel::kUnknown;
};

class LiveForecasts {
 public:
  static Result<LiveForecasts> Create(const ForecastOptions& options, std::size_t max_series);

  /// Observes `sample` for series `key`. A step equal to the series' last one returns the last
  /// verdict again (a repeated sample adds nothing); a smaller one starts the series afresh, as
  /// does a capacity that becomes known or changes by more than 1%.
  LiveVerdict Observe(const std::string& key, const LiveSample& sample);
  std::size_t size() const { return series_.size(); }

 private:
  LiveForecasts(const ForecastOptions& options, std::size_t max_series)
      : options_(LiveOptions(options)), max_series_(max_series) {}
  // The daemon's series start when the agent does, with peaks since the process started: its
  // first sample is not one step of demand. The risk keeps the forecaster's warm-up there and
  // needs 20 steps after it (the gate before issue 31's third round; docs/forecast.md).
  static ForecastOptions LiveOptions(ForecastOptions o) {
    o.risk_options.warmup_steps = std::max(o.risk_options.warmup_steps, o.warmup_steps);
    o.risk_options.min_steps = std::max<std::uint64_t>(o.risk_options.min_steps, 20);
    return o;
  }

  struct Series {
    std::string key;
    Forecaster forecaster;
    std::optional<std::uint64_t> capacity;
    std::int64_t last_step = -1;
    std::optional<std::uint64_t> retries_total;
    ForecastPoint last;
  };
  ForecastOptions options_;
  std::size_t max_series_;
  std::list<Series> order_;  // most recently updated first
  std::unordered_map<std::string, std::list<Series>::iterator> series_;
};

}  // namespace fragscope::analysis

#endif  // FRAGSCOPE_ANALYSIS_LIVE_FORECAST_H_
