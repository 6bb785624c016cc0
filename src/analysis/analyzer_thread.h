// AnalyzerThread: runs the analysis of a simulated allocator trace on a second thread while the
// simulation goes on (common/batch_pipe.h), so that `fragscope replay` uses two cores: one
// simulates, the other keeps the stats, peaks and metrics of what it produced.
//
// The timeline's allocation retries (TraceAnalyzer::SetAllocRetrySource) are read from the
// simulator when a window closes, and the simulator is ahead by then. So each event travels with
// its device's cumulative retry count at the moment it was emitted, and AllocRetries() answers
// with the count of the device's latest event. CachingAllocatorSim counts a retry only inside a
// malloc that then emits the alloc or the oom event of the same device, so that is the count the
// simulator itself holds whenever the analysis asks: the report is the one a single thread makes
// (tests/cli/test_replay.py compares them byte for byte).
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
  /// `consume` applies one event on the analyzing thread (the analyzer's Consume, and whatever
  /// else follows the simulated trace, such as a writer); `analyzer` gets read-ahead hints.
  /// Both must outlive this object.
  AnalyzerThread(const TraceAnalyzer& analyzer, std::function<Status(const Event&)> consume);

  /// Queues an event the simulator emitted, with its device's num_alloc_retries at that moment
  /// (nullopt: unknown). Dropped once failed().
  void Send(const Event& event, std::optional<std::uint64_t> alloc_retries);
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
  };
  Status Consume(std::span<Item> items);

  const TraceAnalyzer& analyzer_;
  std::function<Status(const Event&)> consume_;
  std::vector<std::optional<std::uint64_t>> retries_;  // by device; the analyzing thread's
  BatchPipe<Item> pipe_;  // last: its thread stops before the members above go
};

}  // namespace fragscope::analysis

#endif  // FRAGSCOPE_ANALYSIS_ANALYZER_THREAD_H_
