#include "sources/snapshot/snapshot_steps.h"

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <utility>

#include <fmt/format.h>

namespace fragscope::sources {
namespace {

constexpr std::string_view kProfilerStep = "ProfilerStep#";
constexpr std::string_view kOptimizerStep = "Optimizer.step";

// A count written in decimal digits only; nullopt for anything else or more than 18 digits.
std::optional<std::int64_t> ParseCount(std::string_view digits) {
  if (digits.empty() || digits.size() > 18) return std::nullopt;
  std::int64_t value = 0;
  for (const char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + (c - '0');
  }
  return value;
}

bool IsOptimizerStep(std::string_view name) {
  return name == kOptimizerStep ||
         (name.starts_with(kOptimizerStep) && name[kOptimizerStep.size()] == '#');
}

// A boundary in time: step `step` begins at `time_us`.
struct Boundary {
  std::int64_t time_us = 0;
  std::int64_t step = 0;
};

// Appends a mark; a later mark at the same entry replaces the earlier (its step was empty).
void AddMark(std::vector<SnapshotStepMark>* marks, std::uint32_t before, std::int64_t step) {
  if (!marks->empty() && marks->back().before == before) {
    marks->back().step = step;
    return;
  }
  marks->push_back(SnapshotStepMark{before, step});
}

// Places `bounds` (ascending time) among the entries: a boundary falls before the first entry
// recorded at or after its time (`inclusive`), or strictly after it. Entries without a time
// stay in the step in progress. Returns how many boundaries fell inside the history.
std::size_t PlaceByTime(const TraceHistory& entries, const std::vector<Boundary>& bounds,
                        bool inclusive, std::vector<SnapshotStepMark>* marks) {
  std::size_t b = 0;
  std::size_t i = 0;
  for (auto it = entries.begin(); it != entries.end() && b < bounds.size(); ++it, ++i) {
    const std::int64_t t = it->time_us;
    if (t < 0) continue;
    while (b < bounds.size() && (inclusive ? t >= bounds[b].time_us : t > bounds[b].time_us)) {
      AddMark(marks, static_cast<std::uint32_t>(i), bounds[b].step);
      ++b;
    }
  }
  return b;
}

std::string Plural(std::size_t n, std::string_view one, std::string_view many) {
  return fmt::format("{} {}", n, n == 1 ? one : many);
}

}  // namespace

std::optional<std::int64_t> StepFromText(std::string_view text) {
  if (text.starts_with(kProfilerStep)) return ParseCount(text.substr(kProfilerStep.size()));
  if (text.size() < 6) return std::nullopt;
  for (std::size_t i = 0; i < 4; ++i) {
    if (std::tolower(static_cast<unsigned char>(text[i])) != "step"[i]) return std::nullopt;
  }
  const char separator = text[4];
  if (separator != ' ' && separator != '=' && separator != ':' && separator != '#') {
    return std::nullopt;
  }
  return ParseCount(text.substr(5));
}

SnapshotSteps DeriveSteps(const Snapshot& snapshot) {
  SnapshotSteps out;
  // What names step boundaries at all.
  std::size_t annotate_steps = 0;
  for (const SnapshotTraceAnnotation& a : snapshot.trace_annotations) {
    annotate_steps += StepFromText(a.text).has_value();
  }
  std::vector<Boundary> profiler;
  std::string optimizer_name;
  std::vector<Boundary> optimizer;
  for (const SnapshotAnnotation& a : snapshot.annotations) {
    if (a.time_us < 0) continue;
    if (a.stage == "START" && a.name.starts_with(kProfilerStep)) {
      if (const std::optional<std::int64_t> step = StepFromText(a.name)) {
        profiler.push_back(Boundary{a.time_us, *step});
      }
    } else if (a.stage == "END" && IsOptimizerStep(a.name)) {
      if (optimizer_name.empty()) optimizer_name = a.name;
      if (a.name == optimizer_name) optimizer.push_back(Boundary{a.time_us, 0});
    }
  }
  if (annotate_steps == 0 && profiler.empty() && optimizer.empty()) return out;

  std::vector<std::int32_t> with_history;
  for (std::size_t d = 0; d < snapshot.device_traces.size(); ++d) {
    if (!snapshot.device_traces[d].empty()) with_history.push_back(static_cast<std::int32_t>(d));
  }
  if (with_history.empty()) return out;  // nothing recorded to divide
  if (with_history.size() > 1) {
    out.notes.push_back(fmt::format(
        "the annotations name training steps, but {} devices have a recorded history: steps "
        "are not marked (a step is the process's, and fragscope reads a snapshot's devices one "
        "after the other)",
        with_history.size()));
    return out;
  }
  const std::int32_t device = with_history.front();
  const TraceHistory& entries = snapshot.device_traces[static_cast<std::size_t>(device)];
  auto use = [&](std::vector<SnapshotStepMark> marks, std::string from) {
    out.device = device;
    out.marks = std::move(marks);
    out.source = fmt::format("{} marked in device {}'s history, from {}",
                             Plural(out.marks.size(), "step", "steps"), device, from);
  };

  // 1. annotate entries: they stand where they were recorded.
  if (annotate_steps > 0) {
    std::vector<SnapshotStepMark> marks;
    for (const SnapshotTraceAnnotation& a : snapshot.trace_annotations) {
      if (a.device != device || a.before >= entries.size()) continue;
      if (const std::optional<std::int64_t> step = StepFromText(a.text)) {
        AddMark(&marks, a.before, *step);
      }
    }
    if (!marks.empty()) {
      use(std::move(marks),
          Plural(annotate_steps, "annotate entry naming a step", "annotate entries naming steps"));
      return out;
    }
  }

  // 2 and 3 compare times.
  const auto has_time = [](const SnapshotTraceEntry& e) { return e.time_us >= 0; };
  const bool timed = std::any_of(entries.begin(), entries.end(), has_time);
  if (!timed && (!profiler.empty() || !optimizer.empty())) {
    out.notes.push_back(fmt::format(
        "external_annotations name {} step boundaries, but the history records no time_us "
        "(PyTorch < 2.2), so they cannot be placed: steps are not marked",
        profiler.size() + optimizer.size()));
    return out;
  }
  const auto by_time = [](const Boundary& a, const Boundary& b) { return a.time_us < b.time_us; };
  if (!profiler.empty()) {
    std::stable_sort(profiler.begin(), profiler.end(), by_time);
    std::vector<SnapshotStepMark> marks;
    if (PlaceByTime(entries, profiler, /*inclusive=*/true, &marks) > 0) {
      use(std::move(marks),
          fmt::format("{} in external_annotations, placed by time_us",
                      Plural(profiler.size(), "ProfilerStep#N start", "ProfilerStep#N starts")));
      return out;
    }
  }
  if (!optimizer.empty()) {
    std::stable_sort(optimizer.begin(), optimizer.end(), by_time);
    for (std::size_t k = 0; k < optimizer.size(); ++k) {
      optimizer[k].step = static_cast<std::int64_t>(k) + 1;
    }
    std::vector<SnapshotStepMark> marks{SnapshotStepMark{0, 0}};
    if (PlaceByTime(entries, optimizer, /*inclusive=*/false, &marks) > 0) {
      use(std::move(marks),
          fmt::format("{} of {} in external_annotations, placed by time_us (a step ends with "
                      "its optimizer step; step 0 is the one in progress when the history "
                      "begins)",
                      Plural(optimizer.size(), "end", "ends"), optimizer_name));
      return out;
    }
  }
  return out;
}

}  // namespace fragscope::sources
