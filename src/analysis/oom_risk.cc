#include "analysis/oom_risk.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "common/units.h"
#include "model/allocator_rules.h"

namespace fragscope::analysis {

namespace {

constexpr int kLimitPoints = 5;              // quadrature points over the unknown limit
constexpr int kChunks = 8;                   // piecewise-constant hazard pieces per horizon
constexpr double kMaxSteps = 1e7;            // beyond this, "no OOM expected"
constexpr double kMinScaleFraction = 0.002;  // scale floor: 0.2% of the threshold

std::string RiskBytes(double bytes) {
  return FormatBytes(bytes <= 0 ? 0 : static_cast<std::uint64_t>(std::llround(bytes)));
}

}  // namespace

Status ValidateOomRiskOptions(const OomRiskOptions& o) {
  if (o.horizons.empty() || o.horizons.size() > 16) {
    return Status::InvalidArgument("risk horizons: give 1 to 16 step counts");
  }
  for (std::uint64_t h : o.horizons) {
    if (h == 0 || h > 10'000'000) {
      return Status::InvalidArgument(
          fmt::format("risk horizon {} is outside [1, 10000000] steps", h));
    }
  }
  for (std::uint64_t h : {o.critical_horizon, o.warning_horizon, o.watch_horizon}) {
    if (h == 0 || h > 10'000'000) {
      return Status::InvalidArgument(
          fmt::format("risk level horizon {} is outside [1, 10000000] steps", h));
    }
  }
  for (double p : {o.critical_probability, o.warning_probability, o.watch_probability}) {
    if (!(p > 0 && p <= 1)) {
      return Status::InvalidArgument(fmt::format("risk probability {} is outside (0, 1]", p));
    }
  }
  if (o.min_samples < 4 || o.window < o.min_samples || o.window > 65536 ||
      o.min_steps > 10'000'000) {
    return Status::InvalidArgument("risk window must satisfy 4 <= min_samples <= window <= 65536");
  }
  if (o.tail_warning_steps > 10'000'000) {
    return Status::InvalidArgument(
        fmt::format("risk tail_warning_steps {} is outside [0, 10000000]", o.tail_warning_steps));
  }
  if (!(o.tail_fraction > 0 && o.tail_fraction < 1)) {
    return Status::InvalidArgument("risk tail fraction must be in (0, 1)");
  }
  if (!(o.tail_weight >= 0 && o.tail_weight <= 1)) {
    return Status::InvalidArgument(
        fmt::format("risk tail weight {} is outside [0, 1]", o.tail_weight));
  }
  if (!(o.min_shape <= o.max_shape && o.min_shape >= -1 && o.max_shape < 1)) {
    return Status::InvalidArgument("risk tail shape bounds must satisfy -1 <= min <= max < 1");
  }
  if (!(o.prior_scale >= 0 && o.prior_scale <= 10) || !(o.few_scale >= 0 && o.few_scale <= 10)) {
    return Status::InvalidArgument("risk prior_scale and few_scale must be in [0, 10]");
  }
  if (!(o.shape_se_floor > 0 && o.shape_se_floor <= 10) ||
      !(o.prior_shape_sd >= 0 && o.prior_shape_sd <= 10)) {
    return Status::InvalidArgument(
        "risk shape_se_floor must be in (0, 10] and prior_shape_sd in [0, 10]");
  }
  if (!(o.overhead_weight >= 0 && o.overhead_weight <= 4)) {
    return Status::InvalidArgument(
        fmt::format("risk overhead_weight {} is outside [0, 4]", o.overhead_weight));
  }
  if (!(o.segment_margin >= 0 && o.segment_margin <= 10)) {
    return Status::InvalidArgument(
        fmt::format("risk segment_margin {} is outside [0, 10]", o.segment_margin));
  }
  if (!(o.allowance >= 1 && o.allowance < 100)) {
    return Status::InvalidArgument(
        fmt::format("risk allowance {} is outside [1, 100)", o.allowance));
  }
  if (!(o.half_life_steps >= 1 && o.half_life_steps < 1e12) ||
      !(o.trend_sigmas >= 0 && o.trend_sigmas < 1e6)) {
    return Status::InvalidArgument("risk half-life must be >= 1 step, sigmas finite and >= 0");
  }
  return Status::Ok();
}

double ParetoTail::Exceedance(double x) const {
  const double y = std::max(x - threshold, 0.0);
  if (scale <= 0) return 0;
  if (std::fabs(shape) < 1e-9) return rate * std::exp(-y / scale);
  const double t = 1 + shape * y / scale;
  if (t <= 0) return 0;  // beyond the end of a bounded tail
  return rate * std::pow(t, -1 / shape);
}

std::optional<ParetoTail> FitParetoTail(std::vector<double> excess, double min_shape,
                                        double max_shape) {
  if (excess.size() < 3) return std::nullopt;
  std::sort(excess.begin(), excess.end());
  const double n = static_cast<double>(excess.size());
  double a0 = 0, a1 = 0;
  for (std::size_t i = 0; i < excess.size(); ++i) {
    const double plot = (static_cast<double>(i) + 1 - 0.35) / n;  // plotting position
    a0 += excess[i];
    a1 += (1 - plot) * excess[i];
  }
  a0 /= n;
  a1 /= n;
  ParetoTail tail;
  // Hosking & Wallis: k = a0 / (a0 - 2 a1) - 2, sigma = 2 a0 a1 / (a0 - 2 a1); xi = -k.
  const double d = a0 - 2 * a1;
  if (a0 <= 0) return std::nullopt;
  double shape = d > 0 ? -(a0 / d - 2) : max_shape;
  shape = std::clamp(shape, min_shape, max_shape);
  // Keep the mean of the exceedances, sigma / (1 - xi), whatever the clamp did.
  tail.shape = shape;
  tail.scale = a0 * (1 - shape);
  return tail;
}

void OomRiskModel::Trend::Add(double x, double y) {
  if (any) {
    const double dx = std::max(x - x_last, 0.0);
    const double w = std::exp2(decay_log2 * dx);
    s0 *= w;
    sx *= w;
    sxx *= w;
    sy *= w;
    syy *= w;
    sxy *= w;
    sxx = sxx - 2 * dx * sx + dx * dx * s0;
    sxy -= dx * sy;
    sx -= dx * s0;
  }
  any = true;
  x_last = x;
  s0 += 1;
  sy += y;
  syy += y * y;
}

double OomRiskModel::Trend::Slope() const {
  if (s0 <= 0) return 0;
  const double mx = sx / s0, my = sy / s0;
  const double varx = sxx / s0 - mx * mx;
  if (!(varx > 1e-12)) return 0;
  return (sxy / s0 - mx * my) / varx;
}

double OomRiskModel::Trend::SlopeStderr() const {
  if (s0 <= 2) return std::numeric_limits<double>::infinity();
  const double mx = sx / s0, my = sy / s0;
  const double varx = sxx / s0 - mx * mx;
  if (!(varx > 1e-12)) return std::numeric_limits<double>::infinity();
  const double cov = sxy / s0 - mx * my;
  const double vary = syy / s0 - my * my;
  return std::sqrt(std::max(vary - cov * cov / varx, 0.0) / (varx * (s0 - 2)));
}

OomRiskModel::OomRiskModel(const OomRiskOptions& options, double capacity_bytes)
    : options_(options), capacity_(capacity_bytes) {
  options_.window = std::max<std::size_t>(options_.window, 4);
  const double decay = -1.0 / std::max(options_.half_life_steps, 1e-9);
  base_trend_.decay_log2 = decay;
  cost_trend_.decay_log2 = decay;
  ring_.reserve(options_.window);
}

void OomRiskModel::Add(std::int64_t step, std::uint64_t steps, double base, double cost,
                       std::optional<DemandTrend> demand_trend, double resting,
                       double peak_reserved, double largest_request) {
  const OomRiskOptions& o = options_;
  if (!o.use_cost) cost = 0;
  const bool grew = peak_reserved > reserved_max_;  // the cache had to grow in this sample
  if (peak_reserved > 0) reserved_max_ = std::max(reserved_max_, peak_reserved);
  if (largest_request > 0) request_max_ = std::max(request_max_, largest_request);
  const double x = static_cast<double>(step);
  Point p{x, base, cost, std::max<std::uint64_t>(steps, 1)};
  if (ring_.size() < o.window) {
    ring_.push_back(p);
  } else {
    ring_[next_] = p;
    next_ = (next_ + 1) % o.window;
  }
  steps_ += p.steps;
  if (base + cost > survived_) {
    survived_ = base + cost;
    record_steps_ = steps_;
    record_step_ = step;
    // With overhead_if_grew, only a record step that made the cache grow measures what the
    // cache needs; one served from blocks already cached shows no binding overhead (-1).
    record_reserved_ = !o.overhead_if_grew || grew ? peak_reserved : -1.0;
  }
  // The tail's weight, moved by the evidence for a cap: for an exchangeable demand without
  // one, the largest of N steps lies in the first N - m (m: steps since it was set) with
  // probability (N - m) / N; a capped demand stops setting records. Posterior odds of the
  // tail = prior odds x that likelihood ratio.
  const double odds = o.tail_weight / (1 - o.tail_weight);
  const double ratio = o.use_records ? static_cast<double>(record_steps_) /
                                           static_cast<double>(std::max<std::uint64_t>(steps_, 1))
                                     : 1.0;
  tail_weight_now_ = o.tail_weight >= 1 ? 1.0 : odds * ratio / (1 + odds * ratio);
  cost_now_ = cost;
  resting_ = std::max(resting, 0.0);
  base_trend_.Add(x, base);
  cost_trend_.Add(x, cost);
  // Significant trends only: a slope beyond trend_sigmas standard errors.
  const auto significant = [&](const Trend& t) {
    const double s = t.Slope();
    return s > 0 && s > o.trend_sigmas * t.SlopeStderr() ? s : 0.0;
  };
  cost_slope_ = o.use_cost ? significant(cost_trend_) : 0.0;
  crossing_ = DemandTrend{};
  if (demand_trend) {
    // The caller's demand trend includes the cost's growth: the larger of the two.
    slope_ = std::max(o.use_trend ? std::max(demand_trend->slope, 0.0) : 0.0, cost_slope_);
    if (o.use_trend && demand_trend->slope > 0) crossing_ = *demand_trend;
  } else {
    const double base_slope = o.use_trend ? significant(base_trend_) : 0.0;
    slope_ = base_slope + cost_slope_;
    if (base_slope > 0) {
      // The fitted base at this step (the regression is centred on its latest x) plus the cost.
      const Trend& t = base_trend_;
      const double level = t.sy / t.s0 - base_slope * t.sx / t.s0;
      crossing_ = DemandTrend{slope_, t.SlopeStderr(), level + cost};
    }
  }
  if (!o.trend_crossing) crossing_ = DemandTrend{};
  // The kept demands, moved to what each would need now (the trend since it was seen).
  values_.clear();
  double steps_sum = 0;
  for (const Point& q : ring_) {
    values_.push_back(q.base + q.cost + slope_ * std::max(x - q.x, 0.0));
    steps_sum += static_cast<double>(q.steps);
  }
  mean_steps_ = steps_sum / static_cast<double>(ring_.size());
  std::sort(values_.begin(), values_.end());
  double mean = 0, sq = 0;
  for (double v : values_) mean += v;
  mean /= static_cast<double>(values_.size());
  for (double v : values_) sq += (v - mean) * (v - mean);
  spread_ = values_.size() > 1 ? std::sqrt(sq / static_cast<double>(values_.size() - 1)) : 0;
  // Peaks over threshold: the top tail_fraction of the kept demands (at least 4).
  tail_.reset();
  exceedances_ = 0;
  mean_excess_ = 0;
  const std::size_t n = values_.size();
  if (o.use_tail && n >= o.min_samples) {
    const auto k = std::min<std::size_t>(
        n - 1, std::max<std::size_t>(4, static_cast<std::size_t>(
                                            std::ceil(o.tail_fraction * static_cast<double>(n)))));
    const double u = values_[n - k - 1];
    std::vector<double> excess;
    for (std::size_t i = n - k; i < n; ++i) excess.push_back(values_[i] - u);
    // Ties at the threshold (bounded shapes) give zero exceedances: keep the positive ones.
    excess.erase(std::remove_if(excess.begin(), excess.end(), [](double e) { return e <= 0; }),
                 excess.end());
    const double floor = kMinScaleFraction * std::max(u, 1.0);
    auto tail = FitParetoTail(excess, o.min_shape, o.max_shape);
    if (tail) {
      exceedances_ = excess.size();
      mean_excess_ = tail->scale / (1 - tail->shape);
    }
    if (!tail) {
      // Constant or nearly constant demand: an exponential tail with the floor scale.
      tail = ParetoTail{};
      tail->shape = 0;
      tail->scale = floor;
    }
    tail->threshold = u;
    tail->rate =
        static_cast<double>(std::max<std::size_t>(excess.size(), 1)) / static_cast<double>(n);
    tail->scale = std::max(tail->scale, floor);
    tail_ = tail;
  }
}

double OomRiskModel::StepExceedance(double need) const {
  const std::size_t n = values_.size();
  if (n == 0) return 0;
  // Empirical: the fraction of kept samples whose demand exceeds `need`.
  const auto above = values_.end() - std::upper_bound(values_.begin(), values_.end(), need);
  double p_sample = static_cast<double>(above) / static_cast<double>(n);
  if (tail_ && need >= tail_->threshold) {
    // Above the threshold, two laws: the fitted tail, and the empirical one (a demand that
    // repeats what the window shows and never exceeds it), weighted by the tail's posterior.
    const double w = tail_weight_now_;
    p_sample = w * tail_->Exceedance(need) + (1 - w) * p_sample;
  }
  if (p_sample <= 0) return 0;
  if (p_sample >= 1) return 1;
  // A sample's peak is the largest of mean_steps_ steps: per step, 1 - (1 - P)^(1 / m).
  return -std::expm1(std::log1p(-p_sample) / mean_steps_);
}

double OomRiskModel::BeyondLargest(double need, double largest) const {
  const OomRiskOptions& o = options_;
  if (need <= largest) return 1;
  const double gap = need - largest;
  const double floor = kMinScaleFraction * std::max(largest, 1.0);
  // Gauss-Hermite nodes and weights for a standard normal (5 points).
  constexpr std::array<double, 5> kNodes = {-2.8569700138728056, -1.3556261799742659, 0.0,
                                            1.3556261799742659, 2.8569700138728056};
  constexpr std::array<double, 5> kWeights = {0.011257411327720691, 0.22207592200561266,
                                              0.53333333333333333, 0.22207592200561266,
                                              0.011257411327720691};
  // Before a fit the shape prior is centred at 0 (an exponential tail), or, with the scale's
  // own uncertainty, at 1 / (n - 1): an exponential whose scale comes from n - 1 degrees of
  // freedom is, averaged over that estimate, a Lomax law of that shape (one sample: none).
  const std::size_t kept = values_.size();
  double centre = !o.few_scale_uncertain ? 0.0
                  : kept >= 2            ? 1.0 / static_cast<double>(kept - 1)
                                         : o.max_shape;
  double se = o.prior_shape_sd;
  // The mean excess over the largest step, given the shape xi: with a fit, the Pareto tail
  // above its threshold u carried to the largest (sigma + xi (largest - u)); without one, the
  // prior scale below.
  double prior_mean_excess = 0;
  const bool fitted = tail_ && exceedances_ >= 3;
  if (fitted) {
    centre = tail_->shape;
    se = std::max(1 + centre, o.shape_se_floor) / std::sqrt(static_cast<double>(exceedances_));
  } else {
    constexpr double kEulerGamma = 0.5772156649015329;
    constexpr double kGumbelScale = 0.7796968012336761;  // sqrt(6) / pi
    const std::size_t n = values_.size();
    if (n >= 2) {
      // The kept samples' Gumbel scale, widened for the few points it comes from.
      prior_mean_excess =
          o.few_scale * kGumbelScale * spread_ * std::sqrt(1 + 2.0 / static_cast<double>(n - 1));
    } else if (resting_ > 0 && largest > resting_) {
      // One sample: the exponential scale under which the largest of its N steps rises as far
      // above the resting memory as the one seen, times prior_scale (a fixed-shape job's steps
      // all rise alike, a variable one's spread out: one sample cannot tell).
      // The largest of N exponential steps lies H_N scales above their floor on average, H_N
      // the harmonic number, ln(N + 1/2) + Euler's gamma within 1% from N = 1 on.
      const double n_steps = std::max(WindowSteps(), 1.0);
      prior_mean_excess =
          o.prior_scale * (largest - resting_) / (std::log(n_steps + 0.5) + kEulerGamma);
    }
    prior_mean_excess = std::max(prior_mean_excess, floor);
  }
  double total = 0;
  for (std::size_t i = 0; i < kNodes.size(); ++i) {
    const double xi = std::clamp(centre + se * kNodes[i], o.min_shape, o.max_shape);
    double sigma;
    if (fitted) {
      const double sigma_u = std::max(mean_excess_ * (1 - xi), floor);
      sigma = sigma_u + xi * (largest - tail_->threshold);
    } else {
      sigma = prior_mean_excess * (1 - xi);
    }
    sigma = std::max(sigma, floor);
    double c;
    if (std::fabs(xi) < 1e-9) {
      c = std::exp(-gap / sigma);
    } else {
      const double t = 1 + xi * gap / sigma;
      c = t <= 0 ? 0.0 : std::pow(t, -1 / xi);
    }
    total += kWeights[i] * c;
  }
  return std::clamp(total, 0.0, 1.0);
}

OomRiskModel::Limit OomRiskModel::LimitNow() const {
  const OomRiskOptions& o = options_;
  const double cap = capacity_;
  // A new segment for the largest request must still be obtainable at the peak: the device
  // serves a step only if, besides what it holds, one more segment of that size fits.
  double segment = 0;
  if (o.segment_margin > 0 && request_max_ >= 1) {
    const model::AllocatorRules rules;
    const double whole = static_cast<double>(model::AllocatorRules::SegmentSize(
        rules.RoundSize(static_cast<std::uint64_t>(std::min(request_max_, 1e15)))));
    // The rounding alone (a 20 MiB segment for a 3 MiB request: 17 MiB), or the whole segment.
    segment = o.segment_margin * (o.segment_whole ? whole : std::max(whole - request_max_, 0.0));
  }
  const double room = std::clamp(cap - segment, 0.0, cap);
  const std::optional<Measured> m = MeasuredNow();
  if (!m) {
    // The constant allowance, raised by the largest demand the job survived (which also shows
    // the segment margin too cautious for it: a cached block served that step).
    const double survived = o.learn_survived ? std::min(survived_, cap) : 0.0;
    const double low = std::max(room / o.allowance, survived);
    return {low, std::max(room, low), false, o.allowance, 0};
  }
  const double ratio = m->ratio;
  const double overhead = std::max(m->reserved - survived_, 0.0);
  // The overhead grows with the demand; a larger demand already survived raises the low end.
  const double survived = o.learn_survived ? std::min(survived_, room) : 0.0;
  const double low = std::clamp(std::max(room / ratio, survived), 0.0, cap);
  // The overhead stays as it was (additive_high), or nothing is known beyond the capacity: the
  // cache may release what it holds for other shapes when the device is full.
  const double high = std::clamp(o.additive_high ? room - overhead : room, low, cap);
  return {low, high, true, ratio, m->reserved};
}

std::optional<OomRiskModel::Measured> OomRiskModel::MeasuredNow() const {
  const OomRiskOptions& o = options_;
  if (!o.measured_limit || !(reserved_max_ > 0) || !(survived_ > 0)) return std::nullopt;
  // The cache's overhead at the largest step: the peak reserved bytes of the sample that set the
  // largest step demand, against that demand (what the cache held to serve it: rounding to
  // segments, split remainders, blocks cached for other shapes). Not the run's largest peak
  // reserved: the cache keeps what it once reserved until the device is full, so that one grows
  // with every new shape while the demand does not (docs/benchmarks.md, second round).
  double reserved = reserved_max_;
  if (o.overhead_at_record && record_reserved_ > 0) reserved = record_reserved_;
  if (o.overhead_at_record && record_reserved_ < 0) reserved = 0;  // not binding: the floor
  // The allowance stays the least overhead assumed: a measured ratio only widens the interval.
  const double floor = o.ratio_floor ? o.allowance : 1.0;
  const double measured = std::max(reserved / survived_, floor);
  // overhead_weight w: the ratio used is floor x (measured / floor)^w.
  return Measured{floor * std::pow(measured / floor, o.overhead_weight), reserved};
}

std::optional<OomRisk::Overhead> OomRiskModel::Overhead() const {
  const std::optional<Measured> m = MeasuredNow();
  if (!m) return std::nullopt;
  return OomRisk::Overhead{m->ratio, m->reserved / survived_, m->reserved, survived_, record_step_};
}

std::optional<OomRisk> OomRiskModel::Estimate() const {
  const OomRiskOptions& o = options_;
  if (ring_.empty() || steps_ < o.min_steps || !(capacity_ > 0)) {
    return std::nullopt;
  }
  // Steps seen for the record rate: every step since the start when the demand has no trend
  // (its largest is then the largest ever survived), the window's when it is detrended.
  const double largest = slope_ > 0 ? values_.back() : std::max(values_.back(), survived_);
  const double record_steps = std::max(
      slope_ > 0 && !o.record_all_steps ? WindowSteps() : static_cast<double>(steps_), 1.0);
  const Limit bounds = LimitNow();
  const double high = bounds.high;
  const double low = bounds.low;
  std::array<double, kLimitPoints> limits{};
  for (int j = 0; j < kLimitPoints; ++j) {
    limits[j] = low + (high - low) * (j + 0.5) / kLimitPoints;
  }
  // P(the trend itself reaches `limit` within k steps), its slope being an estimate.
  const auto crossing_at = [&](double limit, double k, double shift) {
    if (!(crossing_.slope > 0) || !(k > 0)) return 0.0;
    const double need = std::max(limit - shift - crossing_.level, 0.0) / k;
    if (!(crossing_.slope_stderr > 0) || !std::isfinite(crossing_.slope_stderr)) {
      return crossing_.slope >= need ? 1.0 : 0.0;
    }
    return 0.5 * std::erfc((need - crossing_.slope) / (crossing_.slope_stderr * std::sqrt(2.0)));
  };
  // P(OOM within k steps), averaged over the limit; `shift` moves every demand (cost removed).
  // Per limit, a step above it (the tail, demands moved by the trend) or the trend reaching it.
  // Per limit, a step above it (below the largest kept step: the kept samples; beyond it: a
  // new largest step, at rate 1 / (N + j) for step j ahead, exceeding the limit with the
  // tail's conditional probability), or the trend reaching it.
  const auto risk_at = [&](double k, double shift) {
    double total = 0;
    for (double limit : limits) {
      double log_survive = std::log1p(-std::min(crossing_at(limit, k, shift), 1.0));
      const int chunks = slope_ > 0 ? kChunks : o.use_record && o.use_tail ? 4 : 1;
      for (int c = 0; c < chunks && std::isfinite(log_survive); ++c) {
        const double mid = k * (c + 0.5) / chunks;
        const double need = limit - slope_ * mid - shift;
        if (o.use_record && o.use_tail && need > largest) {
          // sum over the chunk's steps j of log(1 - q / (N + j)) ~ -q ln((N + b) / (N + a)).
          const double q = BeyondLargest(need, largest);
          const double a = k * c / chunks, b = k * (c + 1) / chunks;
          log_survive -= q * std::log((record_steps + b + 1) / (record_steps + a + 1));
          continue;
        }
        const double p = StepExceedance(need);
        if (p >= 1) {
          log_survive = -std::numeric_limits<double>::infinity();
          break;
        }
        log_survive += (k / chunks) * std::log1p(-p);
      }
      total += -std::expm1(log_survive);
    }
    return total / kLimitPoints;
  };
  OomRisk r;
  std::vector<std::uint64_t> horizons = o.horizons;
  horizons.insert(horizons.end(), {o.critical_horizon, o.warning_horizon, o.watch_horizon});
  std::sort(horizons.begin(), horizons.end());
  horizons.erase(std::unique(horizons.begin(), horizons.end()), horizons.end());
  for (std::uint64_t h : horizons) {
    r.horizons.push_back({h, risk_at(static_cast<double>(h), 0)});
  }
  double mean = 0;
  for (double v : values_) mean += v;
  mean /= static_cast<double>(values_.size());
  r.limit_low_bytes = low;
  r.limit_high_bytes = high;
  if (bounds.measured) {
    r.overhead_ratio = bounds.ratio;
    r.overhead = Overhead();
  }
  r.mean_demand_bytes = mean;
  r.largest_demand_bytes = values_.back();
  r.spread_bytes = spread_;
  r.headroom_bytes = (low + high) / 2 - mean;
  // A spread below 0.01% of the demand is rounding noise (a perfect line detrended).
  if (spread_ > 1e-4 * std::max(std::fabs(mean), 1.0)) {
    r.headroom_spreads = r.headroom_bytes / spread_;
  }
  r.cost_bytes = cost_now_;
  r.slope_bytes_per_step = slope_;
  r.tail_only = largest <= low;
  // Where the number comes from, in one line (issue 31 item 5).
  {
    const auto near =
        values_.end() - std::lower_bound(values_.begin(), values_.end(), low - spread_);
    const double window_steps = WindowSteps();
    const double record_h = static_cast<double>(o.warning_horizon);
    std::string span = fmt::format("the last {} steps", values_.size());
    if (values_.size() == 1) {
      span = fmt::format("the one sample so far ({:.0f} steps)", window_steps);
    } else if (mean_steps_ > 1.5) {
      span = fmt::format("the last {} samples ({:.0f} steps)", values_.size(), window_steps);
    }
    const double mid = (low + high) / 2;
    const bool spread = spread_ > 1e-4 * std::max(largest, 1.0);
    const std::string gap = spread ? fmt::format("{:.1f} spreads", (mid - largest) / spread_)
                                   : RiskBytes(mid - largest);
    r.explanation = fmt::format(
        "{}; the largest, {}, is {} the limit's middle {}; P(a new largest step within {} "
        "steps) = {:.0f}%{}",
        spread ? fmt::format("step demand came within one spread ({}) of the limit's low end {} "
                             "in {} of {}",
                             RiskBytes(spread_), RiskBytes(low), near, span)
               : fmt::format("step demand did not vary over {}", span),
        RiskBytes(largest), largest <= mid ? gap + " below" : std::string("above"), RiskBytes(mid),
        o.warning_horizon, 100 * record_h / (record_steps + record_h),
        slope_ > 0 ? fmt::format("; demand grows {}/step", RiskBytes(slope_)) : std::string());
    if (bounds.measured) {
      // Where the limit comes from: the cache's overhead, as measured.
      const double seen = bounds.reserved / std::max(survived_, 1.0);
      r.explanation += fmt::format(
          "; the limit: the cache reserved {} at its peak for {} of step demand (x{:.2f}{})",
          RiskBytes(bounds.reserved), RiskBytes(survived_), seen,
          seen < bounds.ratio ? fmt::format("; at least x{:.2f} assumed", bounds.ratio)
                              : std::string());
    }
  }
  // Median steps to OOM: the smallest k with risk >= 50%, by doubling then bisection.
  if (risk_at(kMaxSteps, 0) >= 0.5) {
    double lo = 0, hi = 1;
    while (risk_at(hi, 0) < 0.5) {
      lo = hi;
      hi *= 2;
    }
    for (int i = 0; i < 30 && hi - lo > 1; ++i) {
      const double mid = (lo + hi) / 2;
      (risk_at(mid, 0) < 0.5 ? lo : hi) = mid;
    }
    r.steps_to_oom = static_cast<std::uint64_t>(std::ceil(hi));
  }
  // Advice: removing the cache's cost (expandable segments return freed whole pages to the
  // driver, so most stranded gaps can be reused; not the pieces of a page) if that alone
  // brings the warning-horizon risk below the warning threshold; else stopping the growth if
  // the trend more than doubles the watch-horizon risk; otherwise a shape cap.
  const double warn_h = static_cast<double>(o.warning_horizon);
  const double now = risk_at(warn_h, 0);
  const double cap = std::max(low - cost_now_ - slope_ * warn_h, 0.0);
  // P(OOM within the watch horizon) with the whole trend removed (demand held at today's).
  const double watch_h = static_cast<double>(o.watch_horizon);
  const auto flat_risk = [&]() {
    double total = 0;
    for (double limit : limits) {
      const double p = StepExceedance(limit);
      total += p >= 1 ? 1.0 : -std::expm1(watch_h * std::log1p(-p));
    }
    return total / kLimitPoints;
  };
  if (cost_now_ > 0 && now >= o.warning_probability &&
      risk_at(warn_h, -(cost_now_ + cost_slope_ * warn_h)) < o.warning_probability) {
    r.advice = fmt::format(
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: the cache's {} of stranded bytes "
        "are what makes the coming steps not fit (it returns only whole free 20 MiB pages: "
        "check it with replay --alloc-conf before relying on it)",
        RiskBytes(cost_now_));
  } else if (slope_ > 0 && r.steps_to_oom && risk_at(watch_h, 0) > 2 * flat_risk()) {
    r.advice = fmt::format(
        "stop the growth: step demand rises {}/step (a leak, growing shapes or caches, or "
        "stranded bytes accumulating) and meets the limit's low end, {}, in ~{} steps",
        RiskBytes(slope_), RiskBytes(low),
        static_cast<std::uint64_t>(std::max(low - mean, 0.0) / slope_));
  } else {
    r.shape_cap_bytes = static_cast<std::uint64_t>(std::llround(cap));
    r.advice = fmt::format(
        "cap step shapes: a step needing more than {} at its peak (allocated) may not fit; "
        "{:.1f}% of recent steps did",
        RiskBytes(cap),
        100.0 *
            static_cast<double>(values_.end() -
                                std::upper_bound(values_.begin(), values_.end(), cap + cost_now_)) /
            static_cast<double>(values_.size()));
  }
  return r;
}

bool OomRiskModel::YoungTail() const {
  // Early (few exceedances), a risk for a job whose steps all stayed below the limit's low end
  // is the young tail's extrapolation.
  return steps_ < options_.tail_warning_steps && survived_ < capacity_ / options_.allowance;
}

RiskLevel OomRiskModel::Level(const OomRisk& risk) const {
  const OomRiskOptions& o = options_;
  const auto at = [&](std::uint64_t h) {
    for (const OomRisk::Horizon& x : risk.horizons) {
      if (x.steps == h) return x.probability;
    }
    return 0.0;
  };
  RiskLevel level = RiskLevel::kOk;
  if (at(o.critical_horizon) >= o.critical_probability) {
    level = RiskLevel::kCritical;
  } else if (at(o.warning_horizon) >= o.warning_probability) {
    level = RiskLevel::kWarning;
  } else if (at(o.watch_horizon) >= o.watch_probability) {
    level = RiskLevel::kWatch;
  }
  if (YoungTail()) level = std::min(level, RiskLevel::kWatch);
  return level;
}

}  // namespace fragscope::analysis
