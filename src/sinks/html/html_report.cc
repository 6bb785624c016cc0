#include "sinks/html/html_report.h"

#include <algorithm>
#include <map>
#include <set>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/units.h"
#include "fragscope/risk.h"
#include "model/caching_allocator_sim.h"
#include "sinks/html/packed_ints.h"
#include "sinks/html/report_assets.h"
#include "sources/call_site.h"

namespace fragscope::sinks {
namespace {

using nlohmann::json;

std::string_view KindText(TraceKind kind) {
  switch (kind) {
    case TraceKind::kRequest:
      return "request";
    case TraceKind::kAllocator:
      return "allocator";
    case TraceKind::kUnknown:
      break;
  }
  return "unknown";
}

// "event 3,041 (step 12)", or "event 17" before the first step marker.
std::string AtText(std::uint64_t event, std::int64_t step) {
  return step >= 0 ? fmt::format("event {} (step {})", FormatCount(event),
                                 FormatCount(static_cast<std::uint64_t>(step)))
                   : fmt::format("event {}", FormatCount(event));
}

// Block states as the page codes them: 0 free, 1 allocated, 2 pending free, 3 stranded (free).
int StateCode(const analysis::LayoutBlock& b) {
  switch (b.state) {
    case model::BlockState::kAllocated:
      return 1;
    case model::BlockState::kPendingFree:
      return 2;
    case model::BlockState::kFree:
      break;
  }
  return b.stranded ? 3 : 0;
}

// The segments of one device's maps, each (addr, size, stream, pool, expandable) once: five
// packed numbers a row (pool 0 small, 1 large); a map names a row by its index.
class SegmentTable {
 public:
  std::uint64_t Id(const analysis::LayoutSegment& s) {
    const int pool = s.pool == Pool::kSmall ? 0 : 1;
    const Key key{s.addr, s.size, s.stream, pool, s.expandable};
    const auto [it, fresh] = ids_.try_emplace(key, ids_.size());
    if (fresh) {
      rows_.Put(s.addr);
      rows_.Put(s.size);
      rows_.Put(s.stream);
      rows_.Put(static_cast<std::uint64_t>(pool));
      rows_.Put(s.expandable ? 1 : 0);
    }
    return it->second;
  }
  std::string Take() { return rows_.Take(); }

 private:
  using Key = std::tuple<std::uint64_t, std::uint64_t, std::uint64_t, int, bool>;
  std::map<Key, std::uint64_t> ids_;
  PackedInts rows_;
};

// A segment of a map, packed (docs/report.md, "The embedded data"): 2 × its row in the
// SegmentTable, the number of blocks, then four numbers a block: the gap since the previous
// block's end (zigzag; 0 as blocks tile a segment), the size (size / 512 × 2 when a multiple of
// 512, as the allocator's sizes are, else size × 2 + 1), state + 4 × (allocation + 1) (its
// call site, stack and history are the allocation's, AllocationsJson), and the zigzag of
// (size when allocated or pending free, else 0) − requested: 0 in the common cases.
void PackSegment(const analysis::LayoutSegment& s, SegmentTable* table, PackedInts* out) {
  out->Put(2 * table->Id(s));
  out->Put(s.blocks.size());
  std::uint64_t end = 0;
  for (const analysis::LayoutBlock& b : s.blocks) {
    const std::uint64_t offset = b.addr - s.addr;
    out->PutSigned(static_cast<std::int64_t>(offset - end));
    out->Put(b.size % 512 == 0 ? b.size / 512 * 2 : b.size * 2 + 1);
    const int state = StateCode(b);
    out->Put(static_cast<std::uint64_t>(state) +
             4 * static_cast<std::uint64_t>(std::max<std::int64_t>(b.allocation, -1) + 1));
    const std::uint64_t base = state == 1 || state == 2 ? b.size : 0;
    out->PutSigned(static_cast<std::int64_t>(base - b.requested));
    end = offset + b.size;
  }
}

bool SameSegment(const analysis::LayoutSegment& a, const analysis::LayoutSegment& b) {
  if (a.addr != b.addr || a.size != b.size || a.stream != b.stream || a.pool != b.pool ||
      a.blocks.size() != b.blocks.size())
    return false;
  for (std::size_t i = 0; i < a.blocks.size(); ++i) {
    const analysis::LayoutBlock& x = a.blocks[i];
    const analysis::LayoutBlock& y = b.blocks[i];
    if (x.addr != y.addr || x.size != y.size || x.requested != y.requested || x.state != y.state ||
        x.stranded != y.stranded || x.frame != y.frame || x.allocation != y.allocation)
      return false;
  }
  return true;
}

// Frames of one device; their segments packed (PackSegment). A segment unchanged since the
// previous frame is written as 2 × its index in that frame + 1: long runs repeat most segments
// from frame to frame.
json FramesJson(const analysis::DeviceFrames& d, SegmentTable* table) {
  json out = json::array();
  const analysis::LayoutFrame* previous = nullptr;
  for (const analysis::LayoutFrame& f : d.frames) {
    std::unordered_map<std::uint64_t, std::size_t> before;  // addr -> index in previous
    if (previous != nullptr) {
      for (std::size_t i = 0; i < previous->segments.size(); ++i)
        before.emplace(previous->segments[i].addr, i);
    }
    PackedInts segs;
    for (const analysis::LayoutSegment& s : f.segments) {
      const auto it = before.find(s.addr);
      if (it != before.end() && SameSegment(previous->segments[it->second], s)) {
        segs.Put(2 * static_cast<std::uint64_t>(it->second) + 1);
      } else {
        PackSegment(s, table, &segs);
      }
    }
    out.push_back({{"event", f.event_index},
                   {"step", f.step},
                   {"time_us", f.time_us},
                   {"why", analysis::FrameReasonName(f.reason)},
                   {"segs", segs.Take()}});
    previous = &f;
  }
  return out;
}

json HtmlExtremeJson(const analysis::Extreme& e) {
  if (!e.seen) return nullptr;
  return {{"bytes", e.bytes}, {"event", e.when.event_index}, {"step", e.when.step}};
}

json SeriesJson(const std::vector<analysis::TimelineSample>& t) {
  json s;
  auto column = [&](const char* name, auto get) {
    json a = json::array();
    for (const analysis::TimelineSample& x : t) a.push_back(get(x));
    s[name] = std::move(a);
  };
  using S = analysis::TimelineSample;
  column("first_event", [](const S& x) { return x.first_event; });
  column("end_event", [](const S& x) { return x.end_event; });
  column("step_first", [](const S& x) { return x.step_first; });
  column("step_last", [](const S& x) { return x.step_last; });
  column("time_us", [](const S& x) { return x.time_us; });
  column("reserved", [](const S& x) { return x.reserved_bytes; });
  column("peak_reserved", [](const S& x) { return x.peak_reserved_bytes; });
  column("allocated", [](const S& x) { return x.allocated_bytes; });
  column("peak_allocated", [](const S& x) { return x.peak_allocated_bytes; });
  column("requested", [](const S& x) { return x.live_requested_bytes; });
  column("peak_requested", [](const S& x) { return x.peak_live_requested_bytes; });
  column("cached_free", [](const S& x) { return x.cached_free_bytes; });
  column("largest_free_block", [](const S& x) { return x.largest_free_block; });
  column("max_allocatable", [](const S& x) { return x.max_allocatable; });
  column("stranded", [](const S& x) { return x.stranded_bytes; });
  column("fragmentation", [](const S& x) {
    return static_cast<double>(static_cast<std::int64_t>(x.fragmentation_ratio * 10000)) / 10000;
  });
  return s;
}

json HtmlOomJson(const analysis::OomDiagnosis& o) {
  json j = {{"event", o.event_index},
            {"step", o.step},
            {"requested", o.requested},
            {"rounded", o.rounded},
            {"needed", o.needed},
            {"pool", o.pool == Pool::kSmall ? "small" : "large"},
            {"reserved", o.reserved},
            {"allocated", o.allocated},
            {"free_unusable", o.free_unusable},
            {"largest_free_block", o.largest_free_block},
            {"cause", analysis::OomCauseName(o.cause)},
            {"margin", o.margin}};
  j["device_free"] = o.device_free ? json(*o.device_free) : json(nullptr);
  return j;
}

json ExplanationJson(const analysis::OomExplanation& e) {
  json remedies = json::array();
  for (const analysis::Remedy& r : e.remedies) {
    json x = {{"id", r.id}, {"alloc_conf", r.alloc_conf}, {"action", r.action}, {"why", r.why}};
    if (r.check) {
      x["check"] = {{"oom", r.check->oom},
                    {"oom_step", r.check->oom_step},
                    {"peak_reserved", r.check->peak_reserved},
                    {"worse", r.check->worse}};
    }
    remedies.push_back(std::move(x));
  }
  return {{"verdict", analysis::OomVerdictName(e.verdict)},
          {"summary", e.summary},
          {"reasons", e.reasons},
          {"notes", e.notes},
          {"remedies", std::move(remedies)}};
}

// The risk of a verdict as the page shows it: P(OOM within the headline horizon) and where it
// comes from (issue 31 item 5); null without a risk.
json HtmlRiskJson(const analysis::ForecastPoint& p) {
  if (!p.risk) return nullptr;
  const std::optional<double> at = p.risk->At(kHeadlineRiskHorizonSteps);
  if (!at) return nullptr;
  return {{"steps", kHeadlineRiskHorizonSteps}, {"p", *at}, {"from", p.risk->explanation}};
}

json HtmlForecastJson(const analysis::DeviceForecast& f) {
  json changes = json::array();
  for (const analysis::ForecastPoint& p : f.changes) {
    changes.push_back({{"step", p.step},
                       {"level", RiskLevelName(p.level)},
                       {"steps_to_oom", p.steps_to_oom ? json(*p.steps_to_oom) : json(nullptr)},
                       {"reason", p.reason},
                       {"risk", HtmlRiskJson(p)}});
  }
  return {{"unit", f.unit},
          {"changes", std::move(changes)},
          {"last", f.enough_data ? json{{"step", f.last.step}, {"risk", HtmlRiskJson(f.last)}}
                                 : json(nullptr)},
          {"worst", RiskLevelName(f.worst)},
          {"first_warning_step", f.first_warning_step ? json(*f.first_warning_step) : json()},
          {"first_critical_step", f.first_critical_step ? json(*f.first_critical_step) : json()},
          {"notes", f.notes}};
}

// The stacks the page shows, interned: a frame table ([name, file, line, folded]; folded: 1 for
// the machinery a call site is never named after, sources/call_site.h) and a stack table of
// frame ids, each holding only what the allocations of the kept maps refer to, renumbered. The
// stack table is packed: per stack its number of frames, then their ids.
class StackTables {
 public:
  StackTables(const std::vector<Frame>& frames,
              const std::vector<std::vector<std::uint32_t>>& stacks)
      : frames_(frames), stacks_(stacks) {}

  // The page's id of input stack `stack`; -1 for none. Stacks with the same frames share one
  // id (a snapshot interns stacks by object identity: equal lists are not always one).
  std::int32_t Intern(std::int32_t stack) {
    if (stack < 0 || static_cast<std::size_t>(stack) >= stacks_.size()) return -1;
    if (const auto known = stack_ids_.find(stack); known != stack_ids_.end()) {
      return known->second;
    }
    std::vector<std::int32_t> ids;
    for (const std::uint32_t f : stacks_[static_cast<std::size_t>(stack)]) {
      if (f >= frames_.size()) continue;
      const auto [fit, fresh] =
          frame_ids_.try_emplace(f, static_cast<std::int32_t>(frame_table_.size()));
      if (fresh) {
        const Frame& frame = frames_[f];
        const bool folded =
            sources::IsMachinery(sources::ClassifyFrame({frame.name, frame.filename}));
        frame_table_.push_back(
            json::array({frame.name, frame.filename, frame.line, folded ? 1 : 0}));
      }
      ids.push_back(fit->second);
    }
    const auto [it, inserted] =
        by_content_.try_emplace(ids, static_cast<std::int32_t>(by_content_.size()));
    if (inserted) {
      stack_table_.Put(ids.size());
      for (const std::int32_t id : ids) stack_table_.Put(static_cast<std::uint64_t>(id));
    }
    stack_ids_.emplace(stack, it->second);
    return it->second;
  }
  json TakeFrames() { return std::move(frame_table_); }
  std::string TakeStacks() { return stack_table_.Take(); }

 private:
  const std::vector<Frame>& frames_;
  const std::vector<std::vector<std::uint32_t>>& stacks_;
  std::unordered_map<std::int32_t, std::int32_t> stack_ids_;  // input id -> page id
  std::map<std::vector<std::int32_t>, std::int32_t> by_content_;
  std::unordered_map<std::uint32_t, std::int32_t> frame_ids_;
  json frame_table_ = json::array();
  PackedInts stack_table_;
};

// An "after" column: 0 for -1 (unknown), else 1 + the zigzag of value - from.
void PutAfter(std::int64_t value, std::int64_t from, PackedInts* out) {
  out->Put(value < 0 ? 0 : 1 + Zigzag(value - from));
}

// The allocations of the kept maps, as packed columns (index = a block's allocation):
// alloc_event, alloc_step, alloc_time as the zigzag of the change from the row before (from 0
// for the first); free_event, free_step, free_time "after" their alloc column (PutAfter);
// stream; site and stack zigzagged. -1 where unknown (an alloc event of -1: live when the
// recorded history began, a free event of -1: not freed by the end). A step column of an input
// without steps is null (all -1). Times are microseconds after `first_time_us` (the input's
// first timed event): short numbers, where epoch microseconds take 16 digits each.
json AllocationsJson(const analysis::DeviceFrames& d, std::int64_t first_time_us,
                     StackTables* stacks, std::set<std::int32_t>* sites) {
  const auto since_first = [first_time_us](std::int64_t t) -> std::int64_t {
    return t >= 0 && first_time_us >= 0 && t >= first_time_us ? t - first_time_us : -1;
  };
  PackedInts alloc_event, alloc_step, alloc_time, free_event, free_step, free_time;
  PackedInts stream, site, stack;
  std::int64_t last_event = 0, last_step = 0, last_time = 0;
  bool steps = false;
  for (const analysis::LayoutAllocation& a : d.allocations) {
    const std::int64_t at = since_first(a.alloc_time_us);
    alloc_event.PutSigned(a.alloc_event - last_event);
    alloc_step.PutSigned(a.alloc_step - last_step);
    alloc_time.PutSigned(at - last_time);
    last_event = a.alloc_event;
    last_step = a.alloc_step;
    last_time = at;
    PutAfter(a.free_event, a.alloc_event, &free_event);
    PutAfter(a.free_step, a.alloc_step, &free_step);
    PutAfter(since_first(a.free_time_us), at, &free_time);
    stream.Put(a.stream);
    site.PutSigned(a.site);
    stack.PutSigned(stacks->Intern(a.stack));
    steps = steps || a.alloc_step >= 0 || a.free_step >= 0;
    if (a.site >= 0) sites->insert(a.site);
  }
  return {{"count", d.allocations.size()},
          {"alloc_event", alloc_event.Take()},
          {"alloc_step", steps ? json(alloc_step.Take()) : json(nullptr)},
          {"alloc_time", alloc_time.Take()},
          {"free_event", free_event.Take()},
          {"free_step", steps ? json(free_step.Take()) : json(nullptr)},
          {"free_time", free_time.Take()},
          {"stream", stream.Take()},
          {"site", site.Take()},
          {"stack", stack.Take()}};
}

// "Active memory by call site": the live bytes of each call site at the end of every timeline
// sample, from every change the recorder logged (all events, not a sample of them); the
// `top` sites with the highest peak one by one, the rest summed as "other".
json SiteTimelineJson(const analysis::DeviceFrames& d,
                      const std::vector<analysis::TimelineSample>& samples, std::size_t top,
                      std::set<std::int32_t>* sites) {
  const std::vector<analysis::SiteBytesChange>& changes = d.site_changes;
  // Pass 1: each site's peak over the samples' ends.
  std::unordered_map<std::int32_t, std::int64_t> live, peak;
  std::vector<std::int32_t> dirty;
  std::size_t next = 0;
  for (const analysis::TimelineSample& s : samples) {
    dirty.clear();
    for (; next < changes.size() && changes[next].event < s.end_event; ++next) {
      live[changes[next].site] += changes[next].delta_bytes;
      dirty.push_back(changes[next].site);
    }
    for (const std::int32_t site : dirty) {
      std::int64_t& p = peak[site];
      p = std::max(p, live[site]);
    }
  }
  std::vector<std::pair<std::int64_t, std::int32_t>> ranked;
  for (const auto& [site, p] : peak) {
    if (site >= 0 && p > 0) ranked.emplace_back(p, site);
  }
  // Highest peak first; a tie goes to the lower id.
  const auto higher = [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  std::sort(ranked.begin(), ranked.end(), higher);
  if (ranked.size() > top) ranked.resize(top);
  // Pass 2: the chosen sites' bytes and everything else's at each sample's end.
  std::unordered_map<std::int32_t, std::size_t> column;
  json ids = json::array();
  for (const auto& [p, site] : ranked) {
    column.emplace(site, column.size());
    ids.push_back(site);
    sites->insert(site);
  }
  std::vector<std::int64_t> now(ranked.size(), 0);
  std::int64_t other = 0;
  std::vector<json> values(ranked.size(), json::array());
  json others = json::array();
  next = 0;
  for (const analysis::TimelineSample& s : samples) {
    for (; next < changes.size() && changes[next].event < s.end_event; ++next) {
      const auto c = column.find(changes[next].site);
      if (c == column.end()) {
        other += changes[next].delta_bytes;
      } else {
        now[c->second] += changes[next].delta_bytes;
      }
    }
    for (std::size_t i = 0; i < now.size(); ++i) values[i].push_back(now[i]);
    others.push_back(other);
  }
  json bytes = json::array();
  for (json& v : values) bytes.push_back(std::move(v));
  return {{"sites", std::move(ids)}, {"bytes", std::move(bytes)}, {"other", std::move(others)}};
}

std::string SiteName(const std::vector<Frame>& table, std::int32_t id) {
  analysis::SiteStranding s;
  s.frame = id;
  analysis::NameSite(table, &s);
  return s.site;
}

// '<' inside the JSON (strings only) as \u003c, so no "</script>" or "<!--" ends the element.
std::string ScriptSafe(const std::string& text) {
  std::string out;
  out.reserve(text.size() + 64);
  for (char c : text) {
    if (c == '<') {
      out += "\\u003c";
    } else {
      out += c;
    }
  }
  return out;
}

std::string HtmlEscape(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace

namespace {

// ", a new segment of 32.0 MiB" when the segment a cudaMalloc would take is not the block.
std::string SegmentClause(const analysis::OomDiagnosis& o) {
  if (o.needed == o.rounded) return "";
  return fmt::format(" (a new segment of {})", FormatBytes(o.needed));
}

}  // namespace

std::string DeviceVerdict(const analysis::AnalysisResult& result, const analysis::DeviceReport& d) {
  const std::string on = fmt::format("device {}", d.device);
  if (!d.oom_diagnoses.empty()) {
    const analysis::OomDiagnosis& o = d.oom_diagnoses.front();
    const std::uint64_t free_total = o.free_unusable + o.device_free.value_or(0);
    // One unit and one rounding for the sentence: the margin printed is the difference of the
    // printed free and block, so the words add up.
    const SentenceBytes unit(std::max(free_total, o.rounded));
    const std::uint64_t free_steps = unit.Steps(free_total);
    const std::uint64_t block_steps = unit.Steps(o.rounded);
    const std::string free_text = unit.Format(free_steps);
    const std::string block_text = unit.Format(block_steps);
    const std::string margin_text =
        unit.Format(free_steps > block_steps ? free_steps - block_steps : block_steps - free_steps);
    const std::string more =
        d.num_ooms > 1 ? fmt::format(" ({} out-of-memory events in all)", d.num_ooms) : "";
    if (o.cause == analysis::OomCause::kAddressSpace) {
      return fmt::format(
          "Out of memory at {} on {}: the simulator's limit — {} was free (gaps + device), "
          "enough for the {} block it needed{}, but the simulator's modelled address space ({} of "
          "segments) had no room for it: a limit of the model, not of the device{}.",
          AtText(o.event_index, o.step), on, free_text, block_text, SegmentClause(o),
          FormatBytes(model::kModelledAddressSpaceBytes), more);
    }
    if (o.cause == analysis::OomCause::kFragmentation) {
      // margin = free - block: the figures name the block (the rounded request), and the
      // segment a new cudaMalloc would have taken apart from it.
      return fmt::format(
          "Out of memory at {} on {}: fragmentation — {} was free (gaps + device), {} "
          "more than the {} block it needed{}, but no free block was large enough{}.",
          AtText(o.event_index, o.step), on, free_text, margin_text, block_text, SegmentClause(o),
          more);
    }
    return fmt::format(
        "Out of memory at {} on {}: real shortage — even joined, the free memory ({}) "
        "falls {} short of the {} block it needed{}{}.",
        AtText(o.event_index, o.step), on, free_text, margin_text, block_text, SegmentClause(o),
        more);
  }
  if (d.num_ooms > 0) {
    return fmt::format("Out of memory on {}: {} out-of-memory events (no diagnosis recorded).", on,
                       d.num_ooms);
  }
  if (result.kind == TraceKind::kRequest) {
    return fmt::format(
        "No out-of-memory on {}: the program's live requests peaked at {} (a request trace; "
        "give --capacity to replay it through the allocator).",
        on, FormatBytes(d.peak_live_requested.bytes));
  }
  std::string capacity =
      d.capacity_bytes ? fmt::format(" of {}", FormatBytes(*d.capacity_bytes)) : std::string();
  // The risk figure, not the fragmentation ratio: a cache that keeps most of what it reserved
  // for reuse is healthy; what matters is whether the largest request still fitted.
  std::string room;
  if (d.capacity_bytes && d.min_max_allocatable.seen && d.requests.max > 0) {
    room = fmt::format("; at its tightest a {} request still fitted (the largest was {})",
                       FormatBytes(d.min_max_allocatable.bytes), FormatBytes(d.requests.max));
    if (d.min_max_allocatable.bytes < d.requests.max) {
      room = fmt::format(
          "; at its tightest only {} would have fitted, less than its largest request ({})",
          FormatBytes(d.min_max_allocatable.bytes), FormatBytes(d.requests.max));
    }
  }
  return fmt::format("Fits on {}: no out-of-memory; peak reserved {}{}, peak allocated {}{}.", on,
                     FormatBytes(d.peak_reserved.bytes), capacity,
                     FormatBytes(d.peak_allocated.bytes), room);
}

std::string ReportVerdict(const analysis::AnalysisResult& result) {
  const analysis::DeviceReport* pick = nullptr;
  for (const analysis::DeviceReport& d : result.devices) {
    if (d.num_ooms > 0) {
      pick = &d;
      break;
    }
    if (pick == nullptr || d.peak_reserved.bytes > pick->peak_reserved.bytes) pick = &d;
  }
  if (pick == nullptr) return "No device had an event: nothing to report.";
  return DeviceVerdict(result, *pick);
}

std::string RenderHtml(const HtmlReportInput& input) {
  const analysis::AnalysisResult& r = *input.result;
  json data;
  data["schema"] = "fragscope.report/2";
  data["source"] = r.source;
  data["kind"] = KindText(r.kind);
  data["command"] = input.command;
  data["verdict"] = ReportVerdict(r);
  data["timeline_unit"] = r.timeline_unit;
  data["every_events"] = r.every_events * r.steps_per_sample;
  data["steps_per_sample"] = r.steps_per_sample;
  data["total_events"] = r.total_events;
  data["steps"] = r.steps;
  data["first_time_us"] = r.first_time_us;
  data["notes"] = r.notes;
  if (input.replay != nullptr) {
    json rep = {{"ooms", input.replay->ooms.size()},
                {"stopped_at_oom", input.replay->stopped_at_oom},
                {"notes", input.replay->notes}};
    json devs = json::array();
    for (const analysis::DeviceReplay& d : input.replay->devices) {
      devs.push_back({{"device", d.device},
                      {"capacity", d.capacity_bytes},
                      {"used_by_others", d.used_by_others_bytes},
                      {"alloc_conf", d.alloc_conf}});
    }
    rep["devices"] = std::move(devs);
    data["replay"] = std::move(rep);
  }
  std::set<std::int32_t> sites;
  StackTables stacks(input.call_sites, input.stacks);
  json devices = json::array();
  for (const analysis::DeviceReport& d : r.devices) {
    json j;
    j["device"] = d.device;
    j["name"] = d.name;
    j["capacity"] = d.capacity_bytes ? json(*d.capacity_bytes) : json(nullptr);
    j["verdict"] = DeviceVerdict(r, d);
    j["events"] = d.events;
    j["num_ooms"] = d.num_ooms;
    j["key"] = {{"peak_reserved", HtmlExtremeJson(d.peak_reserved)},
                {"peak_allocated", HtmlExtremeJson(d.peak_allocated)},
                {"peak_requested", HtmlExtremeJson(d.peak_live_requested)},
                {"worst_fragmentation_ratio", d.worst_fragmentation_ratio},
                {"worst_fragmentation", HtmlExtremeJson(d.worst_fragmentation)},
                {"worst_fragmentation_condition",
                 analysis::RatioCondition(d.worst_fragmentation_min_reserved)},
                {"min_largest_free_block", HtmlExtremeJson(d.min_largest_free_block)},
                {"min_max_allocatable", HtmlExtremeJson(d.min_max_allocatable)},
                {"request_p50", d.requests.p50},
                {"request_p90", d.requests.p90},
                {"request_max", d.requests.max}};
    j["series"] = SeriesJson(d.timeline);
    json ooms = json::array();
    for (const analysis::OomDiagnosis& o : d.oom_diagnoses) ooms.push_back(HtmlOomJson(o));
    j["ooms"] = std::move(ooms);
    json stranding = json::array();
    for (const analysis::SiteStranding& s : d.stranding_sites) {
      stranding.push_back({{"site", s.site},
                           {"stranded", s.stranded_bytes},
                           {"live", s.live_bytes},
                           {"blocks", s.blocks},
                           {"segments", s.segments}});
    }
    j["stranding_sites"] = std::move(stranding);
    j["stranding_sites_at"] = d.stranding_sites_at;
    if (d.forecast) j["forecast"] = HtmlForecastJson(*d.forecast);
    if (const auto e = input.explanations.find(d.device); e != input.explanations.end()) {
      j["explain"] = ExplanationJson(e->second);
    }
    j["frames"] = json::array();
    for (const analysis::DeviceFrames& f : input.frames) {
      if (f.device != d.device) continue;
      SegmentTable table;
      j["frames"] = FramesJson(f, &table);
      j["segments"] = table.Take();
      j["frames_stopped"] = f.stopped;
      j["allocs"] = AllocationsJson(f, r.first_time_us, &stacks, &sites);
      j["site_timeline"] = SiteTimelineJson(f, d.timeline, input.top_sites, &sites);
    }
    devices.push_back(std::move(j));
  }
  data["devices"] = std::move(devices);
  json names = json::object();
  for (std::int32_t id : sites) names[std::to_string(id)] = SiteName(input.call_sites, id);
  data["sites"] = std::move(names);
  data["stack_frames"] = stacks.TakeFrames();
  data["stacks"] = stacks.TakeStacks();
  if (input.tune != nullptr) {
    json rows = json::array();
    for (const analysis::TuneOutcome& t : *input.tune) {
      rows.push_back({{"conf", t.conf},
                      {"oom", t.oom},
                      {"oom_step", t.oom_step},
                      {"peak_reserved", t.peak_reserved},
                      {"peak_allocated", t.peak_allocated},
                      {"waste_at_peak", t.waste_at_peak},
                      {"retries", t.num_alloc_retries}});
    }
    data["tune"] = std::move(rows);
    data["tune_cannot_rank"] = input.tune_cannot_rank;
  }

  if (!input.compare_json.empty()) data["compare"] = json::parse(input.compare_json);

  std::string out;
  out += "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n";
  out += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  out +=
      "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
      "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:\">\n";
  out += fmt::format("<title>fragscope report: {}</title>\n", HtmlEscape(r.source));
  out += "<style>\n";
  out += kReportCss;
  out += "</style></head><body>\n";
  out += fmt::format(
      "<noscript><p>{}</p><p>This report draws its charts with JavaScript.</p>"
      "</noscript>\n",
      HtmlEscape(data["verdict"].get<std::string>()));
  out += "<div id=\"app\"></div>\n";
  out += "<script type=\"application/json\" id=\"fragscope-data\">";
  out += ScriptSafe(data.dump(-1, ' ', false, json::error_handler_t::replace));
  out += "</script>\n<script>\n";
  out += kReportJs;
  out += "</script>\n</body></html>\n";
  return out;
}

}  // namespace fragscope::sinks
