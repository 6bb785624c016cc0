#include "sinks/report/text_report.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <string_view>
#include <utility>

#include <fmt/chrono.h>
#include <fmt/format.h>

#include "common/terminal_text.h"
#include "common/units.h"
#include "fragscope/event.h"
#include "model/caching_allocator_sim.h"
#include "sinks/report/text_table.h"

namespace fragscope::sinks {
namespace {

using analysis::AnalysisResult;
using analysis::DeviceReport;
using analysis::Extreme;
using analysis::TimelineSample;
using analysis::When;

// ---------------------------------------------------------------------------------------------
// Small formatters
// ---------------------------------------------------------------------------------------------

// 1234567 -> "1,234,567".
std::string Grouped(std::uint64_t n) { return FormatCount(n); }

// Prefixes every line of `text` with `prefix`.
std::string Indent(std::string_view text, std::string_view prefix) {
  std::string out;
  bool at_line_start = true;
  for (char c : text) {
    if (at_line_start) out += prefix;
    out += c;
    at_line_start = c == '\n';
  }
  return out;
}

std::string Percent(double ratio) { return fmt::format("{:.1f}%", 100.0 * ratio); }

std::string Plural(std::uint64_t n, std::string_view one, std::string_view many) {
  return fmt::format("{} {}", Grouped(n), n == 1 ? one : many);
}

std::string StepName(std::int64_t step) {
  return step < 0 ? std::string("setup") : std::to_string(step);
}

// Trace times are microseconds since the epoch (then shown as UTC date and time) or since the
// start of the capture (then shown as "t=<seconds>"); anything after 2000-01-01 is the former.
std::string FormatTime(std::int64_t time_us) {
  constexpr std::int64_t kYear2000Us = std::int64_t{946684800} * 1000000;
  if (time_us < 1000000) return fmt::format("t={:.3f} ms", static_cast<double>(time_us) / 1e3);
  if (time_us < kYear2000Us) {
    return fmt::format("t={:.3f} s", static_cast<double>(time_us) / 1e6);
  }
  const std::time_t seconds = static_cast<std::time_t>(time_us / 1000000);
  return fmt::format("{:%Y-%m-%d %H:%M:%S}.{:03} UTC", fmt::gmtime(seconds),
                     (time_us / 1000) % 1000);
}

// "event 1,234, step 2, t=1.250 s"; "setup" for events before the first step marker.
std::string FormatWhen(const When& when, bool has_steps) {
  std::string out = "event " + Grouped(when.event_index);
  if (has_steps) {
    out += when.step < 0 ? std::string(", setup (before step markers)")
                         : fmt::format(", step {}", when.step);
  }
  if (when.time_us >= 0) out += ", " + FormatTime(when.time_us);
  return out;
}

std::string TraceKindName(TraceKind kind) {
  switch (kind) {
    case TraceKind::kAllocator:
      return "allocator trace";
    case TraceKind::kRequest:
      return "request trace";
    case TraceKind::kUnknown:
      break;
  }
  return "trace of unknown kind";
}

class Styler {
 public:
  explicit Styler(bool color) : color_(color) {}
  std::string Heading(std::string_view text) const { return Wrap("\x1b[1m", text); }
  std::string Warn(std::string_view text) const { return Wrap("\x1b[33m", text); }

 private:
  std::string Wrap(std::string_view code, std::string_view text) const {
    if (!color_) return std::string(text);
    return fmt::format("{}{}\x1b[0m", code, text);
  }
  bool color_;
};

// ---------------------------------------------------------------------------------------------
// Sections
// ---------------------------------------------------------------------------------------------

bool IsRequestTrace(const AnalysisResult& r) { return r.kind == TraceKind::kRequest; }

// The extremes a device report holds, with a short name for the timeline's "extremes" column.
std::vector<std::pair<std::string_view, const Extreme*>> Extremes(const DeviceReport& d,
                                                                  bool request_trace) {
  if (request_trace) return {{"peak live requested", &d.peak_live_requested}};
  return {{"peak reserved", &d.peak_reserved},
          {"peak allocated", &d.peak_allocated},
          {"peak live requested", &d.peak_live_requested},
          {"most cached free", &d.max_cached_free},
          {"worst fragmentation", &d.worst_fragmentation},
          {"min largest free block", &d.min_largest_free_block},
          {"min max allocatable", &d.min_max_allocatable}};
}

void RenderHeader(const AnalysisResult& r, const Styler& style, std::string* out) {
  // Strings from the input (its name, producer, labels, device names, call sites) are escaped
  // as fields (common/terminal_text.h): a control character or newline in them can neither
  // drive the terminal nor start a line of its own.
  *out += style.Heading(fmt::format("fragscope analyze: {}", TerminalSafe(r.source)));
  *out += '\n';
  std::string timeline;
  if (r.timeline_unit == "step") {
    timeline = r.steps_per_sample > 1 ? fmt::format("one row per {} steps", r.steps_per_sample)
                                      : std::string("one row per step");
  } else {
    timeline = fmt::format("one row per {} events", Grouped(r.every_events));
  }
  *out += fmt::format("  {}, {}, {}, {}; timeline: {}\n", TraceKindName(r.kind),
                      Plural(r.total_events, "event", "events"), Plural(r.steps, "step", "steps"),
                      Plural(r.devices.size(), "device", "devices"), timeline);
  if (!r.producer.empty()) *out += fmt::format("  producer: {}\n", TerminalSafe(r.producer));
  if (!r.labels.empty()) {
    std::string labels;
    for (const auto& [key, value] : r.labels) {
      if (!labels.empty()) labels += ", ";
      labels += TerminalSafe(key) + "=" + TerminalSafe(value);
    }
    *out += fmt::format("  labels: {}\n", labels);
  }
  if (!IsRequestTrace(r)) {
    *out +=
        r.stranded_threshold
            ? fmt::format("  stranding threshold: {} (fixed)\n", FormatBytes(*r.stranded_threshold))
            : fmt::format("  stranding threshold: the p{:g} of recent request sizes, per pool\n",
                          100.0 * r.stranded_quantile);
  }
  for (const std::string& note : r.notes) {
    *out += style.Warn("  note: " + TerminalSafe(note)) + "\n";
  }
}

void RenderDeviceTitle(const DeviceReport& d, const Styler& style, std::string* out) {
  std::string title = fmt::format("Device {}", d.device);
  if (!d.name.empty()) title += ": " + TerminalSafe(d.name);
  if (d.capacity_bytes) title += fmt::format(", capacity {}", FormatBytes(*d.capacity_bytes));
  *out += '\n';
  *out += style.Heading(title);
  *out += '\n';
  *out += fmt::format("  {}: {}, {}, {}\n", Plural(d.events, "event", "events"),
                      Plural(d.allocs, "alloc", "allocs"), Plural(d.frees, "free", "frees"),
                      Plural(d.num_ooms, "OOM", "OOMs"));
}

void RenderExtremes(const AnalysisResult& r, const DeviceReport& d, const Styler& style,
                    std::string* out) {
  const bool has_steps = r.steps > 0;
  *out += '\n';
  Table t({style.Heading("Peaks and worst moments"), "value", "when"}, "<><");
  auto add = [&](std::string_view name, const Extreme& e, std::string value) {
    if (!e.seen) {
      t.AddRow({std::string(name), "-", "never (no event with reserved memory)"});
    } else {
      t.AddRow({std::string(name), std::move(value), FormatWhen(e.when, has_steps)});
    }
  };
  add("  peak reserved", d.peak_reserved, FormatBytes(d.peak_reserved.bytes));
  add("  peak allocated", d.peak_allocated, FormatBytes(d.peak_allocated.bytes));
  add("  peak live requested", d.peak_live_requested, FormatBytes(d.peak_live_requested.bytes));
  add("  most cached free", d.max_cached_free, FormatBytes(d.max_cached_free.bytes));
  if (d.worst_fragmentation.seen) {
    t.AddRow({"  worst fragmentation ratio", Percent(d.worst_fragmentation_ratio),
              fmt::format("{} ({} cached free of {} reserved), {}",
                          FormatWhen(d.worst_fragmentation.when, has_steps),
                          FormatBytes(d.worst_fragmentation.bytes),
                          FormatBytes(d.worst_fragmentation_reserved),
                          analysis::RatioCondition(d.worst_fragmentation_min_reserved))});
  } else if (d.peak_reserved.seen) {
    t.AddRow({"  worst fragmentation ratio", "-",
              fmt::format("never: nothing allocated at any moment with {} reserved or more "
                          "(half the peak)",
                          FormatBytes(d.worst_fragmentation_min_reserved))});
  } else {
    add("  worst fragmentation ratio", d.worst_fragmentation, "");
  }
  add("  min largest free block", d.min_largest_free_block,
      FormatBytes(d.min_largest_free_block.bytes));
  add("  min max allocatable", d.min_max_allocatable, FormatBytes(d.min_max_allocatable.bytes));
  *out += t.Render("  ");
}

void RenderFinalState(const DeviceReport& d, const Styler& style, std::string* out) {
  const DeviceMetrics& m = d.final_metrics;
  *out += '\n';
  Table t({style.Heading("Final state"), "all", "small pool", "large pool"}, "<>>>");
  auto bytes_row = [&](std::string_view name, std::uint64_t PoolMetrics::*field) {
    t.AddRow({std::string(name), FormatBytes(m.all.*field), FormatBytes(m.small_pool.*field),
              FormatBytes(m.large_pool.*field)});
  };
  auto ratio_row = [&](std::string_view name, double PoolMetrics::*field) {
    t.AddRow({std::string(name), Percent(m.all.*field), Percent(m.small_pool.*field),
              Percent(m.large_pool.*field)});
  };
  auto count_row = [&](std::string_view name, std::uint64_t PoolMetrics::*field) {
    t.AddRow({std::string(name), Grouped(m.all.*field), Grouped(m.small_pool.*field),
              Grouped(m.large_pool.*field)});
  };
  bytes_row("  reserved", &PoolMetrics::reserved_bytes);
  bytes_row("  allocated", &PoolMetrics::allocated_bytes);
  bytes_row("  active (allocated + pending free)", &PoolMetrics::active_bytes);
  bytes_row("  requested", &PoolMetrics::requested_bytes);
  bytes_row("  cached free (reserved - allocated)", &PoolMetrics::cached_free_bytes);
  ratio_row("  fragmentation ratio", &PoolMetrics::fragmentation_ratio);
  bytes_row("  largest free block", &PoolMetrics::largest_free_block);
  ratio_row("  external fragmentation", &PoolMetrics::external_fragmentation);
  bytes_row("  internal waste (allocated - requested)", &PoolMetrics::internal_waste_bytes);
  bytes_row("  stranded (free blocks < threshold)", &PoolMetrics::stranded_bytes);
  // The threshold differs per pool; "all" has none of its own.
  t.AddRow({"  stranding threshold", "", FormatBytes(m.small_pool.stranded_threshold),
            FormatBytes(m.large_pool.stranded_threshold)});
  bytes_row("  releasable (empty_cache would free)", &PoolMetrics::releasable_bytes);
  count_row("  segments", &PoolMetrics::segment_count);
  count_row("  blocks", &PoolMetrics::block_count);
  count_row("    allocated", &PoolMetrics::allocated_block_count);
  count_row("    pending free", &PoolMetrics::pending_free_block_count);
  count_row("    free", &PoolMetrics::free_block_count);
  *out += t.Render("  ");

  std::string device_free =
      m.device_free_bytes ? fmt::format("; device free: {}", FormatBytes(*m.device_free_bytes))
                          : std::string("; device free: unknown (no capacity in the header)");
  *out += fmt::format("    max allocatable now: {} (from cached blocks alone: {}{})\n",
                      FormatBytes(m.max_allocatable), FormatBytes(m.max_allocatable_cached),
                      device_free);
  *out += fmt::format("    live at the end: {}, {} requested\n",
                      Plural(d.live_requests, "request", "requests"),
                      FormatBytes(d.live_requested_bytes));
  *out += "    (docs/metrics.md defines every metric)\n";
}

std::string Quantiles(const analysis::RequestProfile& p) {
  return fmt::format("min {}, p50 {}, p90 {}, p99 {}, max {}", FormatBytes(p.min),
                     FormatBytes(p.p50), FormatBytes(p.p90), FormatBytes(p.p99),
                     FormatBytes(p.max));
}

std::string DistinctSizes(const analysis::RequestProfile& p) {
  return fmt::format("{} distinct sizes{}", Grouped(p.distinct_sizes),
                     p.exact ? "" : " (quantiles approximate: within 1.6%)");
}

std::string Share(std::uint64_t part, std::uint64_t whole) {
  if (whole == 0) return "-";
  return Percent(static_cast<double>(part) / static_cast<double>(whole));
}

// Short form for allocator traces: two lines.
void RenderRequestSummary(const analysis::RequestProfile& p, const Styler& style,
                          std::string* out) {
  *out += '\n';
  *out += "  " + style.Heading("Request sizes");
  *out += fmt::format(": {}, {} in total; {}\n", Plural(p.count, "alloc", "allocs"),
                      FormatBytes(p.bytes), DistinctSizes(p));
  if (p.count == 0) return;
  *out += fmt::format("    {}\n", Quantiles(p));
  if (!p.top_sizes.empty()) {
    std::string top;
    for (std::size_t i = 0; i < p.top_sizes.size() && i < 5; ++i) {
      if (!top.empty()) top += ", ";
      top +=
          fmt::format("{} x{}", FormatBytes(p.top_sizes[i].first), Grouped(p.top_sizes[i].second));
    }
    *out += fmt::format("    most frequent: {}\n", top);
  }
}

// Full form for request traces: quantiles, top sizes and the histogram.
void RenderRequestProfile(const analysis::RequestProfile& p, const Styler& style,
                          std::string* out) {
  *out += '\n';
  *out += "  " + style.Heading("Request sizes");
  *out += fmt::format(": {}, {} in total; {}\n", Plural(p.count, "alloc", "allocs"),
                      FormatBytes(p.bytes), DistinctSizes(p));
  if (p.count == 0) return;
  *out += fmt::format("    {}\n", Quantiles(p));
  if (!p.top_sizes.empty()) {
    *out += "    most frequent sizes:\n";
    // Exact bytes too: FormatBytes rounds, and sizes a few bytes apart are distinct sizes.
    Table t({"size", "bytes", "count", "share"}, ">>>>");
    for (const auto& [size, count] : p.top_sizes) {
      t.AddRow({FormatBytes(size), Grouped(size), Grouped(count), Share(count, p.count)});
    }
    *out += t.Render("      ");
  }
  std::uint64_t max_count = 0;
  for (std::uint64_t c : p.histogram.count) max_count = std::max(max_count, c);
  if (max_count == 0) return;
  *out += "    histogram (power-of-two buckets):\n";
  Table h({"size range", "count", "bytes", ""}, "<>><");
  constexpr int kBarWidth = 30;
  for (int b = 0; b < model::kHistogramBuckets; ++b) {
    const std::uint64_t count = p.histogram.count[static_cast<std::size_t>(b)];
    if (count == 0) continue;
    const std::uint64_t lo = std::uint64_t{1} << b;
    const std::string hi = b + 1 < 64 ? FormatBytes(std::uint64_t{1} << (b + 1)) : "16.0 EiB";
    const auto bar = static_cast<std::size_t>(std::max<double>(
        1.0, kBarWidth * static_cast<double>(count) / static_cast<double>(max_count)));
    h.AddRow({fmt::format("[{}, {})", FormatBytes(lo), hi), Grouped(count),
              FormatBytes(p.histogram.bytes[static_cast<std::size_t>(b)]), std::string(bar, '*')});
  }
  *out += h.Render("      ");
}

std::string TimelineLabel(const AnalysisResult& r, const TimelineSample& s) {
  if (r.timeline_unit != "step") {
    return s.end_event > s.first_event + 1 ? fmt::format("{}-{}", s.first_event, s.end_event - 1)
                                           : std::to_string(s.first_event);
  }
  if (s.step_first == s.step_last) return StepName(s.step_first);
  return fmt::format("{}-{}", StepName(s.step_first), StepName(s.step_last));
}

void RenderTimeline(const AnalysisResult& r, const DeviceReport& d, const TextOptions& options,
                    const Styler& style, std::string* out) {
  const bool request_trace = IsRequestTrace(r);
  const auto extremes = Extremes(d, request_trace);
  std::vector<std::uint64_t> extreme_events;
  for (const auto& [name, e] : extremes) {
    if (e->seen) extreme_events.push_back(e->when.event_index);
  }
  std::string title = "Timeline";
  if (r.timeline_unit == "step") {
    title += r.steps_per_sample > 1 ? fmt::format(" (one row per {} steps)", r.steps_per_sample)
                                    : std::string(" (one row per step)");
  } else {
    title += fmt::format(" (one row per {} events)", Grouped(r.every_events));
  }
  *out += '\n';
  *out += "  " + style.Heading(title);
  *out += '\n';
  if (d.timeline.empty()) {
    *out += "    (no rows)\n";
    return;
  }
  const std::string first_column = r.timeline_unit == "step" ? "step" : "events";
  std::vector<std::string> header;
  std::string align;
  if (request_trace) {
    header = {first_column, "live requested",  "peak live requested",
              "allocs",     "largest request", "extremes"};
    align = "<>>>><";
  } else {
    header = {first_column,     "reserved",  "allocated", "frag",
              "largest free",   "max alloc", "stranded",  "peak reserved",
              "peak allocated", "allocs",    "extremes"};
    align = "<>>>>>>>>><";
  }
  if (r.timeline_unit == "step") {
    header.insert(header.begin() + 1, "events");
    align.insert(align.begin() + 1, '>');
  }
  Table t(header, align);
  const std::vector<std::size_t> rows =
      SelectTimelineRows(d.timeline, extreme_events, options.max_timeline_rows);
  // Left-out rows get no marker lines (with evenly spaced rows they would take every other
  // line); the first column's labels show the gaps and the footer counts them.
  for (const std::size_t i : rows) {
    const TimelineSample& s = d.timeline[i];
    std::string marks;
    for (const auto& [name, e] : extremes) {
      if (e->seen && e->when.event_index >= s.first_event &&
          (e->when.event_index < s.end_event || i + 1 == d.timeline.size())) {
        if (!marks.empty()) marks += ", ";
        marks += name;
      }
    }
    std::vector<std::string> row;
    row.push_back(TimelineLabel(r, s));
    if (r.timeline_unit == "step") row.push_back(Grouped(s.end_event - s.first_event));
    if (request_trace) {
      for (std::string v :
           {FormatBytes(s.live_requested_bytes), FormatBytes(s.peak_live_requested_bytes),
            Grouped(s.allocs), FormatBytes(s.largest_request), marks}) {
        row.push_back(std::move(v));
      }
    } else {
      for (std::string v : {FormatBytes(s.reserved_bytes), FormatBytes(s.allocated_bytes),
                            Percent(s.fragmentation_ratio), FormatBytes(s.largest_free_block),
                            FormatBytes(s.max_allocatable), FormatBytes(s.stranded_bytes),
                            FormatBytes(s.peak_reserved_bytes), FormatBytes(s.peak_allocated_bytes),
                            Grouped(s.allocs), marks}) {
        row.push_back(std::move(v));
      }
    }
    t.AddRow(std::move(row));
  }
  *out += t.Render("    ");
  if (rows.size() < d.timeline.size()) {
    *out += fmt::format(
        "    showing {} of {} rows (first, last, the rows of the extremes and evenly spaced "
        "ones); {} left out; --json has all of them\n",
        rows.size(), d.timeline.size(), d.timeline.size() - rows.size());
  }
  if (!request_trace) {
    *out +=
        "    frag = fragmentation ratio; values at the end of each row's window, peaks "
        "inside it\n";
  }
}

void RenderRequestNote(std::string* out) {
  *out += "\n";
  *out +=
      "  This is a request trace: it records what the program asked for (tensor allocs and\n"
      "  frees), not how the caching allocator placed them. Allocator-level numbers (reserved,\n"
      "  fragmentation ratio, largest free block, stranded bytes, max allocatable, the memory\n"
      "  map) need a replay through the caching-allocator simulator: run `fragscope replay`\n"
      "  on this trace, with --capacity SIZE for the GPU.\n";
}

void RenderRequestDevice(const AnalysisResult& r, const DeviceReport& d, const Styler& style,
                         std::string* out) {
  RenderRequestNote(out);
  *out += '\n';
  Table t({style.Heading("Live requested bytes"), "value", "when"}, "<><");
  if (d.peak_live_requested.seen) {
    t.AddRow({"  peak", FormatBytes(d.peak_live_requested.bytes),
              FormatWhen(d.peak_live_requested.when, r.steps > 0)});
  } else {
    t.AddRow({"  peak", "-", "never (no allocation)"});
  }
  t.AddRow({"  at the end", FormatBytes(d.live_requested_bytes),
            Plural(d.live_requests, "live request", "live requests")});
  *out += t.Render("  ");
  RenderRequestProfile(d.requests, style, out);
}

}  // namespace

std::vector<std::size_t> SelectTimelineRows(const std::vector<TimelineSample>& timeline,
                                            const std::vector<std::uint64_t>& extreme_events,
                                            std::size_t max_rows) {
  const std::size_t n = timeline.size();
  std::vector<std::size_t> rows;
  if (n <= max_rows || n <= 2) {
    for (std::size_t i = 0; i < n; ++i) rows.push_back(i);
    return rows;
  }
  rows.push_back(0);
  rows.push_back(n - 1);
  for (std::uint64_t event : extreme_events) {
    // The first row whose window ends after the event; the last row if none does.
    auto it =
        std::upper_bound(timeline.begin(), timeline.end(), event,
                         [](std::uint64_t e, const TimelineSample& s) { return e < s.end_event; });
    rows.push_back(it == timeline.end() ? n - 1 : static_cast<std::size_t>(it - timeline.begin()));
  }
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  const std::size_t even =
      std::max<std::size_t>(2, max_rows > rows.size() ? max_rows - rows.size() : 2);
  for (std::size_t k = 0; k < even; ++k) rows.push_back(k * (n - 1) / (even - 1));
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

void RenderOomDiagnoses(const AnalysisResult& r, const DeviceReport& d, const Styler& style,
                        std::string* out) {
  for (std::size_t i = 0; i < d.oom_diagnoses.size(); ++i) {
    const analysis::OomDiagnosis& o = d.oom_diagnoses[i];
    *out += '\n';
    When when;
    when.event_index = o.event_index;
    when.step = o.step;
    when.time_us = o.time_us;
    *out += style.Heading(fmt::format("Out of memory{}", d.oom_diagnoses.size() > 1
                                                             ? fmt::format(" #{}", i + 1)
                                                             : std::string()));
    *out += fmt::format(" at {}\n", FormatWhen(when, r.steps > 0));
    *out += fmt::format("  requested {} (a {} block in the {} pool; a new segment of {})\n",
                        FormatBytes(o.requested), FormatBytes(o.rounded), PoolName(o.pool),
                        FormatBytes(o.needed));
    *out += fmt::format("  reserved {}, allocated {}; free but unusable (gaps in segments) {}\n",
                        FormatBytes(o.reserved), FormatBytes(o.allocated),
                        FormatBytes(o.free_unusable));
    *out += fmt::format("  largest free block in that pool {}; device free {}\n",
                        FormatBytes(o.largest_free_block),
                        o.device_free ? FormatBytes(*o.device_free) : std::string("unknown"));
    // One unit and one rounding for the sentence, so that its figures add up (the margin is
    // the difference of the printed free bytes and block).
    const std::uint64_t free_total = o.free_unusable + o.device_free.value_or(0);
    const SentenceBytes unit(std::max(free_total, o.rounded));
    const std::uint64_t free_steps = unit.Steps(free_total);
    const std::uint64_t block_steps = unit.Steps(o.rounded);
    const std::string margin =
        unit.Format(free_steps > block_steps ? free_steps - block_steps : block_steps - free_steps);
    if (o.cause == analysis::OomCause::kAddressSpace) {
      *out += style.Warn(fmt::format(
          "  verdict: the simulator's limit. {} was free (gaps + device), enough for the {} "
          "block, but the simulator's modelled address space ({} of segments) had no room for "
          "the segment: a limit of the model, not of the device.",
          unit.Format(free_steps), unit.Format(block_steps),
          FormatBytes(model::kModelledAddressSpaceBytes)));
    } else if (o.cause == analysis::OomCause::kFragmentation) {
      *out += style.Warn(
          fmt::format("  verdict: fragmentation. {} was free in all (gaps + device), {} more than "
                      "the {} block, but no single free range was large enough.",
                      unit.Format(free_steps), margin, unit.Format(block_steps)));
    } else {
      *out += style.Warn(fmt::format(
          "  verdict: real shortage. Even joined, the free memory ({}) falls {} short of the {} "
          "block.",
          unit.Format(free_steps), margin, unit.Format(block_steps)));
    }
    *out += '\n';
  }
}

void RenderStrandingSites(const DeviceReport& d, const Styler& style, std::string* out) {
  if (d.stranding_sites.empty()) return;
  const bool named = std::any_of(d.stranding_sites.begin(), d.stranding_sites.end(),
                                 [](const analysis::SiteStranding& s) { return s.frame >= 0; });
  if (!named) return;  // no stacks recorded: nothing to attribute
  *out += '\n';
  Table t({style.Heading(
               fmt::format("Call sites stranding free gaps (at the {})", d.stranding_sites_at)),
           "stranded", "live", "blocks", "segments"},
          "<>>>>");
  for (const analysis::SiteStranding& s : d.stranding_sites) {
    // Long paths keep their informative end: "...project/train/model.py:12 in forward"; a
    // site without a file (a C++-only stack's label) its start: "C++ only (...): at::_ops::...".
    constexpr std::size_t kMaxSite = 72;
    std::string site = s.site;
    if (site.size() > kMaxSite && s.site_has_file) {
      std::size_t cut = site.size() - (kMaxSite - 3);
      while (cut < site.size() && (static_cast<unsigned char>(site[cut]) & 0xc0) == 0x80) ++cut;
      site = "..." + site.substr(cut);
    } else if (site.size() > kMaxSite) {
      std::size_t cut = kMaxSite - 3;
      while (cut > 0 && (static_cast<unsigned char>(site[cut]) & 0xc0) == 0x80) --cut;
      site = site.substr(0, cut) + "...";
    }
    t.AddRow({"  " + TerminalSafe(site), FormatBytes(s.stranded_bytes), FormatBytes(s.live_bytes),
              Grouped(s.blocks), Grouped(s.segments)});
  }
  *out += t.Render("  ");
}

// One line of the calibrated OOM risk: P per horizon, headroom, median steps to OOM, advice;
// then where the number comes from (issue 31 item 5).
std::string RiskLine(const analysis::OomRisk& r) {
  std::string line = "OOM risk:";
  for (const analysis::OomRisk::Horizon& h : r.horizons) {
    line += fmt::format("{} {:.1f}% within {} steps", &h == &r.horizons.front() ? "" : ",",
                        100 * h.probability, h.steps);
  }
  const auto bytes = [](double b) {
    return (b < 0 ? "-" : "") + FormatBytes(static_cast<std::uint64_t>(std::llround(std::fabs(b))));
  };
  line += fmt::format("; headroom {}", bytes(r.headroom_bytes));
  if (r.headroom_spreads) line += fmt::format(" ({:.1f} spreads)", *r.headroom_spreads);
  line += r.steps_to_oom ? fmt::format("; median steps to OOM ~{}", *r.steps_to_oom)
                         : std::string("; no OOM expected");
  if (r.tail_only) line += " (tail model only: no step seen was this large)";
  if (!r.advice.empty()) line += "; would lower it most: " + r.advice;
  if (!r.explanation.empty()) line += "\n    from: " + r.explanation;
  return line;
}

// The forecaster's verdicts (docs/forecast.md): first warning and critical steps, then the
// level changes.
void RenderForecast(const DeviceReport& d, const Styler& style, std::string* out) {
  if (!d.forecast) return;
  const analysis::DeviceForecast& f = *d.forecast;
  const std::string_view unit = f.unit == "step" ? "step" : "window";
  *out += '\n';
  *out += "  " + style.Heading(fmt::format("Forecast (one verdict every {} {}; docs/forecast.md)",
                                           f.every, f.every == 1 ? unit : std::string(unit) + "s"));
  *out += '\n';
  for (const std::string& note : f.notes) *out += fmt::format("  note: {}\n", TerminalSafe(note));
  if (f.baseline) *out += fmt::format("  baseline: {}\n", TerminalSafe(f.baseline->sentence));
  if (!f.enough_data) return;
  auto at = [&](const std::optional<std::int64_t>& step) {
    return step ? fmt::format("{} {}", unit, *step) : std::string("none");
  };
  *out += fmt::format("  first warning: {}; first critical: {}; worst: {}\n",
                      at(f.first_warning_step), at(f.first_critical_step), RiskLevelName(f.worst));
  std::string now =
      fmt::format("  now ({} {}): {}", unit, f.last.step, RiskLevelName(f.last.level));
  if (f.last.steps_to_oom && f.last.reason.find("steps to OOM") == std::string::npos) {
    now += fmt::format(", ~{} steps to OOM", *f.last.steps_to_oom);
  }
  now += " - " + f.last.reason;
  *out += (f.last.level >= RiskLevel::kWarning ? style.Warn(now) : now) + '\n';
  if (f.last.risk) *out += "  " + RiskLine(*f.last.risk) + '\n';
  if (f.riskiest && f.riskiest->step != f.last.step) {
    *out += fmt::format("  riskiest ({} {}): {}\n", unit, f.riskiest->step,
                        RiskLine(*f.riskiest->risk));
  }
  Table t({std::string(unit), "level", "to OOM", "reason"}, "><><");
  for (const analysis::ForecastPoint& p : f.changes) {
    t.AddRow({fmt::format("{}", p.step), std::string(RiskLevelName(p.level)),
              p.steps_to_oom ? fmt::format("~{}", *p.steps_to_oom) : std::string("-"), p.reason});
  }
  *out += t.Render("  ");
  if (f.changes_dropped > 0) {
    *out += fmt::format("  ... {} later level changes not shown\n", f.changes_dropped);
  }
}

std::string RenderText(const AnalysisResult& result, const TextOptions& options) {
  const Styler style(options.color);
  std::string out;
  RenderHeader(result, style, &out);
  if (result.devices.empty()) {
    out += "\n  No device had an event: nothing to report.\n";
    return out;
  }
  LayoutMapOptions map = options.map;
  map.color = options.color;
  for (const DeviceReport& d : result.devices) {
    RenderDeviceTitle(d, style, &out);
    if (IsRequestTrace(result)) {
      RenderRequestDevice(result, d, style, &out);
      RenderTimeline(result, d, options, style, &out);
      RenderForecast(d, style, &out);
      continue;
    }
    RenderOomDiagnoses(result, d, style, &out);
    RenderExtremes(result, d, style, &out);
    RenderFinalState(d, style, &out);
    RenderStrandingSites(d, style, &out);
    RenderRequestSummary(d.requests, style, &out);
    RenderTimeline(result, d, options, style, &out);
    RenderForecast(d, style, &out);
    if (options.show_map) {
      out += '\n';
      out += "  " + style.Heading("Memory map at the end of the trace");
      out += '\n';
      out += Indent(RenderLayoutMap(d.layout, map), "  ");
    }
  }
  return out;
}

}  // namespace fragscope::sinks
