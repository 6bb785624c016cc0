#include "analysis/timeline.h"

#include <algorithm>

namespace fragscope::analysis {

TimelineSample MergeSamples(const TimelineSample& a, const TimelineSample& b) {
  TimelineSample m = b;
  m.step_first = a.step_first;
  m.first_event = a.first_event;
  m.peak_reserved_bytes = std::max(a.peak_reserved_bytes, b.peak_reserved_bytes);
  m.peak_allocated_bytes = std::max(a.peak_allocated_bytes, b.peak_allocated_bytes);
  m.peak_live_requested_bytes = std::max(a.peak_live_requested_bytes, b.peak_live_requested_bytes);
  m.allocs = a.allocs + b.allocs;
  m.largest_request = std::max(a.largest_request, b.largest_request);
  m.segment_frees = a.segment_frees + b.segment_frees;
  m.alloc_retries = a.alloc_retries + b.alloc_retries;
  m.alloc_retries_known = a.alloc_retries_known || b.alloc_retries_known;
  return m;
}

void Timeline::Add(const TimelineSample& sample) {
  pending_ = pending_ ? MergeSamples(*pending_, sample) : sample;
  if (++pending_windows_ < stride_) return;
  samples_.push_back(*pending_);
  pending_.reset();
  pending_windows_ = 0;
  if (samples_.size() < max_samples_) return;
  // Downsample 2:1. An odd last sample becomes the pending one, half full at the new stride.
  std::vector<TimelineSample> merged;
  merged.reserve(samples_.size() / 2 + 1);
  std::size_t i = 0;
  for (; i + 1 < samples_.size(); i += 2)
    merged.push_back(MergeSamples(samples_[i], samples_[i + 1]));
  if (i < samples_.size()) {
    pending_ = samples_[i];
    pending_windows_ = stride_;
  }
  samples_ = std::move(merged);
  stride_ *= 2;
}

void Timeline::Clear() {
  samples_.clear();
  pending_.reset();
  pending_windows_ = 0;
  stride_ = 1;
}

std::vector<TimelineSample> Timeline::Samples() const {
  std::vector<TimelineSample> out = samples_;
  if (pending_) out.push_back(*pending_);
  return out;
}

}  // namespace fragscope::analysis
