#include "analysis/forecast.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "analysis/timeline.h"
#include "common/units.h"

namespace fragscope::analysis {

namespace {

std::string Bytes(double bytes) {
  return FormatBytes(bytes <= 0 ? 0 : static_cast<std::uint64_t>(std::llround(bytes)));
}

std::uint64_t RoundSteps(double steps) {
  if (!(steps < 1e15)) return std::uint64_t{1} << 50;
  return steps <= 0 ? 0 : static_cast<std::uint64_t>(std::ceil(steps));
}

struct Finding {
  RiskLevel level = RiskLevel::kOk;
  std::string reason;
};

std::size_t Index(RiskLevel level) { return static_cast<std::size_t>(level); }

}  // namespace

Status ValidateForecastOptions(const ForecastOptions& o) {
  if (o.every == 0) return Status::InvalidArgument("forecast sampling period must be >= 1 step");
  if (o.risk) FRAGSCOPE_RETURN_IF_ERROR(ValidateOomRiskOptions(o.risk_options));
  if (o.block_steps == 0 || o.block_steps > (std::uint64_t{1} << 40)) {
    return Status::InvalidArgument("forecast demand block must be >= 1 step");
  }
  if (o.fragmentation_threshold &&
      !(*o.fragmentation_threshold >= 0 && *o.fragmentation_threshold <= 1)) {
    return Status::InvalidArgument(
        fmt::format("fragmentation threshold {} is outside [0, 1]", *o.fragmentation_threshold));
  }
  if (!(o.fragmentation_allowance >= 1 && o.fragmentation_allowance < 100)) {
    return Status::InvalidArgument(
        fmt::format("fragmentation allowance {} is outside [1, 100)", o.fragmentation_allowance));
  }
  if (!(o.wall_fraction > 0 && o.wall_fraction <= 1)) {
    return Status::InvalidArgument(
        fmt::format("wall fraction {} is outside (0, 1]", o.wall_fraction));
  }
  if (!(o.half_life_steps >= 1 && o.half_life_steps < 1e12)) {
    return Status::InvalidArgument(
        fmt::format("half-life {} must be at least 1 step", o.half_life_steps));
  }
  if (!(o.critical_steps >= 0 && o.critical_steps <= o.warning_steps &&
        o.warning_steps <= o.watch_steps && o.watch_steps < 1e15)) {
    return Status::InvalidArgument(fmt::format(
        "steps-to-OOM thresholds must satisfy 0 <= critical ({}) <= warning ({}) <= watch ({})",
        o.critical_steps, o.warning_steps, o.watch_steps));
  }
  if (!(o.trend_sigmas >= 0 && o.trend_sigmas < 1e6) ||
      !(o.request_sigmas >= 0 && o.request_sigmas < 1e6) ||
      (o.ratio_rise && !(*o.ratio_rise >= 0 && *o.ratio_rise < 1e6)) ||
      !(o.hold_steps >= 0 && o.hold_steps < 1e15)) {
    return Status::InvalidArgument(
        "forecast sigmas, ratio rise and hold steps must be finite and >= 0");
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// DecayingRegression

DecayingRegression::DecayingRegression(double half_life_steps)
    : decay_log2_(-1.0 / std::max(half_life_steps, 1e-9)) {}

void DecayingRegression::Add(double x, double y) {
  if (any_) {
    const double dx = x - x_last_;
    const double w = std::exp2(decay_log2_ * std::max(dx, 0.0));
    s0_ *= w;
    sx_ *= w;
    sxx_ *= w;
    sy_ *= w;
    syy_ *= w;
    sxy_ *= w;
    // Move the origin to x: every old x becomes x_i - dx.
    sxx_ = sxx_ - 2 * dx * sx_ + dx * dx * s0_;
    sxy_ -= dx * sy_;
    sx_ -= dx * s0_;
  }
  any_ = true;
  ++n_;
  x_last_ = x;
  s0_ += 1;
  sy_ += y;
  syy_ += y * y;
}

double DecayingRegression::slope() const {
  if (s0_ <= 0) return 0;
  const double mx = sx_ / s0_, my = sy_ / s0_;
  const double varx = sxx_ / s0_ - mx * mx;
  if (!(varx > 1e-12)) return 0;
  return (sxy_ / s0_ - mx * my) / varx;
}

double DecayingRegression::slope_stderr() const {
  if (s0_ <= 2) return std::numeric_limits<double>::infinity();
  const double mx = sx_ / s0_, my = sy_ / s0_;
  const double varx = sxx_ / s0_ - mx * mx;
  if (!(varx > 1e-12)) return std::numeric_limits<double>::infinity();
  const double cov = sxy_ / s0_ - mx * my;
  const double vary = syy_ / s0_ - my * my;
  const double resid = std::max(vary - cov * cov / varx, 0.0);
  return std::sqrt(resid / (varx * (s0_ - 2)));
}

double DecayingRegression::level() const {
  if (s0_ <= 0) return 0;
  // Fitted value at x = 0 (the latest point): mean_y - slope * mean_x.
  return sy_ / s0_ - slope() * (sx_ / s0_);
}

double DecayingRegression::stddev() const {
  if (s0_ <= 1) return 0;
  const double my = sy_ / s0_;
  return std::sqrt(std::max(syy_ / s0_ - my * my, 0.0));
}

// ---------------------------------------------------------------------------------------------
// Forecaster

Forecaster::Forecaster(const ForecastOptions& options, std::optional<std::uint64_t> capacity_bytes)
    : options_(options),
      pressure_(options.half_life_steps),
      demand_(options.half_life_steps),
      ratio_(options.half_life_steps),
      largest_(options.half_life_steps) {
  if (capacity_bytes && *capacity_bytes > 0) capacity_ = static_cast<double>(*capacity_bytes);
  if (capacity_ && options.risk) risk_.emplace(options.risk_options, *capacity_);
}

ForecastPoint Forecaster::Observe(const TimelineSample& s, std::int64_t step, std::uint64_t steps) {
  steps = std::max<std::uint64_t>(steps, 1);
  steps_seen_ += steps;
  const ForecastOptions& o = options_;
  // Allocator state is known when the sample carries reserved memory (allocator traces,
  // replays, agents); a request trace gives live requested bytes only.
  const bool allocator = s.peak_reserved_bytes > 0 || s.reserved_bytes > 0;
  // Demand: the peak bytes the step held, plus (allocator state) the bytes stranded in gaps
  // between live blocks at its end, which no large request can use and no release can free.
  const double base_demand =
      static_cast<double>(allocator ? std::max(s.peak_allocated_bytes, s.peak_live_requested_bytes)
                                    : s.peak_live_requested_bytes);
  const double cost = allocator ? static_cast<double>(s.stranded_bytes) : 0.0;
  const double demand = base_demand + cost;
  const double pressure =
      static_cast<double>(allocator ? s.peak_reserved_bytes : s.peak_live_requested_bytes);
  const double allocated_peak = static_cast<double>(s.peak_allocated_bytes);
  const double ratio = allocated_peak > 0 ? std::max(1.0, pressure / allocated_peak) : 1.0;
  const double x = static_cast<double>(step);
  const bool warm = steps_seen_ > o.warmup_steps;
  // Demand blocks: the peak demand of each block of block_steps steps (numbered by step, so
  // every = 1 and every = block_steps close the same blocks) feeds the trend and the spread. A
  // block is closed by its last step, by a sample of a later block, or by a sample covering a
  // whole block or more (that sample is the block).
  const auto close_block = [&]() {
    if (block_id_ && block_covered_ > 0) {
      demand_.Add(static_cast<double>(block_last_), block_max_);
      block_len_ = static_cast<double>(block_covered_);
    }
    block_id_.reset();
    block_max_ = 0;
    block_covered_ = 0;
  };
  const auto block = static_cast<std::uint64_t>(std::max<std::int64_t>(step, 0)) / o.block_steps;
  if (block_id_ && *block_id_ != static_cast<std::int64_t>(block)) close_block();
  if (warm) {
    pressure_.Add(x, pressure);
    steps_after_warmup_ += steps;
    if (allocator && allocated_peak > 0) ratio_.Add(x, ratio);
    if (demand > 0) {
      demand_survived_ = std::max(demand_survived_, demand);
      block_id_ = static_cast<std::int64_t>(block);
      block_max_ = std::max(block_max_, demand);
      block_last_ = step;
      block_covered_ += steps;
      if (steps >= o.block_steps || (static_cast<std::uint64_t>(step) + 1) % o.block_steps == 0) {
        close_block();
      }
    }
    if (s.largest_request > 0) largest_.Add(x, static_cast<double>(s.largest_request));
    ++samples_after_warmup_;
  }
  // Release-and-retry: counted retries (sources with memory_stats: replays), or, for every
  // allocator source, segments released while peak reserved was at the device limit (the
  // stand-in for traces and snapshots, which do not record retries).
  if (s.alloc_retries > 0) {
    last_release_step_ = step;
    last_release_retries_ = s.alloc_retries;
  } else if (allocator && s.segment_frees > 0 && capacity_ &&
             static_cast<double>(s.peak_reserved_bytes) >= o.wall_fraction * *capacity_) {
    last_release_step_ = step;
    last_release_retries_ = 0;
  }

  // The risk model sees every step's demand from its own warm-up (none by default: a step's
  // peak is a real demand from the first step on), and measures the cache's overhead that
  // signals 1 and 2 use below.
  const bool risk_warm = steps_seen_ > o.risk_options.warmup_steps;
  if (risk_ && risk_warm && demand > 0) {
    DemandTrend trend;  // none unless signal 1's trend is significant
    if (steps_after_warmup_ >= o.trend_min_steps && demand_.count() >= 3 && demand_.slope() > 0 &&
        demand_.slope() > o.trend_sigmas * demand_.slope_stderr()) {
      trend.slope = demand_.slope();
      trend.slope_stderr = demand_.slope_stderr();
      // The fitted level at the last closed block, carried forward to this step (as signal 1).
      trend.level =
          std::max(demand, demand_.level() + trend.slope * std::max(x - demand_.last_x(), 0.0));
    }
    const double resting =
        static_cast<double>(allocator ? s.allocated_bytes : s.live_requested_bytes);
    risk_->Add(step, steps, base_demand, cost, trend, resting,
               allocator ? static_cast<double>(s.peak_reserved_bytes) : 0.0,
               static_cast<double>(s.largest_request));
  }

  std::vector<Finding> findings;
  std::optional<double> steps_to_oom;
  std::string steps_reason;
  auto consider_steps = [&](double t, std::string reason) {
    if (!steps_to_oom || t < *steps_to_oom) {
      steps_to_oom = t;
      steps_reason = std::move(reason);
    }
  };

  if (capacity_) {
    const double cap = *capacity_;
    // What the device holds: capacity / allowance. A job that already survived a larger peak
    // demand on it shows the allowance was too cautious for it; the limit then lies somewhere
    // between that peak and the capacity: take the midpoint.
    // The device bytes per byte of demand: the cache's overhead as the risk model measured it
    // at the largest step (at least the allowance), or the allowance before it is measured.
    const std::optional<OomRisk::Overhead> overhead =
        risk_ && o.measured_signals ? risk_->Overhead() : std::nullopt;
    // The allowance stays the least overhead assumed (--forecast-allowance), as in the risk.
    const double allowance = std::max(overhead ? overhead->ratio : 0.0, o.fragmentation_allowance);
    const std::string allowance_text =
        !overhead ? fmt::format("{:.2f} allowance", allowance)
        : overhead->measured_ratio < allowance
            ? fmt::format("x{:.2f}: measured x{:.2f} at step {}, at least the allowance", allowance,
                          overhead->measured_ratio, overhead->step)
            : fmt::format("x{:.2f} measured at step {}", allowance, overhead->step);
    const double usable =
        std::max(cap / allowance, demand_survived_ + std::max(cap - demand_survived_, 0.0) / 2);
    const bool trend_ready = steps_after_warmup_ >= o.trend_min_steps;
    // 1. Trend: the per-block peak demand grows toward what the device can hold.
    if (trend_ready && demand_.count() >= 3) {
      const double slope = demand_.slope();
      const double se = demand_.slope_stderr();
      if (slope > 0 && slope > o.trend_sigmas * se) {
        // The fitted level at the last closed block, carried forward to this step.
        const double now =
            std::max(demand, demand_.level() + slope * std::max(x - demand_.last_x(), 0.0));
        const double t = std::max(usable - now, 0.0) / slope;
        consider_steps(t, fmt::format("peak {} grows {}/step, now {}; the device holds about {} "
                                      "({} / {})",
                                      allocator ? "allocated" : "live", Bytes(slope), Bytes(now),
                                      Bytes(usable), Bytes(cap), allowance_text));
      }
    }
    // 2. Spread: a step whose peak demand exceeds what the device can hold. The block maxima
    // follow an extreme-value (Gumbel) law whose location and scale come from their weighted
    // mean and deviation; P(a block's peak > usable) per block, turned into a per-step
    // probability, gives the expected steps until one: 1 / p.
    if (trend_ready && demand_.count() >= 5 && demand > 0 && block_len_ > 0) {
      const double m = demand_.mean();
      const double sd = demand_.stddev();
      if (sd > 1e-4 * m) {
        constexpr double kEulerGamma = 0.5772156649015329;
        constexpr double kPi = 3.141592653589793;
        const double beta = sd * std::sqrt(6.0) / kPi;
        const double mu = m - kEulerGamma * beta;
        const double z = (usable - mu) / beta;
        const double p_block = -std::expm1(-std::exp(-z));
        if (p_block > 0) {
          const double p_step = p_block >= 1 ? 1.0 : -std::expm1(std::log1p(-p_block) / block_len_);
          if (p_step > 0) {
            consider_steps(1.0 / p_step,
                           fmt::format("peak {} per {} steps {} ± {}: a block needing more than "
                                       "the {} the device holds has probability {:.2g}",
                                       allocator ? "allocated" : "live", block_len_, Bytes(m),
                                       Bytes(sd), Bytes(usable), p_block));
          }
        }
      }
    }
    // The cache's own growth: peak reserved reaches the device limit (afterwards the allocator
    // must release cached segments and retry to go on).
    if (allocator && trend_ready && pressure_.count() >= 3 && pressure < o.wall_fraction * cap) {
      const double slope = pressure_.slope();
      if (slope > 0 && slope > o.trend_sigmas * pressure_.slope_stderr()) {
        const double t = (cap - std::max(pressure, pressure_.level())) / slope;
        if (t <= o.watch_steps) {
          findings.push_back(
              {RiskLevel::kWatch, fmt::format("peak reserved grows {}/step and reaches the device "
                                              "limit in ~{} steps",
                                              Bytes(slope), RoundSteps(t))});
        }
      }
    }
    // 3. The largest request the job makes against the largest block obtainable now.
    if (allocator && samples_after_warmup_ >= 1 && largest_.weight() > 0) {
      const double typical = largest_.mean();
      const double big = typical + o.request_sigmas * largest_.stddev();
      const double m = static_cast<double>(s.max_allocatable);
      // Why, when the cache holds the bytes but not in one piece (the classic fragmentation
      // signal): said with the level, never a level by itself, since while the device can
      // still give a segment that large, a scattered cache costs nothing (issue 29 item 3).
      const std::string scattered =
          static_cast<double>(s.cached_free_bytes) >= typical
              ? fmt::format(" ({} cached free, scattered: its largest free block is {})",
                            Bytes(static_cast<double>(s.cached_free_bytes)),
                            Bytes(static_cast<double>(s.largest_free_block)))
              : std::string();
      if (m < typical) {
        findings.push_back(
            {RiskLevel::kCritical, fmt::format("the largest block obtainable now, {}, is below the "
                                               "job's typical largest request, {}{}",
                                               Bytes(m), Bytes(typical), scattered)});
      } else if (m < big) {
        findings.push_back(
            {RiskLevel::kWarning, fmt::format("the largest block obtainable now, {}, is below the "
                                              "job's large requests (up to {}){}",
                                              Bytes(m), Bytes(big), scattered)});
      }
    }
  }
  if (steps_to_oom) {
    RiskLevel level = RiskLevel::kOk;
    if (*steps_to_oom <= o.critical_steps) {
      level = RiskLevel::kCritical;
    } else if (*steps_to_oom <= o.warning_steps) {
      level = RiskLevel::kWarning;
    } else if (*steps_to_oom <= o.watch_steps) {
      level = RiskLevel::kWatch;
    }
    if (level != RiskLevel::kOk) {
      findings.push_back(
          {level, fmt::format("~{} steps to OOM: {}", RoundSteps(*steps_to_oom), steps_reason)});
    }
  }
  // The calibrated risk: P(OOM within H steps) from the demand distribution's tail, moved by
  // the demand trend of signal 1 when significant (observed above, before the signals).
  std::optional<OomRisk> risk;
  if (risk_ && risk_warm) risk = risk_->Estimate();
  if (risk) risk->young_tail = risk_->YoungTail();
  if (risk) {
    const RiskLevel level = risk_->Level(*risk);
    if (level > RiskLevel::kOk) {
      std::string horizons;
      for (const OomRisk::Horizon& h : risk->horizons) {
        horizons += fmt::format("{}{} steps {:.0f}%", horizons.empty() ? "" : ", ", h.steps,
                                100 * h.probability);
      }
      findings.push_back(
          {level,
           fmt::format(
               "P(OOM within {}); the device serves {}–{}: {}{}{}", horizons,
               Bytes(risk->limit_low_bytes), Bytes(risk->limit_high_bytes), risk->explanation,
               risk->tail_only ? " (above every step seen: the tail model's estimate)" : "",
               risk_->YoungTail()
                   ? fmt::format("; a young tail (under {} steps, every step below {}): watch "
                                 "at most",
                                 o.risk_options.tail_warning_steps,
                                 Bytes(*capacity_ / o.risk_options.allowance))
                   : "")});
    }
  }
  // 4. Release-and-retry: the allocator hit the device limit and freed its cache to go on.
  if (last_release_step_ && static_cast<double>(step - *last_release_step_) <= o.hold_steps) {
    findings.push_back(
        {RiskLevel::kWatch,
         last_release_retries_ > 0
             ? fmt::format("{} allocation {}: the allocator hit the device limit, released "
                           "cached segments and retried (step {})",
                           last_release_retries_, last_release_retries_ == 1 ? "retry" : "retries",
                           *last_release_step_)
             : fmt::format("the allocator hit the device limit and released cached "
                           "segments to retry (step {})",
                           *last_release_step_)});
  }
  // 5. Reserved/allocated at the peak keeps rising: fragmentation accumulates. A ratio's trend
  // alone is information (the demand signals see what it costs: stranded bytes); a level only
  // against a threshold the caller gave.
  if (o.ratio_rise && steps_after_warmup_ >= o.trend_min_steps && ratio_.count() >= 3) {
    const double slope = ratio_.slope();
    const double rise = slope * o.half_life_steps;
    if (rise > *o.ratio_rise && slope > o.trend_sigmas * ratio_.slope_stderr()) {
      findings.push_back(
          {RiskLevel::kWatch, fmt::format("reserved/allocated at the peak rises: {:.2f}, +{:.2f} "
                                          "per {} steps",
                                          ratio, rise, o.half_life_steps)});
    }
  }
  // 6. Classic: much of the cache is free at the end of the step. Information, not a risk (a
  // healthy job caches for reuse); a level only against a threshold the caller gave.
  if (o.fragmentation_threshold && allocator && s.allocated_bytes > 0 &&
      s.fragmentation_ratio > *o.fragmentation_threshold) {
    findings.push_back(
        {RiskLevel::kWatch, fmt::format("fragmentation ratio {:.2f} > {:.2f}",
                                        s.fragmentation_ratio, *o.fragmentation_threshold)});
  }
  ForecastPoint point;
  point.step = step;
  point.risk = std::move(risk);
  if (steps_to_oom) point.steps_to_oom = RoundSteps(*steps_to_oom);
  RiskLevel raw = RiskLevel::kOk;
  std::string reason;
  for (const Finding& f : findings) {
    if (f.level > raw) {
      raw = f.level;
      reason = f.reason;
    }
  }
  std::size_t others = 0;
  for (const Finding& f : findings) others += f.level > RiskLevel::kOk && f.reason != reason;
  if (raw == RiskLevel::kOk) {
    reason = !warm       ? fmt::format("warming up ({} of {} steps)", steps_seen_, o.warmup_steps)
             : capacity_ ? fmt::format("peak {} {} of {}", allocator ? "reserved" : "live",
                                       Bytes(pressure), Bytes(*capacity_))
                         : "no risk signal (capacity unknown: no steps-to-OOM)";
  } else if (others > 0) {
    reason += fmt::format(" (+{} more signal{})", others, others == 1 ? "" : "s");
  }
  // Hold: a level stays for hold_steps after its cause was last seen.
  last_raw_at_level_[Index(raw)] = step;
  point.level = raw;
  point.reason = reason;
  for (RiskLevel l : {RiskLevel::kCritical, RiskLevel::kWarning, RiskLevel::kWatch}) {
    if (l <= raw) break;
    const auto& last = last_raw_at_level_[Index(l)];
    if (last && static_cast<double>(step - *last) <= o.hold_steps) {
      point.level = l;
      point.reason = fmt::format("held at {} since step {} ({} now: {})", RiskLevelName(l), *last,
                                 RiskLevelName(raw), reason);
      break;
    }
  }
  return point;
}

// ---------------------------------------------------------------------------------------------
// ForecastTrack

ForecastTrack::ForecastTrack(const ForecastOptions& options,
                             std::optional<std::uint64_t> capacity_bytes, bool step_unit)
    : options_(options),
      capacity_(capacity_bytes),
      step_unit_(step_unit),
      forecaster_(options, capacity_bytes) {
  Reset(step_unit);
}

void ForecastTrack::Reset(bool step_unit) {
  step_unit_ = step_unit;
  forecaster_ = Forecaster(options_, capacity_);
  result_ = DeviceForecast{};
  result_.unit = step_unit ? "step" : "window";
  result_.risk_horizon = options_.risk_options.warning_horizon;
  result_.every = std::max<std::uint64_t>(options_.every, 1);
  group_.reset();
  group_steps_ = 0;
  group_end_ = -1;
  windows_ = 0;
  windows_total_ = 0;
}

void ForecastTrack::Add(const TimelineSample& window, std::int64_t step) {
  if (step_unit_) {
    if (step < 0) return;  // the setup window before the first step marker
  } else {
    step = windows_++;
  }
  ++windows_total_;
  group_ = group_ ? MergeSamples(*group_, window) : window;
  ++group_steps_;
  if (group_steps_ >= result_.every) {
    group_end_ = step;
    ObserveGroup();
  } else {
    group_end_ = step;
  }
}

void ForecastTrack::ObserveGroup() {
  if (!group_) return;
  const std::int64_t previous_end =
      result_.last.level == RiskLevel::kUnknown && result_.samples == 0 ? -1 : result_.last.step;
  std::uint64_t steps = group_steps_;
  if (result_.samples > 0 && group_end_ > previous_end) {
    steps = static_cast<std::uint64_t>(group_end_ - previous_end);  // step numbers may skip
  }
  ForecastPoint p = forecaster_.Observe(*group_, group_end_, steps);
  group_.reset();
  group_steps_ = 0;
  ++result_.samples;
  result_.steps_covered += steps;
  if (result_.changes.empty() || result_.changes.back().level != p.level) {
    if (result_.changes.size() < kMaxForecastChanges) {
      result_.changes.push_back(p);
    } else {
      ++result_.changes_dropped;
    }
  }
  if (p.level >= RiskLevel::kWarning && !result_.first_warning_step) {
    result_.first_warning_step = p.step;
  }
  if (p.level >= RiskLevel::kCritical && !result_.first_critical_step) {
    result_.first_critical_step = p.step;
  }
  result_.worst = std::max(result_.worst, p.level);
  // The riskiest sample is one whose risk may set a level: a young tail's number is given (and
  // scored) but, as its level, does not gate (check --max-oom-risk).
  if (p.risk && !p.risk->young_tail) {
    const std::uint64_t h = options_.risk_options.warning_horizon;
    const double now = p.risk->At(h).value_or(0);
    if (now >= 0.001 && (!result_.riskiest || now > result_.riskiest->risk->At(h).value_or(0))) {
      result_.riskiest = p;
    }
  }
  result_.last = std::move(p);
}

DeviceForecast ForecastTrack::Finish() {
  ObserveGroup();
  DeviceForecast out = result_;
  if (!step_unit_) {
    out.notes.push_back("no step markers: the forecast counts each timeline window as one step");
  }
  if (!capacity_) {
    out.notes.push_back(
        "device capacity unknown: classic signals only, no steps-to-OOM (give the trace "
        "header's capacity_bytes, or replay with --capacity)");
  }
  if (capacity_ && options_.risk && !out.last.risk && windows_total_ >= 2) {
    out.notes.push_back(fmt::format(
        "no OOM risk yet: it needs {} steps after the {}-step warm-up ({} {}{} seen)",
        options_.risk_options.min_steps, options_.risk_options.warmup_steps, out.steps_covered,
        step_unit_ ? "step" : "window", out.steps_covered == 1 ? "" : "s"));
  }
  if (windows_total_ < 2) {
    out.enough_data = false;
    out.changes.clear();
    out.changes_dropped = 0;
    out.first_warning_step.reset();
    out.first_critical_step.reset();
    out.riskiest.reset();
    out.worst = RiskLevel::kUnknown;
    out.last = ForecastPoint{};
    out.last.reason = "not enough data";
    out.notes.insert(
        out.notes.begin(),
        fmt::format("not enough data: {} {}{}; the forecast needs at least 2", windows_total_,
                    step_unit_ ? "step" : "window", windows_total_ == 1 ? "" : "s"));
  } else {
    out.enough_data = true;
  }
  if (out.changes_dropped > 0) {
    out.notes.push_back(fmt::format("{} later level changes were not kept (at most {})",
                                    out.changes_dropped, kMaxForecastChanges));
  }
  return out;
}

DeviceForecast ForecastTimeline(const std::vector<TimelineSample>& timeline,
                                const ForecastOptions& options,
                                std::optional<std::uint64_t> capacity_bytes, bool step_unit) {
  ForecastTrack track(options, capacity_bytes, step_unit);
  for (const TimelineSample& s : timeline) track.Add(s, s.step_last);
  return track.Finish();
}

}  // namespace fragscope::analysis
