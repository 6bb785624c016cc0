// AnalyzerThread: runs a TraceAnalyzer on a second thread while its events are made
// (common/batch_pipe.h), so that two cores share the work: `fragscope replay` simulates on one
// while the other keeps the stats, peaks and metrics of what the simulation produced, and
// `fragscope analyze` parses a trace on one while the other analyzes it.
//
// Each event may carry a `where` (a trace's line number) that the consume callback gets back,
// so that its errors still name their line.
//
// For a simulation, the timeline's allocation retries (TraceAnalyzer::SetAllocRetrySource) are read
// from the simulator when a window closes, and the simulator is ahead by then. So each event
// travels with its device's cumulative retry count at the moment it was emitted, and AllocRetries()
// answers with the count of the device's latest event. CachingAllocatorSim counts a retry only
// inside a malloc that then emits the alloc or the oom event of the same device, so that is the
// count the simulator itself holds whenever the analysis asks: the report is the one a single
// thread makes (tests/cli/test_replay.py compares them byte for byte).
//
// Thread safety: Send, failed and Finish belong to the simulating thread; AllocRetries to the
// analyzing one (the callbacks), or to anyone after Finish.
#ifndef FRAGSCOPE_ANALYSIS_ANALYZER_THREAD_H_
#define FRAGSCOPE_ANALYSIS_ANALYZER_THREAD_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "analysis/trace_analyzer.h"
#include "common/batch_pipe.h"
#include "fragscope/event.h"
#include "fragscope/status.h"

namespace fragscope::analysis {

class AnalyzerThread {
 public:
  /// Applies one event on the analyzing thread (the analyzer's Consume, and whatever else
  /// follows the trace, such as a writer); `where` is what Send was given.
  using Consume = std::function<Status(const Event& event, std::uint64_t where)>;

  /// `analyzer` gets read-ahead hints. Both must outlive this object.
  AnalyzerThread(const TraceAnalyzer& analyzer, Consume consume);

  /// Queues an event, with (from a simulator) its device's num_alloc_retries at that moment
  /// (nullopt: unknown or not simulated) and a `where` for `consume`. Dropped once failed().
  void Send(const Event& event, std::optional<std::uint64_t> alloc_retries,
            std::uint64_t where = 0);
  /// `consume` failed: stop simulating and call Finish().
  bool failed() const { return pipe_.failed(); }
  /// Waits until every event sent was consumed; returns the first error of `consume`.
  Status Finish() { return pipe_.Finish(); }

  /// The retry count carried by `device`'s latest consumed event; nullopt before its first.
  std::optional<std::uint64_t> AllocRetries(std::int32_t device) const;

 private:
  struct Item {
    Event event;
    std::optional<std::uint64_t> retries;
    std::uint64_t where = 0;
  };
  Status ConsumeBatch(std::span<Item> items);

  const TraceAnalyzer& analyzer_;
  Consume consume_;
  std::vector<std::optional<std::uint64_t>> retries_;  // by device; the analyzing thread's
  BatchPipe<Item> pipe_;  // last: its thread stops before the members above go
};

}  // namespace fragscope::analysis

#endif  // FRAGSCOPE_ANALYSIS_ANALYZER_THREAD_H_
