#include "analysis/check.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/units.h"
#include "model/caching_allocator_sim.h"

namespace fragscope::analysis {
namespace {

std::string AtStep(std::int64_t step, bool has_steps) {
  if (step >= 0) return fmt::format(" at step {}", step);
  return has_steps ? std::string(" before the first step") : std::string();
}

// A limit the user set whose input is missing: a failure (the gate cannot judge, so it must
// not pass), or with --allow-missing a skip that says so.
void MissingInput(const CheckLimits& limits, std::string why, CheckItem* item) {
  if (limits.allow_missing) {
    item->outcome = CheckOutcome::kSkipped;
    item->detail = why + "; skipped (--allow-missing)";
    return;
  }
  item->outcome = CheckOutcome::kFail;
  item->detail = why +
                 "; a gate that cannot judge does not pass (--allow-missing skips a check whose "
                 "input is missing)";
}

CheckItem OomItem(const CheckDeviceInput& in) {
  const DeviceReport& r = *in.report;
  CheckItem item{r.device, "oom", CheckOutcome::kPass, "none", "no OOM", ""};
  if (r.num_ooms == 0) {
    item.detail = in.replayed ? "the replay ran to the end without running out of memory"
                              : "the recorded run has no out-of-memory event";
    return item;
  }
  item.outcome = CheckOutcome::kFail;
  if (r.oom_diagnoses.empty()) {
    item.measured = fmt::format("{} OOM{}", r.num_ooms, r.num_ooms == 1 ? "" : "s");
    item.detail = in.replay_oom_message;
    return item;
  }
  const OomDiagnosis& o = r.oom_diagnoses.front();
  item.measured = r.num_ooms == 1 ? fmt::format("1 OOM{}", AtStep(o.step, in.has_steps))
                                  : fmt::format("{} OOMs, the first{}", r.num_ooms,
                                                AtStep(o.step, in.has_steps));
  if (o.cause == OomCause::kAddressSpace) {
    item.detail = fmt::format(
        "the simulator's limit: {} requested ({} needed) with {} free on the device, but no room "
        "left in the simulator's modelled address space ({} of segments)",
        FormatBytes(o.requested), FormatBytes(o.needed),
        FormatBytes(o.device_free.value_or(0) + o.free_unusable),
        FormatBytes(model::kModelledAddressSpaceBytes));
  } else if (o.cause == OomCause::kFragmentation) {
    item.detail = fmt::format(
        "fragmentation: {} requested ({} needed) while {} sat free in gaps (largest free block "
        "{}){}",
        FormatBytes(o.requested), FormatBytes(o.needed), FormatBytes(o.free_unusable),
        FormatBytes(o.largest_free_block),
        o.device_free ? fmt::format(" and the driver had {} free", FormatBytes(*o.device_free))
                      : std::string());
  } else {
    item.detail =
        fmt::format("real shortage: {} requested ({} needed), {} short", FormatBytes(o.requested),
                    FormatBytes(o.needed), FormatBytes(o.margin));
  }
  return item;
}

CheckItem CapacityItem(const CheckDeviceInput& in, const CheckLimits& limits) {
  const DeviceReport& r = *in.report;
  CheckItem item{r.device, "capacity", CheckOutcome::kSkipped, "", "", ""};
  if (!limits.capacity) {
    item.detail = "no --capacity given";
    return item;
  }
  item.limit = fmt::format("<= {}", FormatBytes(*limits.capacity));
  if (in.replayed) {
    item.detail = "the requests were replayed on a device of this size: see the oom check";
    return item;
  }
  const std::uint64_t need = r.peak_reserved.bytes + limits.used_by_others;
  item.measured =
      limits.used_by_others > 0
          ? fmt::format("{} (peak reserved {} + used by others {})", FormatBytes(need),
                        FormatBytes(r.peak_reserved.bytes), FormatBytes(limits.used_by_others))
          : fmt::format("{} peak reserved", FormatBytes(need));
  if (need <= *limits.capacity) {
    item.outcome = CheckOutcome::kPass;
    item.detail = fmt::format("fits with {} to spare", FormatBytes(*limits.capacity - need));
  } else {
    item.outcome = CheckOutcome::kFail;
    item.detail = fmt::format(
        "the run reserved {} more than the device has{}; replay its requests with `fragscope "
        "replay` to see where it would fail",
        FormatBytes(need - *limits.capacity), AtStep(r.peak_reserved.when.step, in.has_steps));
  }
  return item;
}

CheckItem PeakItem(const CheckDeviceInput& in, const CheckLimits& limits) {
  const DeviceReport& r = *in.report;
  CheckItem item{r.device, "peak_reserved", CheckOutcome::kSkipped, "", "", ""};
  item.measured =
      FormatBytes(r.peak_reserved.bytes) + AtStep(r.peak_reserved.when.step, in.has_steps);
  if (!limits.max_peak_reserved) {
    item.detail = "no --max-peak-reserved given";
    return item;
  }
  item.limit = fmt::format("<= {}", FormatBytes(*limits.max_peak_reserved));
  if (r.peak_reserved.bytes <= *limits.max_peak_reserved) {
    item.outcome = CheckOutcome::kPass;
  } else {
    item.outcome = CheckOutcome::kFail;
    item.detail = fmt::format("{} over the limit",
                              FormatBytes(r.peak_reserved.bytes - *limits.max_peak_reserved));
  }
  return item;
}

CheckItem FragmentationItem(const CheckDeviceInput& in, const CheckLimits& limits) {
  const DeviceReport& r = *in.report;
  CheckItem item{r.device, "fragmentation", CheckOutcome::kSkipped, "", "", ""};
  if (r.worst_fragmentation.seen) {
    item.measured = fmt::format("{:.2f}{} ({})", r.worst_fragmentation_ratio,
                                AtStep(r.worst_fragmentation.when.step, in.has_steps),
                                RatioCondition(r.worst_fragmentation_min_reserved));
  } else {
    item.measured = "no moment with memory allocated and at least half the peak reserved";
  }
  if (!limits.max_fragmentation) {
    item.detail = "no --max-fragmentation given";
    return item;
  }
  item.limit = fmt::format("<= {:.2f}", *limits.max_fragmentation);
  if (!r.worst_fragmentation.seen) {
    MissingInput(limits,
                 "no moment of this device held memory allocated with at least half its peak "
                 "reserved to measure",
                 &item);
    return item;
  }
  if (r.worst_fragmentation_ratio <= *limits.max_fragmentation) {
    item.outcome = CheckOutcome::kPass;
  } else {
    item.outcome = CheckOutcome::kFail;
    item.detail = fmt::format("{} of reserved memory sat free but cached (fragmentation ratio)",
                              FormatBytes(r.worst_fragmentation.bytes));
  }
  return item;
}

CheckItem ForecastItem(const CheckDeviceInput& in, const CheckLimits& limits) {
  CheckItem item{in.report->device, "forecast", CheckOutcome::kSkipped, "", "", ""};
  if (limits.fail_at_level == RiskLevel::kUnknown && !limits.max_oom_risk) {
    item.detail = "forecast not checked (--fail-at never)";
    return item;
  }
  if (limits.fail_at_level != RiskLevel::kUnknown) {
    item.limit = fmt::format("below {}", RiskLevelName(limits.fail_at_level));
  } else {
    item.limit = "any level";
  }
  if (!in.report->forecast) {
    item.detail = "no forecast for this device";
    if (limits.forecast_asked) MissingInput(limits, item.detail, &item);
    return item;
  }
  const DeviceForecast& f = *in.report->forecast;
  if (!f.enough_data || f.worst == RiskLevel::kUnknown) {
    item.measured = "unknown";
    item.detail = f.notes.empty() ? "not enough data for a forecast" : f.notes.front();
    // The default level alone does not fail a short run; a forecast the user asked for does.
    if (limits.forecast_asked) MissingInput(limits, item.detail, &item);
    return item;
  }
  // The first sample at the worst level says when and why.
  ForecastPoint at = f.last;
  for (const ForecastPoint& p : f.changes) {
    if (p.level == f.worst) {
      at = p;
      break;
    }
  }
  const std::string_view unit = f.unit == "step" ? "step" : "window";
  item.measured = fmt::format("{} at {} {}", RiskLevelName(f.worst), unit, at.step);
  if (at.steps_to_oom) item.measured += fmt::format(" (~{} {}s to OOM)", *at.steps_to_oom, unit);
  item.detail = at.reason;
  item.outcome = limits.fail_at_level != RiskLevel::kUnknown && f.worst >= limits.fail_at_level
                     ? CheckOutcome::kFail
                     : CheckOutcome::kPass;
  if (limits.max_oom_risk) {
    item.limit += fmt::format(", P(OOM within {} {}s) < {:.3g}%", f.risk_horizon, unit,
                              100 * *limits.max_oom_risk);
    const double p = f.riskiest ? f.riskiest->risk->At(f.risk_horizon).value_or(0) : 0.0;
    if (f.riskiest) {
      item.measured += fmt::format("; P(OOM within {} {}s) up to {:.1f}% at {} {}", f.risk_horizon,
                                   unit, 100 * p, unit, f.riskiest->step);
    } else if (f.last.risk) {
      // A young tail's risk (before tail_warning_steps, docs/forecast.md "The first risk") is
      // given but does not gate, as it sets no level above watch.
      item.measured +=
          fmt::format("; P(OOM within {} {}s) below 0.1% throughout{}", f.risk_horizon, unit,
                      f.last.risk->young_tail ? " (a young tail's risk does not gate)" : "");
    } else {
      item.measured += "; no OOM risk (no capacity, or too few steps)";
      const std::string why =
          "--max-oom-risk: the run gave no OOM risk (it needs the device's capacity and enough "
          "steps: docs/forecast.md, \"OOM risk\")";
      if (limits.allow_missing) {  // the level's verdict stands; the risk part is skipped
        item.detail += (item.detail.empty() ? "" : "; ") + why + "; skipped (--allow-missing)";
      } else if (item.outcome != CheckOutcome::kFail) {
        MissingInput(limits, why, &item);
      }
      return item;
    }
    if (p >= *limits.max_oom_risk) {
      item.outcome = CheckOutcome::kFail;
      if (limits.fail_at_level == RiskLevel::kUnknown || f.worst < limits.fail_at_level) {
        item.detail = fmt::format("P(OOM within {} {}s) reached {:.1f}%: {}", f.risk_horizon, unit,
                                  100 * p, f.riskiest->risk->advice);
      }
    }
  }
  return item;
}

CheckItem BaselineItem(const CheckDeviceInput& in, const CheckLimits& limits) {
  CheckItem item{in.report->device, "baseline", CheckOutcome::kSkipped, "", "", ""};
  if (!in.baseline) {
    item.detail = "no --baseline given";
    return item;
  }
  const BaselineComparison& b = *in.baseline;
  item.detail = b.sentence;
  item.limit = fmt::format("growth <= {:.2g}x, peak allocated <= +{:.0f}%", limits.max_growth_ratio,
                           100 * limits.max_peak_increase);
  if (!b.has_baseline) {
    if (limits.allow_new_baseline) {
      item.detail += "; allowed as a first run (--allow-new-baseline)";
      return item;
    }
    item.outcome = CheckOutcome::kFail;
    item.measured = "no earlier runs";
    item.detail +=
        "; without a baseline this check would pass anything: record runs first (`fragscope "
        "history record INPUT --arch LABEL`), or pass --allow-new-baseline for a first run";
    return item;
  }
  std::vector<std::string> parts;
  if (b.growth_ratio) parts.push_back(fmt::format("growth {:.2f}x", *b.growth_ratio));
  if (b.peak_allocated_ratio) {
    parts.push_back(fmt::format("peak allocated {:+.1f}%", 100 * (*b.peak_allocated_ratio - 1)));
  }
  for (std::size_t i = 0; i < parts.size(); ++i) item.measured += (i ? ", " : "") + parts[i];
  const bool faster = b.growth_ratio && *b.growth_ratio > limits.max_growth_ratio;
  const bool bigger =
      b.peak_allocated_ratio && *b.peak_allocated_ratio > 1 + limits.max_peak_increase;
  item.outcome = faster || bigger ? CheckOutcome::kFail : CheckOutcome::kPass;
  return item;
}

}  // namespace

std::size_t CheckResult::failed() const {
  return static_cast<std::size_t>(std::count_if(items.begin(), items.end(), [](const CheckItem& i) {
    return i.outcome == CheckOutcome::kFail;
  }));
}

std::vector<CheckItem> CheckDevice(const CheckDeviceInput& input, const CheckLimits& limits) {
  return {OomItem(input),
          CapacityItem(input, limits),
          PeakItem(input, limits),
          FragmentationItem(input, limits),
          ForecastItem(input, limits),
          BaselineItem(input, limits)};
}

std::string_view CheckOutcomeName(CheckOutcome outcome) {
  switch (outcome) {
    case CheckOutcome::kPass:
      return "pass";
    case CheckOutcome::kFail:
      return "FAIL";
    case CheckOutcome::kSkipped:
      break;
  }
  return "skipped";
}

}  // namespace fragscope::analysis
