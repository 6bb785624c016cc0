// CounterTrack: the memory counters of an allocator trace over time, for timeline exports
// (Perfetto). It applies each event to a MemoryModel and reports a sample whenever a device's
// reserved, allocated or largest-free-block figure changed, and a marker for the events worth
// pinning on a timeline (oom, segment_alloc/free/map/unmap, snapshot).
//
// Timestamps: microseconds from the first timed event. Events without a time (a snapshot's
// rebuilt start state, files before ~2.2) take the last timestamp; a trace with no time at all
// uses the event index, one microsecond per event, so the timeline still spreads out.
//
// Thread safety: none.
#ifndef FRAGSCOPE_ANALYSIS_COUNTER_TRACK_H_
#define FRAGSCOPE_ANALYSIS_COUNTER_TRACK_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "fragscope/event.h"
#include "fragscope/status.h"
#include "model/memory_model.h"

namespace fragscope::analysis {

struct CounterSample {
  std::int32_t device = 0;
  std::uint64_t event_index = 0;
  std::int64_t ts_us = 0;
  std::uint64_t reserved = 0;
  std::uint64_t allocated = 0;
  std::uint64_t largest_free_block = 0;
  double fragmentation_ratio = 0;  // (reserved - allocated) / reserved, 0 when nothing reserved
};

struct Marker {
  std::int32_t device = 0;
  std::uint64_t event_index = 0;
  std::int64_t ts_us = 0;
  Event event;
};

class CounterTrack {
 public:
  using SampleFn = std::function<Status(const CounterSample&)>;
  using MarkerFn = std::function<Status(const Marker&)>;

  CounterTrack(model::AllocatorRules rules, SampleFn on_sample, MarkerFn on_marker)
      : model_(rules), on_sample_(std::move(on_sample)), on_marker_(std::move(on_marker)) {}

  /// Applies one event. Model errors are returned as DeviceMemory reports them (the model is
  /// unchanged; the caller may skip the event and go on).
  Status Consume(const Event& e);

 private:
  struct Last {
    std::uint64_t reserved = ~std::uint64_t{0};
    std::uint64_t allocated = 0;
    std::uint64_t largest = 0;
  };
  std::int64_t Timestamp(const Event& e);

  model::MemoryModel model_;
  SampleFn on_sample_;
  MarkerFn on_marker_;
  std::vector<Last> last_;
  std::uint64_t events_ = 0;
  std::optional<std::int64_t> base_;  // time_us that maps to ts 0 (shifted for continuity)
  std::int64_t last_ts_ = 0;
};

}  // namespace fragscope::analysis

#endif  // FRAGSCOPE_ANALYSIS_COUNTER_TRACK_H_
