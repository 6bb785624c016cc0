// TraceAnalyzer: consumes a trace's events in order and produces the AnalysisResult that
// `fragscope analyze` prints. It owns the memory model (allocator traces) or a live-request
// table (request traces), the request-size profiles, the peaks and the timeline.
//
// Thread safety: none; one thread feeds events.
#ifndef FRAGSCOPE_ANALYSIS_TRACE_ANALYZER_H_
#define FRAGSCOPE_ANALYSIS_TRACE_ANALYZER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "analysis/analysis_result.h"
#include "analysis/forecast.h"
#include "fragscope/event.h"
#include "fragscope/trace.h"
#include "model/memory_model.h"

namespace fragscope::analysis {

struct AnalysisOptions {
  std::optional<std::int32_t> device;               // analyze only this device
  std::uint64_t every_events = 0;                   // 0: one sample per step, or auto without steps
  std::optional<std::uint64_t> stranded_threshold;  // fixed threshold for both pools
  double stranded_quantile = 0.5;                   // quantile of recent requests otherwise
  std::size_t request_window = 1024;                // recent requests per pool for that quantile
  std::size_t max_timeline_samples = 4096;          // longer runs are downsampled 2:1 repeatedly
  bool check_invariants = false;                    // O(n) sweep after every event: tests, debug
  bool keep_layout = true;                          // record the final layout for the memory map
  /// Set: run the forecaster online over each device's per-step windows (before the timeline's
  /// downsampling) and fill DeviceReport::forecast.
  std::optional<ForecastOptions> forecast;
  /// Set: every device's capacity (`analyze --capacity`), in place of the trace header's; max
  /// allocatable and the forecast's steps-to-OOM and OOM risk are taken against it.
  std::optional<std::uint64_t> capacity_bytes;
};

class TraceAnalyzer {
 public:
  /// `header` gives the trace kind (or kUnknown: decided by the first alloc/segment event),
  /// device capacities and allocator settings. Fails on malformed allocator settings.
  static Result<std::unique_ptr<TraceAnalyzer>> Create(const TraceHeader& header,
                                                       const AnalysisOptions& options);
  ~TraceAnalyzer();

  /// Applies one event. Errors (kCorruption) describe the violation without a location; the
  /// caller prefixes "file:line". After an error the analyzer must not be fed further.
  Status Consume(const Event& event);

  /// Applies an event that rebuilds the state before the recorded history (a snapshot's
  /// start state, SnapshotReader::last_was_start, or the requests a replay rebuilds it with):
  /// it changes the memory model but did not happen in the run, so no peak, extreme, count,
  /// size profile or timeline window sees it. The state it leaves is the run's first: the
  /// device's next Consume (or Finish) counts it once, as the recorded history's starting
  /// point. Event indices (When::event) still count it, so they stay positions in the input.
  Status ConsumeStartState(const Event& event);

  /// Optional hint that `event` will be consumed soon: warms the caches for its block lookup
  /// and, for an alloc, its request size's count.
  void Prefetch(const Event& event) const;

  /// Events consumed so far (for progress).
  std::uint64_t events() const;

  /// For a source that counts allocation retries (a replay: the simulator's memory_stats()
  /// num_alloc_retries): `cumulative(device)` gives the device's count so far, or nullopt when
  /// unknown. It is read whenever a timeline window closes, and the window's sample gets the
  /// increase since the last one (TimelineSample::alloc_retries, alloc_retries_known). Without
  /// it, samples say the retries are unknown. Set before the first event.
  void SetAllocRetrySource(std::function<std::optional<std::uint64_t>(std::int32_t)> cumulative);

  /// Closes the last timeline window and builds the result. `source` names the input.
  AnalysisResult Finish(const std::string& source);

 private:
  struct Impl;
  explicit TraceAnalyzer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fragscope::analysis

#endif  // FRAGSCOPE_ANALYSIS_TRACE_ANALYZER_H_
