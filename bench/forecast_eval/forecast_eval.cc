// forecast_eval: how early, and how falsely, the forecaster warns (docs/forecast.md,
// "Evaluation"). For every request trace (bench/forecast_eval/workloads/*.jsonl.gz, any --trace,
// and the synthetic workloads of synthetic.cc) it finds the smallest device capacity that fits
// by bisection, replays the trace through the simulator at capacities below and above it, runs
// the forecaster (every 1 and every 50 steps) over each replay, and prints one table row per
// (workload, capacity, mode) and the totals against the targets. The "live" modes run the
// daemon's forecaster (analysis::LiveForecasts) on what an agent would send every N steps:
// state at the end of the step, PyTorch's since-start peaks ("liveN") or peaks since the
// previous sample ("liveNr", reset_peaks=True), cumulative retries, the capacity as
// reserved + driver free.
//
// Usage: forecast_eval [--workloads DIR] [--trace FILE]... [--steps N] [--seed N]
//                      [--no-synthetic] [--every A,B] [--live A,B] [--verbose]
//                      [--risk] [--risk-only] [--long-steps N] [--risk-allowance X]
//                      [--risk-opt KEY=VALUE]... (a risk model knob: --help lists them)
//                      [--manifest FILE] [--set tuning|test]
// Every workload belongs to a set (bench/forecast_eval/manifest.txt, issue 31 item 1): `tuning`
// (what defaults may be decided on: the manifest's tuning lines, trace files it does not list,
// and the synthetic workloads) or `test` (held out); totals and the targets are printed per set.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "analysis/forecast.h"
#include "analysis/live_forecast.h"
#include "analysis/replay_result.h"
#include "analysis/timeline.h"
#include "analysis/trace_analyzer.h"
#include "common/units.h"
#include "fragscope/trace.h"
#include "model/request_replayer.h"
#include "synthetic.h"

namespace fs = std::filesystem;
using namespace fragscope;

namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
// Capacities tested, as fractions of the smallest capacity that fits; below it, also the
// largest capacity the bisection saw fail (within 1 MiB of the fit), where the growing
// workloads run longest before their OOM.
constexpr double kBelow[] = {0.90, 0.95, 0.98, 0.99, 0.995};
constexpr double kAbove[] = {1.02, 1.10, 1.25};

struct Workload {
  std::string name;
  std::vector<Event> events;
  std::int64_t steps = 0;
  bool synthetic = false;
  std::string set = "tuning";  // the manifest's set: "tuning" or "test"
};

// The manifest's sets by workload name (lines "SET NAME ARGS...", `#` comments).
std::map<std::string, std::string> ReadManifest(const std::string& path) {
  std::map<std::string, std::string> sets;
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return sets;
  char line[4096];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    char set[64], name[256];
    if (line[0] == '#' || std::sscanf(line, "%63s %255s", set, name) != 2) continue;
    sets[name] = set;
  }
  std::fclose(f);
  return sets;
}

std::int64_t CountSteps(const std::vector<Event>& events) {
  std::int64_t n = 0;
  for (const Event& e : events) n += e.action == Action::kStep;
  return n;
}

// Resampling a captured request trace into a long run (docs/benchmarks.md, "OOM risk
// evaluation"): the setup events and the first `prefix` steps (weights, optimizer state,
// first-step caches) are kept verbatim; every later step is a uniformly drawn source step
// (seeded) after the prefix, its allocations given fresh ids. An allocation that the source
// frees in the same step is freed at the same place; one that the source frees in a later
// step ("carried": gradients, caches) is freed by the next emitted step's first free of a
// carried allocation of the same size, or at that step's end; one the source never frees is
// not emitted (it would leak once per draw). A free of an allocation made before the
// resampled steps (setup, prefix) is emitted once. So every emitted step has the allocation
// pattern of a real step, and the live set cannot drift.
Workload Resample(const Workload& w, std::int64_t steps, std::uint64_t seed,
                  std::int64_t prefix = 2) {
  std::vector<std::size_t> marks;  // index of each step marker
  for (std::size_t i = 0; i < w.events.size(); ++i) {
    if (w.events[i].action == Action::kStep) marks.push_back(i);
  }
  const auto source_steps = static_cast<std::int64_t>(marks.size());
  if (source_steps <= prefix + 1 || source_steps >= steps) return w;
  // Where each allocation's source step and free step are (step -1: setup; INT64_MAX: never).
  std::unordered_map<std::uint64_t, std::pair<std::int64_t, std::int64_t>> life;
  std::unordered_map<std::uint64_t, std::uint64_t> sizes;  // source id -> requested bytes
  std::int64_t current = -1;
  for (const Event& e : w.events) {
    if (e.action == Action::kStep) {
      ++current;
    } else if (e.action == Action::kAlloc) {
      life[e.addr] = {current, INT64_MAX};
      sizes[e.addr] = e.size;
    } else if (e.action == Action::kFreeRequested) {
      auto it = life.find(e.addr);
      if (it != life.end()) it->second.second = current;
    }
  }
  Workload out;
  out.name = fmt::format("{}~{}", w.name, steps);
  out.synthetic = w.synthetic;
  out.set = w.set;
  const std::size_t verbatim_end =
      static_cast<std::size_t>(prefix) < marks.size() ? marks[prefix] : w.events.size();
  out.events.assign(w.events.begin(), w.events.begin() + static_cast<std::ptrdiff_t>(verbatim_end));
  std::uint64_t next_id = 0;
  for (const Event& e : w.events) next_id = std::max(next_id, e.addr);
  std::unordered_map<std::uint64_t, bool> early_freed;  // setup/prefix ids already freed
  for (std::size_t i = 0; i < verbatim_end; ++i) {
    if (w.events[i].action == Action::kFreeRequested) early_freed[w.events[i].addr] = true;
  }
  struct Carried {
    std::uint64_t id, size;
    std::int64_t emitted;
  };
  std::vector<Carried> carried;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::int64_t> pick(prefix, source_steps - 1);
  for (std::int64_t t = prefix; t < steps; ++t) {
    const std::int64_t j = pick(rng);
    const std::size_t begin = marks[j];
    const std::size_t end = j + 1 < source_steps ? marks[j + 1] : w.events.size();
    Event marker = w.events[begin];
    marker.step = t;
    out.events.push_back(marker);
    std::unordered_map<std::uint64_t, std::uint64_t> ids;  // source id -> emitted id
    for (std::size_t i = begin + 1; i < end; ++i) {
      Event e = w.events[i];
      if (e.action == Action::kAlloc) {
        const auto& [born, dies] = life[e.addr];
        if (dies == INT64_MAX) continue;
        const std::uint64_t id = ++next_id;
        if (dies == j) {
          ids[e.addr] = id;
        } else {
          carried.push_back({id, e.size, t});
        }
        e.addr = id;
        out.events.push_back(e);
      } else if (e.action == Action::kFreeRequested) {
        if (auto it = ids.find(e.addr); it != ids.end()) {
          e.addr = it->second;
          out.events.push_back(e);
          continue;
        }
        const auto lit = life.find(e.addr);
        if (lit == life.end()) continue;
        if (lit->second.first < prefix) {  // made in the setup or the prefix
          if (!early_freed[e.addr]) {
            early_freed[e.addr] = true;
            out.events.push_back(e);
          }
          continue;
        }
        // A carried allocation of an earlier emitted step with the source's size.
        const auto sit = sizes.find(e.addr);
        for (std::size_t c = 0; sit != sizes.end() && c < carried.size(); ++c) {
          if (carried[c].emitted < t && carried[c].size == sit->second) {
            e.addr = carried[c].id;
            out.events.push_back(e);
            carried.erase(carried.begin() + static_cast<std::ptrdiff_t>(c));
            break;
          }
        }
      } else {
        out.events.push_back(e);
      }
    }
    // Carried allocations of earlier emitted steps that no free matched: freed now.
    std::vector<Carried> keep;
    for (const Carried& c : carried) {
      if (c.emitted < t) {
        Event f;
        f.action = Action::kFreeRequested;
        f.addr = c.id;
        out.events.push_back(f);
      } else {
        keep.push_back(c);
      }
    }
    carried = std::move(keep);
  }
  out.steps = CountSteps(out.events);
  return out;
}

// A request trace from disk, device 0's events only (plus the step markers).
std::optional<Workload> Load(const std::string& path, std::string* error) {
  auto reader = TraceReader::Open(path);
  if (!reader.ok()) {
    *error = reader.status().message();
    return std::nullopt;
  }
  if ((*reader)->header().kind == TraceKind::kAllocator) {
    *error = path + ": an allocator trace; the evaluation replays request traces";
    return std::nullopt;
  }
  Workload w;
  w.name = fs::path(path).filename().string();
  for (const char* ext : {".jsonl.gz", ".jsonl.zst", ".jsonl"}) {
    const std::string e = ext;
    if (w.name.size() > e.size() && w.name.ends_with(e)) {
      w.name.resize(w.name.size() - e.size());
      break;
    }
  }
  std::optional<std::int32_t> device;
  for (;;) {
    Event e;
    auto more = (*reader)->Next(&e);
    if (!more.ok()) {
      *error = more.status().message();
      return std::nullopt;
    }
    if (!*more) break;
    if (e.action != Action::kStep && e.action != Action::kSnapshot) {
      if (!device) device = e.device;
      if (e.device != *device) continue;
      e.device = 0;
    }
    w.events.push_back(e);
  }
  w.steps = CountSteps(w.events);
  return w;
}

model::SimOptions SimAt(std::uint64_t capacity) {
  model::SimOptions o;
  o.driver.capacity_bytes = capacity;
  return o;
}

// Whether the trace runs to its end at `capacity`; kStop. Errors other than OOM abort.
Result<bool> Fits(const Workload& w, std::uint64_t capacity) {
  model::RequestReplayer r([&](std::int32_t) { return SimAt(capacity); }, model::OomPolicy::kStop,
                           {});
  Status s = r.ConsumeAll(w.events);
  if (s.ok()) return true;
  if (s.code() == StatusCode::kOutOfMemory) return false;
  return s;
}

Result<std::uint64_t> PeakReserved(const Workload& w) {
  model::RequestReplayer r([&](std::int32_t) { return SimAt(analysis::kUnlimitedCapacity); },
                           model::OomPolicy::kStop, {});
  FRAGSCOPE_RETURN_IF_ERROR(r.ConsumeAll(w.events));
  std::uint64_t peak = 0;
  for (const auto& [device, sim] : r.devices()) {
    peak = std::max<std::uint64_t>(peak,
                                   static_cast<std::uint64_t>(sim->stats().reserved_bytes[0].peak));
    if (std::getenv("FORECAST_EVAL_DEBUG")) {
      std::fprintf(
          stderr, "%s: unlimited peak reserved %s, peak allocated %s\n", w.name.c_str(),
          FormatBytes(peak).c_str(),
          FormatBytes(static_cast<std::uint64_t>(sim->stats().allocated_bytes[0].peak)).c_str());
    }
  }
  return peak;
}

// The smallest capacity (to 1 MiB) at which the trace fits, by bisection; `*fails` gets the
// largest capacity seen to fail (within 1 MiB below it).
Result<std::uint64_t> MinimalFit(const Workload& w, std::uint64_t* fails) {
  auto peak = PeakReserved(w);
  if (!peak.ok()) return peak.status();
  std::uint64_t hi = std::max<std::uint64_t>(*peak, kMiB);
  auto fits = Fits(w, hi);
  if (!fits.ok()) return fits.status();
  while (!*fits) {  // the peak of an unlimited device should fit; be safe
    hi *= 2;
    fits = Fits(w, hi);
    if (!fits.ok()) return fits.status();
  }
  std::uint64_t lo = 0;  // does not fit (or zero)
  while (hi - lo > kMiB) {
    const std::uint64_t mid = lo + (hi - lo) / 2;
    auto f = Fits(w, mid);
    if (!f.ok()) return f.status();
    (*f ? hi : lo) = mid;
  }
  *fails = lo;
  return hi;
}

struct Run {
  std::uint64_t capacity = 0;
  double factor = 0;
  std::optional<std::int64_t> oom_step;
  std::string kind = "-";
  std::map<std::string, analysis::DeviceForecast> forecasts;  // by mode
  std::vector<analysis::TimelineSample> timeline;             // per step (want_timeline)
};

// A forecast mode: the analyzer's forecaster sampling every N steps ("N"), or the daemon's on an
// agent's samples every N steps ("liveN", with reset peaks "liveNr").
struct Mode {
  std::string name;
  std::uint64_t every = 1;
  bool live = false;
  bool reset_peaks = false;
};

// The daemon's forecaster over the samples an agent would send from a replay's per-step
// timeline: one after every step s with s % every == 0, before `oom_step` (the failing step's
// sample is never sent).
analysis::DeviceForecast LiveForecast(const std::vector<analysis::TimelineSample>& timeline,
                                      std::optional<std::int64_t> oom_step, std::uint64_t capacity,
                                      const Mode& mode, const analysis::ForecastOptions& options) {
  analysis::DeviceForecast out;
  out.every = mode.every;
  auto live = analysis::LiveForecasts::Create(options, 1);
  if (!live.ok()) return out;
  std::uint64_t peak_allocated = 0, peak_reserved = 0, retries = 0;
  std::optional<RiskLevel> level;
  for (const analysis::TimelineSample& row : timeline) {
    if (oom_step && row.step_last >= *oom_step) break;
    peak_allocated = std::max(peak_allocated, row.peak_allocated_bytes);
    peak_reserved = std::max(peak_reserved, row.peak_reserved_bytes);
    retries += row.alloc_retries;
    // The setup window (before the first step) sends nothing; its peaks and retries count.
    if (row.step_last < 0 || static_cast<std::uint64_t>(row.step_last) % mode.every != 0) {
      continue;
    }
    analysis::LiveSample s;
    s.step = row.step_last;
    s.window = row;
    s.window.peak_allocated_bytes = peak_allocated;
    s.window.peak_reserved_bytes = peak_reserved;
    s.window.peak_live_requested_bytes = 0;  // memory_stats has no such peak
    s.window.largest_request = 0;            // the agent does not know it
    s.window.segment_frees = 0;
    s.window.stranded_bytes = 0;  // nor the stranding threshold
    s.retries_total = retries;
    s.capacity_bytes = capacity;
    const analysis::LiveVerdict v = live->Observe("run", s);
    ++out.samples;
    out.steps_covered = static_cast<std::uint64_t>(row.step_last) + 1;
    if (!level || v.point.level != *level) out.changes.push_back(v.point);
    level = v.point.level;
    if (v.point.level >= RiskLevel::kWarning && !out.first_warning_step) {
      out.first_warning_step = row.step_last;
    }
    if (mode.reset_peaks) peak_allocated = peak_reserved = 0;
  }
  return out;
}

Result<Run> ReplayAt(const Workload& w, std::uint64_t capacity, const std::vector<Mode>& modes,
                     const analysis::ForecastOptions& base, bool want_timeline) {
  std::vector<std::uint64_t> periods;
  bool any_live = want_timeline;
  for (const Mode& m : modes) {
    if (m.live) {
      any_live = true;
    } else {
      periods.push_back(m.every);
    }
  }
  TraceHeader header;
  header.kind = TraceKind::kAllocator;
  header.devices.push_back(DeviceInfo{0, "virtual-gpu", capacity, std::nullopt});
  std::vector<std::unique_ptr<analysis::TraceAnalyzer>> analyzers;
  for (std::uint64_t every : periods) {
    analysis::AnalysisOptions options;
    options.keep_layout = false;
    options.max_timeline_samples = 64;  // the forecaster sees every step before downsampling
    options.forecast = base;
    options.forecast->every = every;
    auto a = analysis::TraceAnalyzer::Create(header, options);
    if (!a.ok()) return a.status();
    analyzers.push_back(std::move(*a));
  }
  if (any_live) {  // the whole per-step timeline, for the agents' samples
    analysis::AnalysisOptions options;
    options.keep_layout = false;
    options.max_timeline_samples = std::size_t{1} << 22;
    auto a = analysis::TraceAnalyzer::Create(header, options);
    if (!a.ok()) return a.status();
    analyzers.push_back(std::move(*a));
  }
  Status sink_status;
  model::RequestReplayer replayer([&](std::int32_t) { return SimAt(capacity); },
                                  model::OomPolicy::kStop,
                                  [&](const Event& e) {
                                    for (auto& a : analyzers) {
                                      Status s = a->Consume(e);
                                      if (!s.ok() && sink_status.ok()) sink_status = s;
                                    }
                                  });
  // Allocation retries from the simulator, as `replay` and `check` give them.
  for (auto& a : analyzers) {
    a->SetAllocRetrySource([&replayer](std::int32_t device) -> std::optional<std::uint64_t> {
      const model::CachingAllocatorSim* sim = replayer.sim(device);
      if (sim == nullptr) return std::nullopt;
      return static_cast<std::uint64_t>(std::max<std::int64_t>(sim->stats().num_alloc_retries, 0));
    });
  }
  Status s = replayer.ConsumeAll(w.events);
  if (!sink_status.ok()) return sink_status;
  if (!s.ok() && s.code() != StatusCode::kOutOfMemory) return s;
  Run run;
  run.capacity = capacity;
  if (!replayer.ooms().empty()) run.oom_step = replayer.ooms().front().step;
  for (std::size_t i = 0; i < periods.size(); ++i) {
    analysis::AnalysisResult result = analyzers[i]->Finish(w.name);
    if (result.devices.empty()) continue;
    const analysis::DeviceReport& d = result.devices.front();
    if (!d.oom_diagnoses.empty()) {
      run.kind = std::string(analysis::OomCauseName(d.oom_diagnoses.front().cause));
    }
    if (d.forecast) run.forecasts[fmt::format("{}", periods[i])] = *d.forecast;
  }
  if (any_live) {
    analysis::AnalysisResult result = analyzers.back()->Finish(w.name);
    if (!result.devices.empty()) {
      const analysis::DeviceReport& d = result.devices.front();
      if (!d.oom_diagnoses.empty()) {
        run.kind = std::string(analysis::OomCauseName(d.oom_diagnoses.front().cause));
      }
      for (const Mode& m : modes) {
        if (m.live)
          run.forecasts[m.name] = LiveForecast(d.timeline, run.oom_step, capacity, m, base);
      }
      if (want_timeline) run.timeline = d.timeline;
    }
  }
  return run;
}

// ---------------------------------------------------------------------------------------------
// The OOM risk evaluation (docs/benchmarks.md, "OOM risk evaluation"): every sample's
// P(OOM within H) against what happened, the lead of the first warning, false warnings.

constexpr std::uint64_t kRiskHorizon = 100;
constexpr double kBuckets[] = {0, 0.01, 0.05, 0.10, 0.20, 0.40, 0.60, 0.80, 1.0000001};
constexpr std::size_t kBucketCount = std::size(kBuckets) - 1;

struct RiskSample {
  std::int64_t step = 0;
  RiskLevel level = RiskLevel::kUnknown;
  std::optional<double> p;  // P(OOM within kRiskHorizon)
};

// The analyzer's forecaster over a replay's per-step timeline, sampling every `every` steps
// (as ForecastTrack merges them), never seeing the failing step.
std::vector<RiskSample> RiskTrack(const std::vector<analysis::TimelineSample>& timeline,
                                  std::optional<std::int64_t> oom_step, std::uint64_t capacity,
                                  std::uint64_t every, const analysis::ForecastOptions& options) {
  std::vector<RiskSample> out;
  analysis::Forecaster f(options, capacity);
  std::optional<analysis::TimelineSample> group;
  std::uint64_t count = 0;
  std::int64_t previous = -1;
  for (const analysis::TimelineSample& row : timeline) {
    if (row.step_last < 0) continue;
    if (oom_step && row.step_last >= *oom_step) break;
    group = group ? analysis::MergeSamples(*group, row) : row;
    if (++count < every) continue;
    const std::uint64_t steps =
        previous < 0 ? count : static_cast<std::uint64_t>(row.step_last - previous);
    const analysis::ForecastPoint p = f.Observe(*group, row.step_last, steps);
    RiskSample r;
    r.step = row.step_last;
    r.level = p.level;
    if (p.risk) r.p = p.risk->At(kRiskHorizon);
    out.push_back(r);
    previous = row.step_last;
    group.reset();
    count = 0;
  }
  return out;
}

struct RiskTotals {
  double brier = 0;
  double brier_positive = 0;                // the part from samples followed by an OOM within H
  std::uint64_t scored = 0, positives = 0;  // samples with a known outcome, OOM within H
  std::uint64_t unscored = 0;               // samples without a risk yet (counted as p = 0)
  std::uint64_t unscored_positives = 0;     // ... followed by an OOM within H
  std::array<std::uint64_t, kBucketCount> n{};
  std::array<double, kBucketCount> p_sum{}, o_sum{};
  std::uint64_t ooms = 0, warned_20 = 0, warned = 0;  // OOMs at step >= 50
  std::uint64_t ooms_60 = 0, warned_60 = 0;  // OOMs at step >= 60, warned before they happen
  std::uint64_t clean_runs = 0, clean_steps = 0, clean_episodes = 0;  // >= 10% headroom
};

void ScoreRisk(const std::vector<RiskSample>& samples, std::optional<std::int64_t> oom_step,
               std::int64_t last_step, bool headroom, RiskTotals* t, std::string* lead_text) {
  for (const RiskSample& r : samples) {
    const std::int64_t until = r.step + static_cast<std::int64_t>(kRiskHorizon);
    int outcome;
    if (oom_step && *oom_step > r.step && *oom_step <= until) {
      outcome = 1;
    } else if ((oom_step && *oom_step > until) || (!oom_step && until <= last_step)) {
      outcome = 0;
    } else {
      continue;  // censored: the run ended (no OOM) within the horizon
    }
    const double p = r.p.value_or(0.0);
    if (!r.p) {
      ++t->unscored;
      t->unscored_positives += static_cast<std::uint64_t>(outcome);
    }
    t->brier += (p - outcome) * (p - outcome);
    if (outcome == 1) t->brier_positive += (p - outcome) * (p - outcome);
    ++t->scored;
    t->positives += static_cast<std::uint64_t>(outcome);
    std::size_t b = 0;
    while (b + 1 < kBucketCount && p >= kBuckets[b + 1]) ++b;
    ++t->n[b];
    t->p_sum[b] += p;
    t->o_sum[b] += outcome;
  }
  if (oom_step && *oom_step >= 50) {
    ++t->ooms;
    std::optional<std::int64_t> first;
    for (const RiskSample& r : samples) {
      if (r.step < *oom_step && r.level >= RiskLevel::kWarning) {
        first = r.step;
        break;
      }
    }
    if (*oom_step >= 60) {
      ++t->ooms_60;
      t->warned_60 += first.has_value();
    }
    if (first) {
      ++t->warned;
      if (*oom_step - *first >= 20) ++t->warned_20;
      *lead_text = fmt::format("{}", *oom_step - *first);
    } else {
      *lead_text = "none";
    }
  }
  if (!oom_step && headroom) {
    ++t->clean_runs;
    t->clean_steps += static_cast<std::uint64_t>(std::max<std::int64_t>(last_step + 1, 0));
    RiskLevel previous = RiskLevel::kUnknown;
    for (const RiskSample& r : samples) {
      if (r.level >= RiskLevel::kWarning && previous < RiskLevel::kWarning) ++t->clean_episodes;
      previous = r.level;
    }
  }
}

// Warning episodes: entries into warning-or-worse from below, before step `before`.
std::uint64_t WarningEpisodes(const analysis::DeviceForecast& f, std::int64_t before) {
  std::uint64_t n = 0;
  RiskLevel previous = RiskLevel::kUnknown;
  for (const analysis::ForecastPoint& p : f.changes) {
    if (p.step >= before) break;
    if (p.level >= RiskLevel::kWarning && previous < RiskLevel::kWarning) ++n;
    previous = p.level;
  }
  return n;
}

// The first step at warning or worse strictly before `before`.
std::optional<std::int64_t> FirstWarningBefore(const analysis::DeviceForecast& f,
                                               std::int64_t before) {
  for (const analysis::ForecastPoint& p : f.changes) {
    if (p.step >= before) break;
    if (p.level >= RiskLevel::kWarning) return p.step;
  }
  return std::nullopt;
}

// Target: a warning >= 20 steps or >= 10% of the run before the OOM. The lead required of a
// run of `run_steps` steps: the smaller of the two (at least 1 step). A lead of r steps is
// possible at all only for an OOM at step >= r.
std::int64_t RequiredLead(std::int64_t run_steps) {
  const auto tenth = static_cast<std::int64_t>(std::ceil(0.1 * static_cast<double>(run_steps)));
  return std::max<std::int64_t>(1, std::min<std::int64_t>(20, tenth));
}

struct Totals {
  std::uint64_t frag_ooms = 0, frag_in_time = 0, frag_warned = 0;
  std::uint64_t possible_frag_ooms = 0, possible_frag_in_time = 0;  // OOM step >= required lead
  std::uint64_t late_frag_ooms = 0, late_frag_in_time = 0;  // OOM after the forecaster's history
  std::uint64_t short_ooms = 0, short_in_time = 0, short_warned = 0;
  std::uint64_t clean_runs = 0, clean_steps = 0, clean_episodes = 0;
};

std::vector<std::uint64_t> ParseList(const std::string& text) {
  std::vector<std::uint64_t> out;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t comma = text.find(',', pos);
    const std::string item =
        text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (!item.empty()) out.push_back(std::strtoull(item.c_str(), nullptr, 10));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

// --risk-opt KEY=VALUE: one knob of the risk model (analysis::OomRiskOptions) for every
// forecaster of the evaluation, to measure a setting without rebuilding. False on an unknown key or
// a malformed value.
bool SetRiskOption(const std::string& kv, analysis::ForecastOptions* forecast) {
  analysis::OomRiskOptions* o = &forecast->risk_options;
  const std::size_t eq = kv.find('=');
  if (eq == std::string::npos) return false;
  const std::string key = kv.substr(0, eq);
  const char* text = kv.c_str() + eq + 1;
  char* end = nullptr;
  const double v = std::strtod(text, &end);
  if (end == text || *end != '\0' || !std::isfinite(v)) return false;
  const auto count = [&](auto* field) {
    if (v < 0) return false;
    *field = static_cast<std::remove_pointer_t<decltype(field)>>(v);
    return true;
  };
  if (key == "min_steps") return count(&o->min_steps);
  if (key == "warmup_steps") return count(&o->warmup_steps);
  if (key == "few_scale_uncertain") return (o->few_scale_uncertain = v != 0), true;
  if (key == "measured_signals") return (forecast->measured_signals = v != 0), true;
  if (key == "min_samples") return count(&o->min_samples);
  if (key == "tail_warning_steps") return count(&o->tail_warning_steps);
  if (key == "window") return count(&o->window);
  if (key == "allowance") return (o->allowance = v), true;
  if (key == "measured_limit") return (o->measured_limit = v != 0), true;
  if (key == "segment_margin") return (o->segment_margin = v), true;
  if (key == "segment_whole") return (o->segment_whole = v != 0), true;
  if (key == "overhead_at_record") return (o->overhead_at_record = v != 0), true;
  if (key == "additive_high") return (o->additive_high = v != 0), true;
  if (key == "ratio_floor") return (o->ratio_floor = v != 0), true;
  if (key == "overhead_weight") return (o->overhead_weight = v), true;
  if (key == "overhead_if_grew") return (o->overhead_if_grew = v != 0), true;
  if (key == "learn_survived") return (o->learn_survived = v != 0), true;
  if (key == "tail_fraction") return (o->tail_fraction = v), true;
  if (key == "tail_weight") return (o->tail_weight = v), true;
  if (key == "use_records") return (o->use_records = v != 0), true;
  if (key == "min_shape") return (o->min_shape = v), true;
  if (key == "max_shape") return (o->max_shape = v), true;
  if (key == "half_life_steps") return (o->half_life_steps = v), true;
  if (key == "trend_sigmas") return (o->trend_sigmas = v), true;
  if (key == "use_record") return (o->use_record = v != 0), true;
  if (key == "shape_se_floor") return (o->shape_se_floor = v), true;
  if (key == "prior_shape_sd") return (o->prior_shape_sd = v), true;
  if (key == "prior_scale") return (o->prior_scale = v), true;
  if (key == "few_scale") return (o->few_scale = v), true;
  if (key == "record_all_steps") return (o->record_all_steps = v != 0), true;
  if (key == "warning_probability") return (o->warning_probability = v), true;
  return false;
}

int Usage() {
  std::fputs(
      "usage: forecast_eval [--workloads DIR] [--trace FILE]... [--steps N] [--seed N]\n"
      "                     [--no-synthetic] [--every A,B] [--live A,B] [--verbose]\n"
      "                     [--risk] [--risk-only] [--long-steps N] [--risk-allowance X]\n"
      "                     [--write-resampled DIR] [--risk-opt KEY=VALUE]...\n"
      "                     [--manifest FILE] [--set tuning|test]\n"
      "--set runs one set of the manifest (tuning: its tuning lines, unlisted trace files\n"
      "and the synthetic workloads; test: the held-out lines).\n"
      "--risk adds the OOM risk evaluation (calibration, Brier skill, lead, false warnings);\n"
      "--risk-only runs only it; trace files shorter than --long-steps (default 1000) are\n"
      "resampled to that many steps for it. --risk-opt sets one knob of the risk model\n"
      "(min_steps, warmup_steps, min_samples, tail_warning_steps, window, allowance,\n"
      "tail_fraction, few_scale_uncertain (0 or 1), measured_signals (0 or 1: signals 1\n"
      "and 2 with the measured overhead; a forecaster option),\n"
      "tail_weight, use_records (0 or 1), min_shape, max_shape, half_life_steps,\n"
      "trend_sigmas, use_record (0 or 1), shape_se_floor, prior_shape_sd, prior_scale,\n"
      "few_scale, record_all_steps (0 or 1), measured_limit (0 or 1), segment_margin,\n"
      "segment_whole (0 or 1), overhead_at_record (0 or 1),\n"
      "additive_high (0 or 1), ratio_floor (0 or 1), overhead_weight,\n"
      "overhead_if_grew (0 or 1), learn_survived (0 or 1),\n"
      "warning_probability) for every forecaster: the analyzer's, the agents' and the risk's.\n"
      "Replays request traces at capacities below and above the smallest that fits and\n"
      "reports how early the forecaster warned before each OOM and how often it warned on\n"
      "runs that never fail (docs/forecast.md).\n",
      stderr);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string workloads_dir = "bench/forecast_eval/workloads";
  std::vector<std::string> traces;
  std::int64_t steps = 1000;
  std::uint64_t seed = 1;
  bool synthetic = true;
  bool verbose = false;
  bool risk = false, risk_only = false;
  std::int64_t long_steps = 1000;
  std::optional<double> risk_allowance;
  std::vector<std::string> risk_opts;  // --risk-opt KEY=VALUE: overrides of the risk defaults
  std::string write_dir;               // --write-resampled: the long runs, as request traces
  std::string manifest_path = "bench/forecast_eval/manifest.txt";
  std::string only_set;  // --set: one set only
  std::vector<std::uint64_t> periods = {1, 50};
  std::vector<std::uint64_t> live_periods = {10, 50};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::optional<std::string> {
      if (i + 1 >= argc) return std::nullopt;
      return std::string(argv[++i]);
    };
    std::optional<std::string> v;
    if (a == "--workloads" && (v = value())) {
      workloads_dir = *v;
    } else if (a == "--trace" && (v = value())) {
      traces.push_back(*v);
    } else if (a == "--steps" && (v = value())) {
      steps = std::max<std::int64_t>(2, std::strtoll(v->c_str(), nullptr, 10));
    } else if (a == "--seed" && (v = value())) {
      seed = std::strtoull(v->c_str(), nullptr, 10);
    } else if (a == "--every" && (v = value())) {
      periods = ParseList(*v);
      if (periods.empty() || std::count(periods.begin(), periods.end(), 0u) > 0) return Usage();
    } else if (a == "--live" && (v = value())) {
      live_periods = ParseList(*v);
      if (std::count(live_periods.begin(), live_periods.end(), 0u) > 0) return Usage();
    } else if (a == "--risk") {
      risk = true;
    } else if (a == "--risk-only") {
      risk = risk_only = true;
    } else if (a == "--write-resampled" && (v = value())) {
      write_dir = *v;
    } else if (a == "--risk-allowance" && (v = value())) {
      risk_allowance = std::strtod(v->c_str(), nullptr);
      if (!(*risk_allowance >= 1 && *risk_allowance < 100)) return Usage();
    } else if (a == "--risk-opt" && (v = value())) {
      risk_opts.push_back(*v);
    } else if (a == "--long-steps" && (v = value())) {
      long_steps = std::max<std::int64_t>(2, std::strtoll(v->c_str(), nullptr, 10));
    } else if (a == "--manifest" && (v = value())) {
      manifest_path = *v;
    } else if (a == "--set" && (v = value())) {
      only_set = *v;
      if (only_set != "tuning" && only_set != "test") return Usage();
    } else if (a == "--verbose") {
      verbose = true;
    } else if (a == "--no-synthetic") {
      synthetic = false;
    } else {
      return Usage();
    }
  }

  std::vector<Workload> workloads;
  if (fs::is_directory(workloads_dir)) {
    std::vector<std::string> found;
    for (const auto& entry : fs::directory_iterator(workloads_dir)) {
      const std::string p = entry.path().string();
      if (p.ends_with(".jsonl.gz")) found.push_back(p);
    }
    std::sort(found.begin(), found.end());
    traces.insert(traces.begin(), found.begin(), found.end());
  }
  const std::map<std::string, std::string> sets = ReadManifest(manifest_path);
  for (const std::string& path : traces) {
    std::string error;
    if (auto w = Load(path, &error)) {
      if (auto it = sets.find(w->name); it != sets.end()) w->set = it->second;
      if (!only_set.empty() && w->set != only_set) continue;
      if (risk && w->steps < long_steps) {
        const std::int64_t source = w->steps;
        *w = Resample(*w, long_steps, seed);
        std::fprintf(stderr, "forecast_eval: %s: resampled from %lld to %lld steps\n",
                     w->name.c_str(), static_cast<long long>(source),
                     static_cast<long long>(w->steps));
        if (!write_dir.empty()) {  // for the cost benchmark (docs/benchmarks.md)
          TraceHeader header;
          header.kind = TraceKind::kRequest;
          header.devices.push_back(DeviceInfo{0, "virtual-gpu", std::nullopt, std::nullopt});
          auto out = TraceWriter::Create(write_dir + "/" + w->name + ".jsonl", header);
          Status st = out.ok() ? Status::Ok() : out.status();
          for (std::size_t i = 0; st.ok() && i < w->events.size(); ++i) {
            Event e = w->events[i];
            e.frame = -1;  // frames are not carried over
            st = (*out)->Write(e);
          }
          if (st.ok()) st = (*out)->Close();
          if (!st.ok()) std::fprintf(stderr, "forecast_eval: %s\n", st.message().c_str());
        }
      }
      workloads.push_back(std::move(*w));
    } else {
      std::fprintf(stderr, "forecast_eval: skipped %s: %s\n", path.c_str(), error.c_str());
    }
  }
  if (synthetic && only_set != "test") {
    for (bench::SyntheticWorkload& s : bench::MakeSyntheticWorkloads(steps, seed)) {
      Workload w{s.name, std::move(s.events), 0, true};
      w.steps = CountSteps(w.events);
      workloads.push_back(std::move(w));
    }
  }
  if (workloads.empty()) {
    std::fputs("forecast_eval: no workloads\n", stderr);
    return 2;
  }

  std::vector<Mode> modes;
  if (risk_only) periods.clear(), live_periods.clear();
  for (std::uint64_t every : periods) modes.push_back({fmt::format("{}", every), every});
  for (std::uint64_t every : live_periods) {
    modes.push_back({fmt::format("live{}", every), every, true, false});
    modes.push_back({fmt::format("live{}r", every), every, true, true});
  }
  const analysis::ForecastOptions defaults;
  // The first step at which the demand trend can exist: warm-up plus the history a trend needs,
  // and at least three closed demand blocks. An OOM needs this plus the required lead to be
  // warned in time by the trend or the spread.
  const auto history_step = static_cast<std::int64_t>(
      std::max(defaults.warmup_steps + defaults.trend_min_steps, 3 * defaults.block_steps - 1));
  // Totals by set ("tuning", "test", and each split into trace files "/captured" and
  // synthetic.cc's "/synth") and period.
  std::map<std::pair<std::string, std::size_t>, Totals> totals;  // by set and mode index
  // The risk evaluation's forecasters: the default, and ablations that each switch one signal
  // off (a good forecaster should beat each of them).
  struct Variant {
    std::string name;
    std::uint64_t every;
    analysis::ForecastOptions options;
  };
  std::vector<Variant> variants;
  // The forecaster's options with the --risk-opt overrides: every mode uses them (the
  // analyzer's, the agents' and the risk evaluation's).
  analysis::ForecastOptions tuned;
  if (risk_allowance) tuned.risk_options.allowance = *risk_allowance;
  for (const std::string& kv : risk_opts) {
    if (!SetRiskOption(kv, &tuned)) {
      std::fprintf(stderr, "forecast_eval: bad --risk-opt %s\n", kv.c_str());
      return Usage();
    }
  }
  if (const Status st = analysis::ValidateOomRiskOptions(tuned.risk_options); !st.ok()) {
    std::fprintf(stderr, "forecast_eval: --risk-opt: %s\n", st.message().c_str());
    return 2;
  }
  if (risk) {
    auto with = [&](auto change) {
      analysis::ForecastOptions o = tuned;
      change(o);
      return o;
    };
    variants.push_back({"risk/1", 1, tuned});
    variants.push_back({"risk/10", 10, tuned});
    variants.push_back({"risk/50", 50, tuned});
    variants.push_back(
        {"no-record/1", 1, with([](auto& o) { o.risk_options.use_record = false; })});
    variants.push_back(
        {"no-record/50", 50, with([](auto& o) { o.risk_options.use_record = false; })});
    // The constant allowance instead of the measured overhead (issue 31, second round).
    variants.push_back(
        {"allowance/1", 1, with([](auto& o) { o.risk_options.measured_limit = false; })});
    variants.push_back(
        {"allowance/50", 50, with([](auto& o) { o.risk_options.measured_limit = false; })});
    variants.push_back({"no-tail/1", 1, with([](auto& o) { o.risk_options.use_tail = false; })});
    variants.push_back({"tail-only/1", 1, with([](auto& o) { o.risk_options.tail_weight = 1; })});
    variants.push_back(
        {"no-records/1", 1, with([](auto& o) { o.risk_options.use_records = false; })});
    variants.push_back({"no-trend/1", 1, with([](auto& o) { o.risk_options.use_trend = false; })});
    variants.push_back({"no-cost/1", 1, with([](auto& o) { o.risk_options.use_cost = false; })});
    variants.push_back(
        {"no-crossing/1", 1, with([](auto& o) { o.risk_options.trend_crossing = false; })});
    variants.push_back({"signals/1", 1, with([](auto& o) { o.risk = false; })});
    variants.push_back({"signals/50", 50, with([](auto& o) { o.risk = false; })});
  }
  std::map<std::pair<std::string, std::size_t>, RiskTotals> risk_totals;
  std::vector<std::string> risk_rows;
  std::vector<std::string> brier_rows;  // the default forecaster's errors per run
  fmt::print("{:<28} {:>6} {:>10} {:>9} {:>13} {:>7} {:>7} {:>10} {:>6} {:>8}\n", "workload",
             "steps", "capacity", "x fit", "OOM step", "every", "kind", "first warn", "lead",
             "false/1k");
  for (const Workload& w : workloads) {
    std::uint64_t fails = 0;
    auto fit = MinimalFit(w, &fails);
    if (!fit.ok()) {
      std::fprintf(stderr, "forecast_eval: %s: %s\n", w.name.c_str(),
                   fit.status().message().c_str());
      continue;
    }
    std::vector<double> factors(std::begin(kBelow), std::end(kBelow));
    factors.insert(factors.end(), std::begin(kAbove), std::end(kAbove));
    if (fails > 0) factors.insert(factors.begin() + std::size(kBelow), -1.0);
    const std::int64_t required = RequiredLead(w.steps);
    for (double factor : factors) {
      const auto capacity =
          factor < 0 ? fails
                     : static_cast<std::uint64_t>(std::llround(static_cast<double>(*fit) * factor));
      if (factor < 0) factor = static_cast<double>(fails) / static_cast<double>(*fit);
      auto run = ReplayAt(w, capacity, modes, tuned, risk);
      if (!run.ok()) {
        std::fprintf(stderr, "forecast_eval: %s at %s: %s\n", w.name.c_str(),
                     FormatBytes(capacity).c_str(), run.status().message().c_str());
        continue;
      }
      if (risk) {
        const std::int64_t last = run->timeline.empty() ? -1 : run->timeline.back().step_last;
        const std::int64_t end = run->oom_step.value_or(last);
        std::string leads;
        for (std::size_t v = 0; v < variants.size(); ++v) {
          const auto samples = RiskTrack(run->timeline, run->oom_step, capacity, variants[v].every,
                                         variants[v].options);
          std::string lead;
          for (const std::string& set : {w.set, w.set + (w.synthetic ? "/synth" : "/captured")}) {
            ScoreRisk(samples, run->oom_step, end, factor >= 1.10 - 1e-9, &risk_totals[{set, v}],
                      &lead);
          }
          if (v == 0) {  // the default forecaster's squared errors, per run
            RiskTotals one;
            std::string ignored;
            ScoreRisk(samples, run->oom_step, end, false, &one, &ignored);
            // Allocation retries before the OOM (near misses), and the step of the last one.
            std::uint64_t retries = 0;
            std::optional<std::int64_t> last_retry;
            for (const analysis::TimelineSample& row : run->timeline) {
              if (run->oom_step && row.step_last >= *run->oom_step) break;
              retries += row.alloc_retries;
              if (row.alloc_retries > 0) last_retry = row.step_last;
            }
            brier_rows.push_back(fmt::format(
                "{:<28} {:>9.4f} {:>9} {:>7} {:>7} {:>10.2f} {:>10.2f} {:>8} {:>10}", w.name,
                factor, run->oom_step ? fmt::format("{}", *run->oom_step) : "none", one.scored,
                one.positives, one.brier - one.brier_positive, one.brier_positive, retries,
                last_retry ? fmt::format("{}", *last_retry) : "-"));
          }
          if (!lead.empty()) leads += fmt::format(" {}={}", variants[v].name, lead);
        }
        if (run->oom_step) {
          // Demand (peak allocated + stranded) / capacity: the largest survived, and the
          // failing step's (its partial row), to see where the limit lies in demand units.
          double survived = 0, failing = 0;
          for (const analysis::TimelineSample& row : run->timeline) {
            const double d = static_cast<double>(row.peak_allocated_bytes + row.stranded_bytes) /
                             static_cast<double>(capacity);
            if (row.step_last >= 0 && row.step_last < *run->oom_step)
              survived = std::max(survived, d);
            if (row.step_last == *run->oom_step) failing = std::max(failing, d);
          }
          risk_rows.push_back(fmt::format(
              "{:<28} {:>9.4f} OOM at {:>5}, demand/capacity survived {:.3f} failing {:.3f}, "
              "lead:{}",
              w.name, factor, *run->oom_step, survived, failing, leads));
        }
      }
      for (std::size_t mode = 0; mode < modes.size(); ++mode) {
        const std::string& every = modes[mode].name;
        const analysis::DeviceForecast& f = run->forecasts[every];
        Totals tally;
        Totals& t = tally;
        std::string oom = "none", first = "-", lead = "-", rate = "-";
        if (run->oom_step) {
          const std::int64_t at = *run->oom_step;
          oom = fmt::format("{}", at);
          const auto warn = FirstWarningBefore(f, at);
          const bool frag = run->kind == "fragmentation";
          (frag ? t.frag_ooms : t.short_ooms) += 1;
          const bool possible = at >= required;
          const bool late = at >= history_step + required;
          if (frag && possible) ++t.possible_frag_ooms;
          if (frag && late) ++t.late_frag_ooms;
          if (warn) {
            first = fmt::format("{}", *warn);
            lead = fmt::format("{}", at - *warn);
            (frag ? t.frag_warned : t.short_warned) += 1;
            if (at - *warn >= required) {
              (frag ? t.frag_in_time : t.short_in_time) += 1;
              if (frag && possible) ++t.possible_frag_in_time;
              if (frag && late) ++t.late_frag_in_time;
            }
          }
        } else {
          const std::uint64_t episodes = WarningEpisodes(f, INT64_MAX);
          const std::uint64_t covered = std::max<std::uint64_t>(f.steps_covered, 1);
          rate = fmt::format("{:.2f}",
                             1000.0 * static_cast<double>(episodes) / static_cast<double>(covered));
          if (f.first_warning_step) first = fmt::format("{}", *f.first_warning_step);
          ++t.clean_runs;
          t.clean_steps += covered;
          t.clean_episodes += episodes;
        }
        for (const std::string& set : {w.set, w.set + (w.synthetic ? "/synth" : "/captured")}) {
          Totals& sum = totals[{set, mode}];
          sum.frag_ooms += t.frag_ooms;
          sum.frag_in_time += t.frag_in_time;
          sum.frag_warned += t.frag_warned;
          sum.possible_frag_ooms += t.possible_frag_ooms;
          sum.possible_frag_in_time += t.possible_frag_in_time;
          sum.late_frag_ooms += t.late_frag_ooms;
          sum.late_frag_in_time += t.late_frag_in_time;
          sum.short_ooms += t.short_ooms;
          sum.short_in_time += t.short_in_time;
          sum.short_warned += t.short_warned;
          sum.clean_runs += t.clean_runs;
          sum.clean_steps += t.clean_steps;
          sum.clean_episodes += t.clean_episodes;
        }
        fmt::print("{:<28} {:>6} {:>10} {:>9.4f} {:>13} {:>7} {:>7} {:>10} {:>6} {:>8}\n", w.name,
                   w.steps, FormatBytes(capacity), factor, oom, every, run->kind, first, lead,
                   rate);
        if (verbose) {
          for (const analysis::ForecastPoint& p : f.changes) {
            fmt::print("    step {:>6} {:<8} {:>8} {}\n", p.step, RiskLevelName(p.level),
                       p.steps_to_oom ? fmt::format("{}", *p.steps_to_oom) : "-", p.reason);
          }
        }
      }
    }
  }
  fmt::print(
      "\nRequired lead: min(20, 10% of the run's steps), at least 1. \"possible\": OOM step "
      ">= the required lead; \"after history\": OOM step >= {} (first step a trend can "
      "exist) + the required lead.\n",
      history_step);
  const auto pct = [](std::uint64_t a, std::uint64_t b) {
    return b == 0 ? std::string("n/a")
                  : fmt::format("{:.0f}%", 100.0 * static_cast<double>(a) / static_cast<double>(b));
  };
  for (const auto& [key, t] : totals) {
    const std::string& set = key.first;
    const std::string& every = modes[key.second].name;
    fmt::print(
        "{:<9} every {:>7}: fragmentation OOMs warned in time {}/{} ({}; target >= 90%), warned "
        "at all {}/{}; where a lead is possible {}/{} ({}); after history {}/{} ({}); shortage "
        "OOMs warned in time {}/{}; runs that never fail: {} runs, {} steps, {} warning episodes "
        "= {:.2f} per 1000 steps (target <= 1)\n",
        set, every, t.frag_in_time, t.frag_ooms, pct(t.frag_in_time, t.frag_ooms), t.frag_warned,
        t.frag_ooms, t.possible_frag_in_time, t.possible_frag_ooms,
        pct(t.possible_frag_in_time, t.possible_frag_ooms), t.late_frag_in_time, t.late_frag_ooms,
        pct(t.late_frag_in_time, t.late_frag_ooms), t.short_in_time, t.short_ooms, t.clean_runs,
        t.clean_steps, t.clean_episodes,
        t.clean_steps == 0
            ? 0.0
            : 1000.0 * static_cast<double>(t.clean_episodes) / static_cast<double>(t.clean_steps));
  }
  if (risk) {
    fmt::print(
        "\nOOM risk evaluation: OOM runs (lead = steps from the first warning to the OOM)\n");
    for (const std::string& row : risk_rows) fmt::print("{}\n", row);
    fmt::print(
        "\nSquared errors of {} per run (sums over samples with a known outcome; a run's share "
        "of the Brier score is its sum over all samples; allocation retries before the OOM)\n"
        "{:<28} {:>9} {:>9} {:>7} {:>7} {:>10} {:>10} {:>8} {:>10}\n",
        variants.front().name, "workload", "x fit", "OOM step", "samples", "OOM<=H", "err (none)",
        "err (OOM)", "retries", "last retry");
    for (const std::string& row : brier_rows) fmt::print("{}\n", row);
    fmt::print(
        "\n\"no risk (OOM)\": samples before the model gives a risk (scored as p = 0), and how "
        "many "
        "of them an OOM followed within H; \"skill given\": the skill over the samples with a "
        "risk, against their own rate\n");
    fmt::print("{:<9} {:<11} {:>8} {:>6} {:>7} {:>8} {:>14} {:>11} {:>15} {:>24}\n", "set",
               "forecaster", "samples", "rate", "Brier", "skill", "no risk (OOM)", "skill given",
               "warned >= 20", "false warn /1k (runs)");
    for (const auto& [key, t] : risk_totals) {
      const double rate =
          t.scored ? static_cast<double>(t.positives) / static_cast<double>(t.scored) : 0;
      const double bs = t.scored ? t.brier / static_cast<double>(t.scored) : 0;
      const double ref = rate * (1 - rate);
      // Samples without a risk scored p = 0: each contributes its outcome to the Brier sum.
      const std::uint64_t given = t.scored - t.unscored;
      const double given_rate = given ? static_cast<double>(t.positives - t.unscored_positives) /
                                            static_cast<double>(given)
                                      : 0;
      const double given_ref = given_rate * (1 - given_rate);
      const double given_bs =
          given ? (t.brier - static_cast<double>(t.unscored_positives)) / static_cast<double>(given)
                : 0;
      fmt::print(
          "{:<9} {:<11} {:>8} {:>6.3f} {:>7.4f} {:>8} {:>14} {:>11} {:>15} {:>24}\n", key.first,
          variants[key.second].name, t.scored, rate, bs,
          ref > 0 ? fmt::format("{:.3f}", 1 - bs / ref) : "n/a",
          fmt::format("{} ({})", t.unscored, t.unscored_positives),
          given_ref > 0 ? fmt::format("{:.3f}", 1 - given_bs / given_ref) : "n/a",
          fmt::format("{}/{} ({})", t.warned_20, t.ooms,
                      t.ooms ? fmt::format("{:.0f}%", 100.0 * static_cast<double>(t.warned_20) /
                                                          static_cast<double>(t.ooms))
                             : "n/a"),
          fmt::format("{}/{} = {:.2f} ({})", t.clean_episodes, t.clean_steps,
                      t.clean_steps ? 1000.0 * static_cast<double>(t.clean_episodes) /
                                          static_cast<double>(t.clean_steps)
                                    : 0.0,
                      t.clean_runs));
    }
    for (const auto& [key, t] : risk_totals) {
      if ((key.first != "tuning" && key.first != "test") ||
          (variants[key.second].name != "risk/1" && variants[key.second].name != "risk/50")) {
        continue;
      }
      fmt::print(
          "\nReliability at H = {} ({}, {} set): predicted bucket, samples, mean "
          "predicted, observed\n",
          kRiskHorizon, variants[key.second].name, key.first);
      for (std::size_t b = 0; b < kBucketCount; ++b) {
        if (t.n[b] == 0) {
          fmt::print("  [{:.2f}, {:.2f})  {:>7}\n", kBuckets[b], std::min(kBuckets[b + 1], 1.0), 0);
          continue;
        }
        fmt::print("  [{:.2f}, {:.2f})  {:>7}  {:.3f}  {:.3f}\n", kBuckets[b],
                   std::min(kBuckets[b + 1], 1.0), t.n[b], t.p_sum[b] / static_cast<double>(t.n[b]),
                   t.o_sum[b] / static_cast<double>(t.n[b]));
      }
    }
    // The four targets of issue 31 item 4, per set (reported on the test set only).
    for (const std::string set : {"tuning", "test"}) {
      const auto find = [&](const std::string& name) -> const RiskTotals* {
        for (std::size_t v = 0; v < variants.size(); ++v) {
          if (variants[v].name != name) continue;
          auto it = risk_totals.find({set, v});
          return it == risk_totals.end() ? nullptr : &it->second;
        }
        return nullptr;
      };
      const RiskTotals* one = find("risk/1");
      const RiskTotals* fifty = find("risk/50");
      if (one == nullptr || fifty == nullptr) continue;
      const double rate =
          one->scored ? static_cast<double>(one->positives) / static_cast<double>(one->scored) : 0;
      const double bs = one->scored ? one->brier / static_cast<double>(one->scored) : 0;
      const double skill = rate > 0 && rate < 1 ? 1 - bs / (rate * (1 - rate)) : 0;
      const double falses = one->clean_steps ? 1000.0 * static_cast<double>(one->clean_episodes) /
                                                   static_cast<double>(one->clean_steps)
                                             : 0;
      const auto share = [](std::uint64_t a, std::uint64_t b) {
        return b ? static_cast<double>(a) / static_cast<double>(b) : 0.0;
      };
      fmt::print(
          "\nTargets, {} set (H = {}): OOMs after step 50 warned >= 20 steps ahead at every 1: "
          "{}/{} = {:.0f}% (target >= 80%: {}); false warnings at >= 10% headroom: {:.2f} per "
          "1000 steps (target <= 1: {}); Brier skill at every 1: {:.3f} (target >= 0.3: {}); "
          "OOMs after step 60 warned before they happen at every 50: {}/{} = {:.0f}% (target >= "
          "60%: {})\n",
          set, kRiskHorizon, one->warned_20, one->ooms, 100 * share(one->warned_20, one->ooms),
          share(one->warned_20, one->ooms) >= 0.8 ? "met" : "MISSED", falses,
          falses <= 1 ? "met" : "MISSED", skill, skill >= 0.3 ? "met" : "MISSED", fifty->warned_60,
          fifty->ooms_60, 100 * share(fifty->warned_60, fifty->ooms_60),
          share(fifty->warned_60, fifty->ooms_60) >= 0.6 ? "met" : "MISSED");
    }
  }
  return 0;
}
