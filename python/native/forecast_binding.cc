// The forecaster and tune, bound for fragscope.torch.Monitor (docs/live-monitoring.md): the
// same analysis::LiveForecasts the daemon runs per process (apps/fragscope/serve_services.cc)
// and the same analysis::Tune as `fragscope tune`, so a level or a recommendation in the
// training process is the daemon's and the CLI's, not a Python copy.
#include "forecast_binding.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <pybind11/stl.h>

#include "analysis/live_forecast.h"
#include "analysis/tune.h"
#include "fragscope/event.h"
#include "fragscope/risk.h"
#include "native_common.h"

namespace py = pybind11;

namespace fragscope::python {
namespace {

// Reads an unsigned field of a sample dict; missing or None → nullopt; negative → ValueError.
std::optional<std::uint64_t> U64(const py::dict& d, const char* key) {
  if (!d.contains(key)) return std::nullopt;
  py::object v = d[key];
  if (v.is_none()) return std::nullopt;
  const long long n = v.cast<long long>();
  if (n < 0) throw py::value_error(std::string("sample field '") + key + "' is negative");
  return static_cast<std::uint64_t>(n);
}

std::uint64_t U64Or0(const py::dict& d, const char* key) { return U64(d, key).value_or(0); }

// The sample dict of fragscope_agent (sample_from_memory_stats + summarize_segments fields, the
// agent protocol's names) → the forecaster's LiveSample, as the daemon maps an AgentSample.
analysis::LiveSample ToLiveSample(const py::dict& d, std::int64_t step) {
  analysis::LiveSample live;
  live.step = step;
  analysis::TimelineSample& w = live.window;
  w.step_first = w.step_last = step;
  w.reserved_bytes = U64Or0(d, "reserved_bytes");
  w.allocated_bytes = U64Or0(d, "allocated_bytes");
  w.live_requested_bytes = U64Or0(d, "requested_bytes");
  w.cached_free_bytes = U64Or0(d, "cached_free_bytes");
  w.fragmentation_ratio =
      d.contains("fragmentation_ratio") ? d["fragmentation_ratio"].cast<double>() : 0.0;
  w.largest_free_block = U64Or0(d, "largest_free_block");
  w.max_allocatable = U64Or0(d, "max_allocatable");
  w.stranded_bytes = U64Or0(d, "stranded_bytes");
  w.peak_reserved_bytes = U64Or0(d, "peak_reserved_bytes");
  w.peak_allocated_bytes = U64Or0(d, "peak_allocated_bytes");
  // The largest request counts against what can be obtained only with block-level figures.
  const bool block_level = w.max_allocatable > 0 || w.largest_free_block > 0;
  w.largest_request = block_level ? U64Or0(d, "largest_request_bytes") : 0;
  live.retries_total = U64(d, "num_alloc_retries");
  if (auto free = U64(d, "device_free_bytes")) {
    live.capacity_bytes =
        w.reserved_bytes > UINT64_MAX - *free ? UINT64_MAX : w.reserved_bytes + *free;
  }
  return live;
}

py::dict VerdictDict(const analysis::LiveVerdict& v) {
  py::dict out;
  out["step"] = v.point.step;
  out["level"] = std::string(RiskLevelName(v.point.level));
  out["previous"] = std::string(RiskLevelName(v.previous));
  out["steps_to_oom"] =
      v.point.steps_to_oom ? py::object(py::int_(*v.point.steps_to_oom)) : py::object(py::none());
  out["reason"] = v.point.reason;
  // P(an OOM within H steps) per reported horizon H, once the risk model has enough samples
  // and a capacity; None before.
  if (v.point.risk) {
    py::dict risk;
    for (const auto& h : v.point.risk->horizons) risk[py::int_(h.steps)] = h.probability;
    out["risk"] = risk;
    // Where the number comes from, one line (issue 31 item 5).
    out["risk_explanation"] = v.point.risk->explanation;
  } else {
    out["risk"] = py::none();
    out["risk_explanation"] = py::none();
  }
  return out;
}

}  // namespace

void BindForecast(py::module_& m) {
  py::class_<analysis::LiveForecasts>(
      m, "LiveForecasts",
      "The daemon's per-series OOM forecaster (analysis::LiveForecasts, docs/forecast.md)")
      .def(py::init([](std::size_t max_series) {
             auto r = analysis::LiveForecasts::Create(analysis::ForecastOptions{}, max_series);
             if (!r.ok()) throw py::value_error(r.status().message());
             return std::move(r).value();
           }),
           py::arg("max_series") = 16)
      .def(
          "observe",
          [](analysis::LiveForecasts& self, const std::string& key, std::int64_t step,
             const py::dict& sample) {
            if (step < 0) throw py::value_error("step: must be >= 0");
            return VerdictDict(self.Observe(key, ToLiveSample(sample, step)));
          },
          py::arg("key"), py::arg("step"), py::arg("sample"),
          "Observes one sample dict (fragscope_agent's field names) of series `key` at `step`; "
          "returns {step, level, previous, steps_to_oom, reason}.")
      .def("__len__", &analysis::LiveForecasts::size);

  m.def(
      "tune_requests",
      [](const std::vector<std::tuple<std::string, std::uint64_t, std::uint64_t>>& records,
         std::uint64_t capacity, std::uint64_t used_by_others, const std::string& version,
         std::vector<std::string> settings, unsigned threads, bool find_min_capacity) {
        std::vector<Event> events;
        events.reserve(records.size());
        for (std::size_t i = 0; i < records.size(); ++i) {
          const auto& [name, id, size] = records[i];
          const std::optional<Action> action = ParseActionName(name);
          if (!action || (*action != Action::kAlloc && *action != Action::kFreeRequested &&
                          *action != Action::kStep)) {
            throw py::value_error("request " + std::to_string(i) + ": action '" + name +
                                  "' is not alloc, free_requested or step");
          }
          Event e;
          e.action = *action;
          if (*action == Action::kStep) {
            e.step = static_cast<std::int64_t>(size);
          } else {
            e.addr = id;
            e.size = size;
          }
          events.push_back(e);
        }
        analysis::TuneOptions options;
        options.capacity_bytes = capacity;
        options.used_by_others_bytes = used_by_others;
        options.version = VersionOf(version);
        options.settings = std::move(settings);
        options.threads = threads;
        options.find_min_capacity = find_min_capacity;
        std::optional<Result<std::vector<analysis::TuneOutcome>>> tuned;
        {
          py::gil_scoped_release release;
          tuned.emplace(analysis::Tune(events, options));
        }
        const Result<std::vector<analysis::TuneOutcome>>& r = *tuned;
        if (!r.ok()) throw py::value_error(r.status().message());
        py::list out;
        for (const analysis::TuneOutcome& o : r.value()) {
          py::dict d;
          d["conf"] = o.conf;
          d["oom"] = o.oom;
          d["oom_step"] = o.oom_step;
          d["peak_reserved"] = o.peak_reserved;
          d["peak_allocated"] = o.peak_allocated;
          d["peak_requested"] = o.peak_requested;
          d["waste_at_peak"] = o.waste_at_peak;
          d["num_alloc_retries"] = o.num_alloc_retries;
          d["min_capacity"] =
              o.min_capacity ? py::object(py::int_(*o.min_capacity)) : py::object(py::none());
          out.append(d);
        }
        return out;
      },
      py::arg("requests"), py::arg("capacity"), py::arg("used_by_others") = 0,
      py::arg("torch_version") = "newest", py::arg("settings") = std::vector<std::string>{},
      py::arg("threads") = 1, py::arg("find_min_capacity") = false,
      "`fragscope tune`'s ranking (analysis::Tune) of a request trace given as (action, id, "
      "size) tuples, as vgpu_request_trace() returns them; settings [] = the default grid; "
      "find_min_capacity: also the smallest device each setting fits on (bisection).");
}

}  // namespace fragscope::python
