#include "analysis/live_forecast.h"

#include <cmath>
#include <utility>

namespace fragscope::analysis {

namespace {

bool CapacityChanged(const std::optional<std::uint64_t>& had,
                     const std::optional<std::uint64_t>& now) {
  if (!now) return false;  // a sample without one keeps the series' capacity
  if (!had) return true;
  const double a = static_cast<double>(*had), b = static_cast<double>(*now);
  return std::fabs(a - b) > 0.05 * a;
}

}  // namespace

Result<LiveForecasts> LiveForecasts::Create(const ForecastOptions& options,
                                            std::size_t max_series) {
  FRAGSCOPE_RETURN_IF_ERROR(ValidateForecastOptions(options));
  if (max_series == 0) return Status::InvalidArgument("live forecasts need room for 1 series");
  return LiveForecasts(options, max_series);
}

LiveVerdict LiveForecasts::Observe(const std::string& key, const LiveSample& sample) {
  LiveVerdict verdict;
  if (sample.step < 0) {
    verdict.point.reason = "no step in the sample: no forecast";
    return verdict;
  }
  auto found = series_.find(key);
  if (found != series_.end()) {
    Series& s = *found->second;
    verdict.previous = s.last.level;
    if (sample.step == s.last_step) {
      verdict.point = s.last;
      return verdict;
    }
    if (sample.step < s.last_step || CapacityChanged(s.capacity, sample.capacity_bytes)) {
      order_.erase(found->second);
      series_.erase(found);
      found = series_.end();
    } else {
      order_.splice(order_.begin(), order_, found->second);  // most recent first
    }
  }
  if (found == series_.end()) {
    if (series_.size() >= max_series_) {
      series_.erase(order_.back().key);
      order_.pop_back();
    }
    order_.push_front(Series{key,
                             Forecaster(options_, sample.capacity_bytes),
                             sample.capacity_bytes,
                             -1,
                             std::nullopt,
                             {}});
    series_[key] = order_.begin();
  }
  Series& s = order_.front();

  TimelineSample window = sample.window;
  if (sample.retries_total) {
    // A counter that went down was reset: count nothing for this sample.
    window.alloc_retries = s.retries_total && *sample.retries_total >= *s.retries_total
                               ? *sample.retries_total - *s.retries_total
                               : 0;
    window.alloc_retries_known = true;
    s.retries_total = sample.retries_total;
  }
  // The first sample of a series stands for one step: what came before it is unknown.
  const std::uint64_t steps =
      s.last_step < 0 ? 1 : static_cast<std::uint64_t>(sample.step - s.last_step);
  window.step_first = s.last_step < 0 ? sample.step : s.last_step + 1;
  window.step_last = sample.step;
  s.last = s.forecaster.Observe(window, sample.step, steps);
  s.last_step = sample.step;
  verdict.point = s.last;
  return verdict;
}

}  // namespace fragscope::analysis
