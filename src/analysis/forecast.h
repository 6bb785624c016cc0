// Forecaster: from the per-step timeline of one device, the risk that the coming steps fail for
// lack of a large enough block (docs/forecast.md). It learns online what the job needs (per-step
// peak demand, its spread and growth, the largest requests) and compares it with what the device
// can still give (capacity, max_allocatable) and with how fast reserved memory grows; it also
// watches the classic signals (a largest free block below the typical large request, allocation
// retries). The fragmentation ratio and a rising reserved/allocated ratio are information: a
// healthy job caches most of what it reserves for reuse, so they set a level only against a
// threshold the caller gives (docs/forecast.md, "Levels").
//
// Online: Observe takes one sample at a time in O(1) time and memory. The model reasons in steps,
// not samples: a sample may cover one step or many (sampling every N steps), and every decay,
// slope and probability is per step.
//
// Thread safety: none; one thread observes.
#ifndef FRAGSCOPE_ANALYSIS_FORECAST_H_
#define FRAGSCOPE_ANALYSIS_FORECAST_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "analysis/analysis_result.h"
#include "analysis/oom_risk.h"
#include "fragscope/risk.h"
#include "fragscope/status.h"

namespace fragscope::analysis {

/// Every threshold of the forecaster. docs/forecast.md justifies each default.
struct ForecastOptions {
  /// Steps per sample the forecaster sees: the timeline's steps are merged N at a time (peaks
  /// kept) before each Observe, as a live agent sampling every N steps would report them.
  std::uint64_t every = 50;
  /// End-of-step fragmentation ratio above which a device is at least "watch". None (the
  /// default): the ratio is information and sets no level; a healthy PyTorch job caches 80-90%
  /// of what it reserves for reuse, so the level comes from the OOM risk and max allocatable.
  std::optional<double> fragmentation_threshold;
  /// Memory of the online estimators, in steps: a sample's weight halves after this many.
  double half_life_steps = 200;
  /// Steps observed before trends and spreads are trusted (cache warm-up).
  std::uint64_t warmup_steps = 20;
  /// Steps of history (after warm-up) a trend needs before it gives a steps-to-OOM.
  std::uint64_t trend_min_steps = 100;
  /// Steps-to-OOM at or below which the level is critical / warning / watch.
  double critical_steps = 50;
  double warning_steps = 300;
  double watch_steps = 3000;
  /// A trend counts only when its slope exceeds this many standard errors.
  double trend_sigmas = 2.0;
  /// Rise of reserved/allocated (at the step's peak) per half-life that counts as "rising" and
  /// sets "watch". None (the default): a ratio's trend is information, as the ratio is.
  std::optional<double> ratio_rise;
  /// Spread multiplier for "the largest request the job makes": mean + z * standard deviation.
  double request_sigmas = 3.0;
  /// Peak reserved at or above this fraction of the capacity counts as "at the device limit".
  double wall_fraction = 0.95;
  /// Bytes of device memory a step needs per byte of peak demand (allocated at the peak):
  /// block rounding, split remainders and gaps the release-and-retry path cannot close. The
  /// demand signals compare peak demand with capacity / allowance.
  double fragmentation_allowance = 1.10;
  /// Signals 1 and 2 divide the capacity by the cache's overhead as the risk model measures it
  /// (peak reserved / step demand at the largest step, at least fragmentation_allowance) once
  /// it is measured (issue 31, third round); off: by fragmentation_allowance always.
  bool measured_signals = true;
  /// A level is held this many steps after its cause was last seen (no flapping).
  double hold_steps = 100;
  /// The demand signals (trend and spread) see the peak demand per block of this many steps
  /// (aligned on step numbers; a sample covering more steps is one block): every = 1 and
  /// every = block_steps then feed them the same numbers, and the spread is a distribution of
  /// block maxima (Gumbel), not of single steps.
  std::uint64_t block_steps = 50;
  /// The calibrated OOM risk (oom_risk.h, docs/forecast.md "OOM risk"): needs a capacity. Its
  /// level joins the signals' levels (the worst wins). Off: the signals alone, no risk.
  bool risk = true;
  OomRiskOptions risk_options;
};

/// Checks ranges (fractions in [0, 1], positive step counts, ordered thresholds).
Status ValidateForecastOptions(const ForecastOptions& options);

/// Exponentially weighted least squares of y over x (steps), O(1) memory: slope per step, the
/// fitted value at the latest x, and the slope's standard error. Exposed for tests.
class DecayingRegression {
 public:
  explicit DecayingRegression(double half_life_steps);
  void Add(double x, double y);
  double weight() const { return s0_; }
  std::uint64_t count() const { return n_; }  // points added (not decayed)
  double slope() const;
  double slope_stderr() const;
  double level() const;  // fitted value at the latest x
  double last_x() const { return x_last_; }
  double mean() const { return s0_ > 0 ? sy_ / s0_ : 0; }
  double stddev() const;  // weighted spread of y around its mean

 private:
  double decay_log2_;  // -1 / half_life
  bool any_ = false;
  std::uint64_t n_ = 0;
  double x_last_ = 0;
  // Sums over points with x measured from x_last_ (the latest point is at 0).
  double s0_ = 0, sx_ = 0, sxx_ = 0, sy_ = 0, syy_ = 0, sxy_ = 0;
};

/// The online forecaster of one device.
class Forecaster {
 public:
  /// `capacity_bytes`: what the process may use (device capacity minus memory used by
  /// others); unknown → only the classic signals, never a steps-to-OOM from the capacity.
  Forecaster(const ForecastOptions& options, std::optional<std::uint64_t> capacity_bytes);

  /// One sample ending at step `step` and covering `steps` steps (>= 1).
  ForecastPoint Observe(const TimelineSample& sample, std::int64_t step, std::uint64_t steps);

 private:
  ForecastOptions options_;
  std::optional<double> capacity_;
  std::uint64_t steps_seen_ = 0;
  std::uint64_t samples_after_warmup_ = 0;
  DecayingRegression pressure_;  // peak reserved (allocator) or peak live requested per sample
  DecayingRegression demand_;    // peak demand per block of block_steps steps
  double demand_survived_ = 0;   // largest peak demand of a sample that did not fail
  // The open demand block: its number (step / block length), peak demand, last step, steps.
  std::optional<std::int64_t> block_id_;
  double block_max_ = 0;
  std::int64_t block_last_ = 0;
  std::uint64_t block_covered_ = 0;
  double block_len_ = 0;  // steps covered by the last closed block
  std::uint64_t steps_after_warmup_ = 0;
  DecayingRegression ratio_;    // peak reserved / peak allocated per sample
  DecayingRegression largest_;  // largest request per sample
  std::optional<std::int64_t> last_release_step_;
  std::uint64_t last_release_retries_ = 0;  // counted retries then; 0: the stand-in
  std::array<std::optional<std::int64_t>, 5> last_raw_at_level_{};  // by RiskLevel
  std::optional<OomRiskModel> risk_;  // with a capacity and options.risk
};

/// Feeds per-step (or per-window) timeline samples to a Forecaster, merging `every` of them per
/// observation, and keeps the compact result: level changes, first warning and critical steps.
/// O(1) memory per sample, apart from the (bounded) list of changes.
class ForecastTrack {
 public:
  ForecastTrack(const ForecastOptions& options, std::optional<std::uint64_t> capacity_bytes,
                bool step_unit);
  /// One closed window. In step units, `step` is its step; in window units it is ignored and
  /// windows are numbered from 0.
  void Add(const TimelineSample& window, std::int64_t step);
  /// Forgets everything (the analyzer restarts its timeline at the first step marker).
  void Reset(bool step_unit);
  /// Observes the last partial group (if any) and returns the result.
  DeviceForecast Finish();

 private:
  void ObserveGroup();

  ForecastOptions options_;
  std::optional<std::uint64_t> capacity_;
  bool step_unit_;
  Forecaster forecaster_;
  DeviceForecast result_;
  std::optional<TimelineSample> group_;
  std::uint64_t group_steps_ = 0;
  std::int64_t group_end_ = -1;
  std::int64_t windows_ = 0;
  std::uint64_t windows_total_ = 0;
};

/// The forecast of a whole per-step timeline (one sample per step, as the analyzer builds it
/// before downsampling): convenience for tests and the evaluation harness.
DeviceForecast ForecastTimeline(const std::vector<TimelineSample>& timeline,
                                const ForecastOptions& options,
                                std::optional<std::uint64_t> capacity_bytes, bool step_unit = true);

}  // namespace fragscope::analysis

#endif  // FRAGSCOPE_ANALYSIS_FORECAST_H_
