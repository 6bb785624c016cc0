#include "model/request_extractor.h"

namespace fragscope::model {

bool RequestExtractor::Convert(const Event& in, Event* out) {
  const auto device = static_cast<std::size_t>(in.device < 0 ? 0 : in.device);
  if (device >= awaiting_.size()) awaiting_.resize(device + 1);
  auto& awaiting = awaiting_[device];
  const bool after_segment_free = last_was_segment_free_;
  last_was_segment_free_ = in.action == Action::kSegmentFree;
  switch (in.action) {
    case Action::kAlloc:
    case Action::kBlock:
      *out = in;
      out->action = Action::kAlloc;
      out->block_size = 0;
      awaiting.erase(in.addr);
      return true;
    case Action::kFreeRequested:
      *out = in;
      awaiting.insert(in.addr);
      return true;
    case Action::kFreeCompleted:
      if (awaiting.erase(in.addr) > 0) return false;
      *out = in;
      out->action = Action::kFreeRequested;
      return true;
    case Action::kOom:
      *out = in;
      out->action = Action::kAlloc;
      out->addr = next_oom_id_--;
      out->device_free.reset();
      return true;
    case Action::kSegmentFree:
      if (!infer_empty_cache_ || after_segment_free) return false;
      *out = Event();
      out->action = Action::kEmptyCache;
      out->device = in.device;
      out->time_us = in.time_us;
      ++inferred_empty_caches_;
      return true;
    case Action::kSegmentAlloc:
    case Action::kSegmentMap:
    case Action::kSegmentUnmap:
    case Action::kSnapshot:
      return false;
    default:
      *out = in;
      return true;
  }
}

}  // namespace fragscope::model
