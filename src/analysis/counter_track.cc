#include "analysis/counter_track.h"

#include <algorithm>

namespace fragscope::analysis {

std::int64_t CounterTrack::Timestamp(const Event& e) {
  if (e.time_us >= 0) {
    // The first timed event continues from where untimed ones left off.
    if (!base_) base_ = e.time_us - last_ts_;
    last_ts_ = std::max(last_ts_, e.time_us - *base_);
  } else if (!base_) {
    last_ts_ = static_cast<std::int64_t>(events_);
  }
  return last_ts_;
}

Status CounterTrack::Consume(const Event& e) {
  const std::uint64_t index = events_;
  const std::int64_t ts = Timestamp(e);
  ++events_;
  if (e.action == Action::kStep) return Status::Ok();
  FRAGSCOPE_RETURN_IF_ERROR(model_.Apply(e));
  switch (e.action) {
    case Action::kOom:
    case Action::kSegmentAlloc:
    case Action::kSegmentFree:
    case Action::kSegmentMap:
    case Action::kSegmentUnmap:
    case Action::kSnapshot:
      if (on_marker_) FRAGSCOPE_RETURN_IF_ERROR(on_marker_(Marker{e.device, index, ts, e}));
      break;
    default:
      break;
  }
  const model::DeviceMemory* memory = model_.FindDevice(e.device);
  if (memory == nullptr) return Status::Ok();
  const auto d = static_cast<std::size_t>(e.device);
  if (d >= last_.size()) last_.resize(d + 1);
  Last& last = last_[d];
  const std::uint64_t reserved = memory->reserved();
  const std::uint64_t allocated = memory->allocated();
  const std::uint64_t largest = std::max(memory->pool(Pool::kSmall).free.Largest(),
                                         memory->pool(Pool::kLarge).free.Largest());
  if (reserved == last.reserved && allocated == last.allocated && largest == last.largest) {
    return Status::Ok();
  }
  last = Last{reserved, allocated, largest};
  CounterSample s;
  s.device = e.device;
  s.event_index = index;
  s.ts_us = ts;
  s.reserved = reserved;
  s.allocated = allocated;
  s.largest_free_block = largest;
  s.fragmentation_ratio = reserved == 0
                              ? 0.0
                              : static_cast<double>(reserved - std::min(allocated, reserved)) /
                                    static_cast<double>(reserved);
  return on_sample_ ? on_sample_(s) : Status::Ok();
}

}  // namespace fragscope::analysis
