// Timeline: the samples of one device, bounded in number. When a run produces more than
// `max_samples` windows, neighbouring samples are merged pairwise and every later sample
// covers twice as many windows, so memory stays O(max_samples) for runs of any length.
//
// Thread safety: none.
#ifndef FRAGSCOPE_ANALYSIS_TIMELINE_H_
#define FRAGSCOPE_ANALYSIS_TIMELINE_H_

#include <optional>
#include <vector>

#include "analysis/analysis_result.h"

namespace fragscope::analysis {

/// a followed by b, as one sample: b's end state, the larger peaks, summed counts.
TimelineSample MergeSamples(const TimelineSample& a, const TimelineSample& b);

class Timeline {
 public:
  explicit Timeline(std::size_t max_samples) : max_samples_(max_samples < 2 ? 2 : max_samples) {}

  /// Appends the sample of one closed window.
  void Add(const TimelineSample& sample);
  void Clear();
  /// Windows per stored sample (1 until the first downsampling).
  std::uint64_t windows_per_sample() const { return stride_; }
  /// The samples, including a final partial one.
  std::vector<TimelineSample> Samples() const;

 private:
  std::size_t max_samples_;
  std::uint64_t stride_ = 1;
  std::vector<TimelineSample> samples_;
  std::optional<TimelineSample> pending_;  // merging toward `stride_` windows
  std::uint64_t pending_windows_ = 0;
};

}  // namespace fragscope::analysis

#endif  // FRAGSCOPE_ANALYSIS_TIMELINE_H_
