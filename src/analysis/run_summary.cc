#include "analysis/run_summary.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>

namespace fragscope::analysis {

std::vector<std::int64_t> StepMarks(std::int64_t last_step) {
  std::vector<std::int64_t> marks;
  static constexpr std::int64_t kMantissas[] = {1, 2, 5};
  for (std::int64_t decade = 10; decade <= last_step && decade > 0; decade *= 10) {
    for (std::int64_t m : kMantissas) {
      if (m * decade <= last_step) marks.push_back(m * decade);
    }
    if (decade > INT64_MAX / 10) break;
  }
  return marks;
}

namespace {

const DeviceReport* PickDevice(const AnalysisResult& result, std::int32_t device) {
  const DeviceReport* best = nullptr;
  for (const DeviceReport& d : result.devices) {
    if (device >= 0) {
      if (d.device == device) return &d;
      continue;
    }
    if (best == nullptr || d.peak_reserved.bytes > best->peak_reserved.bytes) best = &d;
  }
  return best;
}

// Least-squares slope of y against x; unset with fewer than two distinct x.
std::optional<double> Slope(const std::vector<std::pair<double, double>>& points) {
  if (points.size() < 2) return std::nullopt;
  double mx = 0, my = 0;
  for (const auto& [x, y] : points) {
    mx += x;
    my += y;
  }
  const double n = static_cast<double>(points.size());
  mx /= n;
  my /= n;
  double sxx = 0, sxy = 0;
  for (const auto& [x, y] : points) {
    sxx += (x - mx) * (x - mx);
    sxy += (x - mx) * (y - my);
  }
  if (sxx <= 0) return std::nullopt;
  return sxy / sxx;
}

std::string Times(double ratio) { return fmt::format("{:.1f}×", ratio); }

std::string LastRuns(std::size_t n, const std::string& arch) {
  if (n == 1) return fmt::format("the last run of {}", arch);
  return fmt::format("the last {} runs of {}", n, arch);
}

}  // namespace

Result<RunSummary> SummarizeRun(const AnalysisResult& result, std::int32_t device) {
  if (result.kind == TraceKind::kRequest) {
    return Status::InvalidArgument(
        fmt::format("{}: a request trace has no allocator state to summarize; replay it through "
                    "the simulator first (fragscope replay --emit OUT)",
                    result.source));
  }
  const DeviceReport* d = PickDevice(result, device);
  if (d == nullptr) {
    if (device >= 0) {
      return Status::NotFound(fmt::format("{}: device {} has no events", result.source, device));
    }
    return Status::NotFound(fmt::format("{}: no device has events", result.source));
  }
  RunSummary s;
  s.source = result.source;
  s.device = d->device;
  s.steps = result.steps;
  s.peak_allocated_bytes = d->peak_allocated.bytes;
  s.peak_reserved_bytes = d->peak_reserved.bytes;
  s.request_count = d->requests.count;
  s.request_p50_bytes = d->requests.p50;
  s.request_p90_bytes = d->requests.p90;
  s.request_p99_bytes = d->requests.p99;
  s.request_max_bytes = d->requests.max;
  s.num_ooms = d->num_ooms;
  if (result.timeline_unit != "step") return s;  // no step markers: no marks, no growth

  std::int64_t last_step = -1;
  std::vector<std::pair<double, double>> points;
  for (const TimelineSample& row : d->timeline) {
    if (row.step_last < 0) continue;  // before the first step marker
    last_step = std::max(last_step, row.step_last);
    points.emplace_back(static_cast<double>(row.step_last), row.fragmentation_ratio);
  }
  for (std::int64_t mark : StepMarks(last_step)) {
    // The first row whose step range reaches the mark (rows are in step order).
    auto it = std::find_if(d->timeline.begin(), d->timeline.end(),
                           [mark](const TimelineSample& r) { return r.step_last >= mark; });
    if (it == d->timeline.end() || it->step_first > mark) continue;  // a gap in the steps
    s.marks.push_back({mark, it->fragmentation_ratio});
  }
  if (std::optional<double> slope = Slope(points)) {
    s.fragmentation_growth_per_1000_steps = *slope * 1000.0;
  }
  return s;
}

BaselineComparison CompareWithBaseline(const RunSummary& current,
                                       std::span<const RunSummary> baseline) {
  BaselineComparison c;
  c.architecture = current.architecture;
  std::vector<const RunSummary*> runs;
  for (const RunSummary& r : baseline) {
    if (!current.run.empty() && r.run == current.run) continue;
    runs.push_back(&r);
  }
  c.runs = runs.size();
  const std::string& arch = current.architecture;
  if (runs.empty()) {
    c.sentence = fmt::format("no baseline for {}: no earlier runs are recorded", arch);
    return c;
  }

  // Peaks.
  double mean_alloc = 0, mean_reserved = 0;
  for (const RunSummary* r : runs) {
    mean_alloc += static_cast<double>(r->peak_allocated_bytes);
    mean_reserved += static_cast<double>(r->peak_reserved_bytes);
  }
  mean_alloc /= static_cast<double>(runs.size());
  mean_reserved /= static_cast<double>(runs.size());
  if (mean_alloc > 0) {
    c.peak_allocated_ratio = static_cast<double>(current.peak_allocated_bytes) / mean_alloc;
  }
  if (mean_reserved > 0) {
    c.peak_reserved_ratio = static_cast<double>(current.peak_reserved_bytes) / mean_reserved;
  }

  // Growth.
  c.current_growth = current.fragmentation_growth_per_1000_steps;
  double growth_sum = 0;
  std::size_t growth_runs = 0;
  for (const RunSummary* r : runs) {
    if (r->fragmentation_growth_per_1000_steps) {
      growth_sum += *r->fragmentation_growth_per_1000_steps;
      ++growth_runs;
    }
  }
  if (growth_runs > 0) c.baseline_growth = growth_sum / static_cast<double>(growth_runs);
  if (c.current_growth && c.baseline_growth && *c.baseline_growth > kMinGrowth) {
    c.growth_ratio = *c.current_growth / *c.baseline_growth;
  }

  // Common marks.
  std::map<std::int64_t, std::pair<double, std::size_t>> by_step;  // step -> (sum, runs)
  for (const RunSummary* r : runs) {
    for (const FragmentationMark& m : r->marks) {
      auto& [sum, n] = by_step[m.step];
      sum += m.fragmentation_ratio;
      ++n;
    }
  }
  double ratio_sum = 0;
  std::size_t ratio_n = 0;
  for (const FragmentationMark& m : current.marks) {
    auto it = by_step.find(m.step);
    if (it == by_step.end()) continue;
    MarkComparison mc;
    mc.step = m.step;
    mc.current = m.fragmentation_ratio;
    mc.baseline_runs = it->second.second;
    mc.baseline = it->second.first / static_cast<double>(mc.baseline_runs);
    if (mc.baseline > 0) {
      ratio_sum += mc.current / mc.baseline;
      ++ratio_n;
    }
    c.marks.push_back(mc);
  }
  if (ratio_n > 0) c.mark_ratio = ratio_sum / static_cast<double>(ratio_n);

  // The sentence: growth first, then the level at the common marks.
  const std::string who = LastRuns(runs.size(), arch);
  if (c.growth_ratio) {
    const double g = *c.growth_ratio;
    if (g >= 1.05) {
      c.sentence = fmt::format("fragmenting {} faster than {}", Times(g), who);
    } else if (g <= 0.95 && g > 0) {
      c.sentence = fmt::format("fragmenting {} slower than {}", Times(1.0 / g), who);
    } else if (g <= 0) {
      c.sentence = fmt::format("not fragmenting over time, while {} did", who);
    } else {
      c.sentence = fmt::format("fragmenting at the same rate as {}", who);
    }
  } else if (c.current_growth && c.baseline_growth) {
    // The baseline stayed flat (or improved): a ratio would be meaningless.
    if (*c.current_growth > kMinGrowth) {
      c.sentence = fmt::format("fragmenting (+{:.3f} per 1000 steps) while {} stayed flat",
                               *c.current_growth, who);
    } else {
      c.sentence = fmt::format("not fragmenting over time, like {}", who);
    }
  } else if (c.mark_ratio) {
    const MarkComparison& last = c.marks.back();
    c.sentence = fmt::format(
        "fragmentation at the common step marks is {} that of {} ({:.3f} vs "
        "{:.3f} at step {})",
        Times(*c.mark_ratio), who, last.current, last.baseline, last.step);
  } else if (c.marks.empty()) {
    c.sentence = fmt::format(
        "no fragmentation baseline for {}: {} share no step marks with this "
        "run",
        arch, who);
  } else {
    c.sentence = fmt::format("fragmentation at the common step marks is 0 in {}", who);
  }
  c.has_baseline = c.growth_ratio.has_value() || c.mark_ratio.has_value() ||
                   (c.current_growth && c.baseline_growth) || !c.marks.empty();
  if (c.peak_allocated_ratio) {
    c.sentence += fmt::format("; peak allocated {} theirs", Times(*c.peak_allocated_ratio));
  }
  return c;
}

}  // namespace fragscope::analysis
