#include "sinks/report/diff_report.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/units.h"
#include "fragscope/event.h"
#include "sinks/report/text_table.h"

namespace fragscope::sinks {
namespace {

using analysis::DeviceDiff;
using analysis::DeviceFigures;
using analysis::RankComparison;
using analysis::RankDeviation;
using analysis::RankFinding;
using analysis::RunDiff;
using analysis::RunFigures;
using analysis::RunOom;
using analysis::SiteChange;
using analysis::SiteMemory;
using Json = nlohmann::ordered_json;

// Keep every key name here in step with docs/json-schema.md ("fragscope diff").

// ---------------------------------------------------------------------------------------------
// The figures compared, one table for text and JSON
// ---------------------------------------------------------------------------------------------

enum class Unit : std::uint8_t { kBytes, kRatio, kCount };

struct Figure {
  const char* name;  // as the text prints it
  const char* key;   // JSON
  Unit unit;
  std::optional<double> (*value)(const DeviceFigures&);
};

std::optional<double> PeakReserved(const DeviceFigures& d) {
  return static_cast<double>(d.peak_reserved_bytes);
}
std::optional<double> PeakAllocated(const DeviceFigures& d) {
  return static_cast<double>(d.peak_allocated_bytes);
}
std::optional<double> PeakRequested(const DeviceFigures& d) {
  return static_cast<double>(d.peak_requested_bytes);
}
std::optional<double> WorstFragmentation(const DeviceFigures& d) {
  return d.worst_fragmentation_ratio;
}
std::optional<double> StrandedAtEnd(const DeviceFigures& d) {
  return static_cast<double>(d.stranded_bytes_at_end);
}
std::optional<double> Ooms(const DeviceFigures& d) { return static_cast<double>(d.num_ooms); }

constexpr Figure kFigures[] = {
    {"peak reserved", "peak_reserved_bytes", Unit::kBytes, &PeakReserved},
    {"peak allocated", "peak_allocated_bytes", Unit::kBytes, &PeakAllocated},
    {"peak requested", "peak_requested_bytes", Unit::kBytes, &PeakRequested},
    {"worst fragmentation ratio", "worst_fragmentation_ratio", Unit::kRatio, &WorstFragmentation},
    {"stranded at the end", "stranded_bytes_at_end", Unit::kBytes, &StrandedAtEnd},
    {"OOMs", "ooms", Unit::kCount, &Ooms},
};

// A change of a ratio in percentage points: "+16.1 points"; one that rounds to 0.0 keeps two
// decimals ("-0.04 points"), so that a change never reads as none.
std::string DiffPoints(double change) {
  const double points = 100.0 * change;
  if (std::fabs(points) < 0.05) return fmt::format("{:+.2f} points", points);
  return fmt::format("{:+.1f} points", points);
}

std::string DiffPercent(double ratio) { return fmt::format("{:.1f}%", 100.0 * ratio); }

std::string DiffValue(Unit unit, std::optional<double> v) {
  if (!v) return "-";
  switch (unit) {
    case Unit::kBytes:
      return FormatBytes(static_cast<std::uint64_t>(*v));
    case Unit::kRatio:
      return DiffPercent(*v);
    case Unit::kCount:
      break;
  }
  return FormatCount(static_cast<std::uint64_t>(*v));
}

std::string DiffBytes(std::int64_t delta) {
  const std::uint64_t magnitude = static_cast<std::uint64_t>(std::llabs(delta));
  return fmt::format("{}{}", delta < 0 ? "-" : "+", FormatBytes(magnitude));
}

// "+6.0 MiB (+11.1%)", "-12.2 points", "+1", "same"; "-" when a side has no value.
std::string FormatChange(Unit unit, std::optional<double> a, std::optional<double> b) {
  if (!a || !b) return "-";
  if (*a == *b) return "same";
  switch (unit) {
    case Unit::kBytes: {
      const std::int64_t delta = static_cast<std::int64_t>(*b) - static_cast<std::int64_t>(*a);
      if (*a == 0) return DiffBytes(delta);
      return fmt::format("{} ({:+.1f}%)", DiffBytes(delta), 100.0 * (*b - *a) / *a);
    }
    case Unit::kRatio:
      return DiffPoints(*b - *a);
    case Unit::kCount:
      break;
  }
  return fmt::format("{:+}", static_cast<std::int64_t>(*b) - static_cast<std::int64_t>(*a));
}

std::string DiffStep(std::int64_t step) {
  return step < 0 ? std::string("setup (before the first step marker)")
                  : fmt::format("step {}", step);
}

// "step 3, request event 1,234: 20.0 MiB (rounded 20.0 MiB, large pool); fragmentation, 2.0 MiB
// more was free than it needed, in pieces; call site: train.py:12 in forward".
std::string OomText(const RunOom& o, bool has_steps) {
  std::string out = fmt::format(
      "{}{} {}: {} (rounded {}, {} pool)", has_steps ? DiffStep(o.step) + ", " : std::string(),
      o.request_index ? "request event" : "event", FormatCount(o.event_index),
      FormatBytes(o.requested), FormatBytes(o.rounded), PoolName(o.pool));
  switch (o.cause) {
    case analysis::OomCause::kFragmentation:
      out += fmt::format("; fragmentation: {} more was free than it needed, in pieces",
                         FormatBytes(o.margin));
      break;
    case analysis::OomCause::kShortage:
      out += fmt::format("; shortage: {} missing even if every gap were joined",
                         FormatBytes(o.margin));
      break;
    case analysis::OomCause::kAddressSpace:
      out += "; the simulator's modelled address space was full (a limit of the model)";
      break;
  }
  if (!o.site.empty()) out += "; call site: " + o.site;
  return out;
}

std::string RunLine(const RunFigures& run) {
  std::string out = fmt::format("{} ({}, {})", run.path, run.kind, run.how);
  return out;
}

std::string DeviceName(const std::optional<DeviceFigures>& d) {
  return d ? fmt::format("device {}", d->device) : std::string("no device");
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Two runs: text
// ---------------------------------------------------------------------------------------------

std::string DiffHeadline(const DeviceDiff& device) {
  if (!device.a || !device.b) {
    return device.a ? "this device is in A only" : "this device is in B only";
  }
  const DeviceFigures& a = *device.a;
  const DeviceFigures& b = *device.b;
  std::vector<std::string> parts;
  const bool a_oom = a.num_ooms > 0;
  const bool b_oom = b.num_ooms > 0;
  if (a_oom != b_oom) {
    parts.push_back(b_oom ? "B runs out of memory, A does not"
                          : "A runs out of memory, B does not");
  } else if (a.first_oom && b.first_oom && a.first_oom->step >= 0 && b.first_oom->step >= 0 &&
             a.first_oom->step != b.first_oom->step) {
    // Both fail, at different steps: the earlier failure is the news, and the peaks below are
    // each run's up to its own failure (a run that stops sooner peaks lower).
    parts.push_back(
        fmt::format("B runs out of memory {} (step {}, against step {} in A; the "
                    "peaks are each run's up to its first OOM)",
                    b.first_oom->step < a.first_oom->step ? "earlier" : "later", b.first_oom->step,
                    a.first_oom->step));
  }
  // Peaks that moved by at least 1%, in the order of the table.
  for (const Figure& f : kFigures) {
    if (f.unit != Unit::kBytes || std::string_view(f.key) == "stranded_bytes_at_end") continue;
    const double va = *f.value(a);
    const double vb = *f.value(b);
    if (va == vb || (va > 0 && std::fabs(vb - va) / va < 0.01)) continue;
    const std::string name = std::string(f.name).substr(5);  // "peak reserved" -> "reserved"
    const std::int64_t delta = static_cast<std::int64_t>(vb) - static_cast<std::int64_t>(va);
    parts.push_back(va == 0 ? fmt::format("B peaks {} in {}", DiffBytes(delta), name)
                            : fmt::format("B's {} peak is {:.1f}% {} ({})", name,
                                          100.0 * std::fabs(vb - va) / va,
                                          vb > va ? "higher" : "lower", DiffBytes(delta)));
  }
  if (a.worst_fragmentation_ratio && b.worst_fragmentation_ratio &&
      std::fabs(*b.worst_fragmentation_ratio - *a.worst_fragmentation_ratio) >= 0.01) {
    parts.push_back(fmt::format(
        "B is {} fragmented at its worst ({} against {})",
        *b.worst_fragmentation_ratio > *a.worst_fragmentation_ratio ? "more" : "less",
        DiffPercent(*b.worst_fragmentation_ratio), DiffPercent(*a.worst_fragmentation_ratio)));
  }
  if (parts.empty()) return "no peak moved by 1% or more, and both runs agree on OOMs";
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : "; ") + p;
  return out;
}

std::string RenderDiffText(const RunDiff& diff) {
  std::string out = "fragscope diff\n";
  out += "  A: " + RunLine(diff.a) + "\n";
  out += "  B: " + RunLine(diff.b) + "\n";
  for (const DeviceDiff& d : diff.devices) {
    out += fmt::format("\n{} of A against {} of B: {}\n", DeviceName(d.a), DeviceName(d.b),
                       DiffHeadline(d));
    Table t({"", "A", "B", "change"}, "<>>>");
    for (const Figure& f : kFigures) {
      const std::optional<double> va = d.a ? f.value(*d.a) : std::nullopt;
      const std::optional<double> vb = d.b ? f.value(*d.b) : std::nullopt;
      t.AddRow(
          {f.name, DiffValue(f.unit, va), DiffValue(f.unit, vb), FormatChange(f.unit, va, vb)});
    }
    out += t.Render("  ");
    if (d.a) {
      out += "  first OOM of A: " +
             (d.a->first_oom ? OomText(*d.a->first_oom, diff.a.steps > 0) : std::string("none")) +
             "\n";
    }
    if (d.b) {
      out += "  first OOM of B: " +
             (d.b->first_oom ? OomText(*d.b->first_oom, diff.b.steps > 0) : std::string("none")) +
             "\n";
    }
    // A replay stops at its first OOM (as `replay` does): its peaks are of the run up to it.
    for (const auto& [side, f] : {std::pair{"A", &d.a}, std::pair{"B", &d.b}}) {
      if (*f && (*f)->first_oom && (*f)->first_oom->request_index) {
        out += fmt::format(
            "  ({}'s replay stops at its first OOM: its figures are of the run up to it)\n", side);
      }
    }
    if (d.sites_changed == 0) {
      out += "\n  No call site's peak memory changed.\n";
      continue;
    }
    out += fmt::format(
        "\n  Call sites whose memory changed most (peak live requested bytes; {} of {} changed)\n",
        d.site_changes.size(), d.sites_changed);
    Table s({"A", "B", "change", "site"}, ">>><");
    for (const SiteChange& c : d.site_changes) {
      std::string site = c.site;
      if (!c.in_a) site += "  (only in B)";
      if (!c.in_b) site += "  (only in A)";
      s.AddRow({FormatBytes(c.a_peak_bytes), FormatBytes(c.b_peak_bytes),
                DiffBytes(c.ChangeBytes()), site});
    }
    out += s.Render("    ");
  }
  std::vector<std::string> notes;
  for (const std::string& n : diff.a.notes) notes.push_back("A: " + n);
  for (const std::string& n : diff.b.notes) notes.push_back("B: " + n);
  if (!notes.empty()) {
    out += "\nNotes\n";
    for (const std::string& n : notes) out += "  " + n + "\n";
  }
  out += "\n(docs/metrics.md, \"Comparing runs\", defines every figure)\n";
  return out;
}

// ---------------------------------------------------------------------------------------------
// JSON
// ---------------------------------------------------------------------------------------------

namespace {

Json FigureJson(Unit unit, std::optional<double> v) {
  if (!v) return nullptr;
  if (unit == Unit::kRatio) return *v;
  return static_cast<std::uint64_t>(*v);
}

Json DiffOomJson(const std::optional<RunOom>& o) {
  if (!o) return nullptr;
  return Json{{"event_index", o->event_index},
              {"index_of", o->request_index ? "request" : "event"},
              {"step", o->step < 0 ? Json(nullptr) : Json(o->step)},
              {"time_us", o->time_us < 0 ? Json(nullptr) : Json(o->time_us)},
              {"requested_bytes", o->requested},
              {"rounded_bytes", o->rounded},
              {"pool", PoolName(o->pool)},
              {"cause", analysis::OomCauseName(o->cause)},
              {"margin_bytes", o->margin},
              {"site", o->site.empty() ? Json(nullptr) : Json(o->site)}};
}

Json DiffSiteJson(const SiteMemory& s) {
  return Json{{"site", s.site},
              {"peak_live_bytes", s.peak_live_bytes},
              {"live_bytes_at_end", s.live_bytes_at_end},
              {"allocs", s.allocs},
              {"requested_bytes", s.requested_bytes}};
}

constexpr std::size_t kJsonSitesPerDevice = 10;

Json DiffDeviceJson(const std::optional<DeviceFigures>& d) {
  if (!d) return nullptr;
  Json j{{"device", d->device},
         {"capacity_bytes", d->capacity_bytes ? Json(*d->capacity_bytes) : Json(nullptr)}};
  for (const Figure& f : kFigures) j[f.key] = FigureJson(f.unit, f.value(*d));
  j["worst_fragmentation_reserved_bytes"] =
      d->worst_fragmentation_ratio ? Json(d->worst_fragmentation_reserved_bytes) : Json(nullptr);
  j["first_oom"] = DiffOomJson(d->first_oom);
  Json sites = Json::array();
  for (std::size_t i = 0; i < d->sites.size() && i < kJsonSitesPerDevice; ++i) {
    sites.push_back(DiffSiteJson(d->sites[i]));
  }
  j["top_sites"] = std::move(sites);
  j["sites"] = d->sites.size();
  return j;
}

Json RunJson(const RunFigures& run) {
  return Json{{"path", run.path},
              {"kind", run.kind},
              {"how", run.how},
              {"alloc_conf", run.alloc_conf},
              {"notes", run.notes}};
}

std::string Dump(const Json& j, int indent) {
  return j.dump(indent, ' ', false, Json::error_handler_t::replace) + "\n";
}

}  // namespace

std::string RenderDiffJson(const RunDiff& diff, int indent) {
  Json j;
  j["schema"] = kDiffSchemaName;
  j["schema_version"] = kDiffSchemaVersion;
  j["mode"] = "pair";
  j["a"] = RunJson(diff.a);
  j["b"] = RunJson(diff.b);
  Json devices = Json::array();
  for (const DeviceDiff& d : diff.devices) {
    Json changes = Json::object();
    for (const Figure& f : kFigures) {
      const std::optional<double> va = d.a ? f.value(*d.a) : std::nullopt;
      const std::optional<double> vb = d.b ? f.value(*d.b) : std::nullopt;
      Json change = nullptr;
      if (va && vb)
        change = f.unit == Unit::kRatio ? Json(*vb - *va) : Json(std::llround(*vb - *va));
      changes[f.key] = Json{{"a", FigureJson(f.unit, va)},
                            {"b", FigureJson(f.unit, vb)},
                            {"change", std::move(change)}};
    }
    Json sites = Json::array();
    for (const SiteChange& c : d.site_changes) {
      sites.push_back({{"site", c.site},
                       {"a_peak_live_bytes", c.in_a ? Json(c.a_peak_bytes) : Json(nullptr)},
                       {"b_peak_live_bytes", c.in_b ? Json(c.b_peak_bytes) : Json(nullptr)},
                       {"change_bytes", c.ChangeBytes()}});
    }
    devices.push_back({{"headline", DiffHeadline(d)},
                       {"a", DiffDeviceJson(d.a)},
                       {"b", DiffDeviceJson(d.b)},
                       {"changes", std::move(changes)},
                       {"sites_changed", d.sites_changed},
                       {"site_changes", std::move(sites)}});
  }
  j["devices"] = std::move(devices);
  return Dump(j, indent);
}

// ---------------------------------------------------------------------------------------------
// N ranks
// ---------------------------------------------------------------------------------------------

namespace {

// "more requested", "less fragmented", ... for a figure's deviation.
std::string DeviationWord(const RankDeviation& d) {
  const char* way = d.z > 0 ? "more" : "less";
  const std::string_view key = d.key;
  if (key == "peak_requested_bytes") return fmt::format("{} requested", way);
  if (key == "peak_allocated_bytes") return fmt::format("{} allocated", way);
  if (key == "peak_reserved_bytes") return fmt::format("{} reserved", way);
  if (key == "worst_fragmentation_ratio") return fmt::format("{} fragmented", way);
  return fmt::format("{} stranded", way);
}

std::string DeviationText(const RankDeviation& d) {
  const std::string value =
      d.bytes ? FormatBytes(static_cast<std::uint64_t>(d.value)) : DiffPercent(d.value);
  const std::string median = d.bytes ? FormatBytes(static_cast<std::uint64_t>(d.median_of_others))
                                     : DiffPercent(d.median_of_others);
  std::string change;
  if (d.bytes) {
    change = DiffBytes(std::llround(d.value - d.median_of_others));
    if (d.median_of_others > 0) {
      change +=
          fmt::format(", {:+.1f}%", 100.0 * (d.value - d.median_of_others) / d.median_of_others);
    }
  } else {
    change = DiffPoints(d.value - d.median_of_others);
  }
  return fmt::format("{}: {} {} against a median of {} on the other ranks ({}; z = {:.1f})",
                     DeviationWord(d), d.figure, value, median, change, d.z);
}

std::string RankName(const RankComparison& ranks, std::size_t i) {
  return fmt::format("rank {} ({})", i, ranks.ranks[i].path);
}

}  // namespace

std::string RenderRanksText(const RankComparison& ranks) {
  std::string out = fmt::format("fragscope diff: {} ranks, each against the median of the others\n",
                                ranks.ranks.size());
  Table t({"rank", "device", "peak requested", "peak allocated", "peak reserved", "worst frag",
           "stranded at end", "OOMs", "input"},
          ">>>>>>>><");
  for (std::size_t i = 0; i < ranks.ranks.size(); ++i) {
    const DeviceFigures* d = analysis::MainDevice(ranks.ranks[i]);
    if (d == nullptr) {
      t.AddRow({std::to_string(i), "-", "-", "-", "-", "-", "-", "-", ranks.ranks[i].path});
      continue;
    }
    t.AddRow({std::to_string(i), std::to_string(d->device), FormatBytes(d->peak_requested_bytes),
              FormatBytes(d->peak_allocated_bytes), FormatBytes(d->peak_reserved_bytes),
              d->worst_fragmentation_ratio ? DiffPercent(*d->worst_fragmentation_ratio) : "-",
              FormatBytes(d->stranded_bytes_at_end), FormatCount(d->num_ooms),
              ranks.ranks[i].path});
  }
  out += "\n" + t.Render("  ");
  out += "  (each rank's device with the highest peak reserved)\n";
  if (ranks.differing.empty()) {
    out += fmt::format(
        "\nNo rank differs: every figure lies within {} robust deviations of the other ranks' "
        "median, and no call site of 1 MiB or more is on one rank only or missing from one.\n",
        analysis::kRankZThreshold);
  }
  for (const RankFinding& f : ranks.differing) {
    std::vector<std::string> why;
    for (const RankDeviation& d : f.deviations) why.push_back(DeviationWord(d));
    if (!f.extra_sites.empty()) {
      why.push_back(f.extra_sites.size() == 1
                        ? "an extra call site"
                        : fmt::format("{} extra call sites", f.extra_sites.size()));
    }
    if (!f.missing_sites.empty()) {
      why.push_back(f.missing_sites.size() == 1
                        ? "a missing call site"
                        : fmt::format("{} missing call sites", f.missing_sites.size()));
    }
    std::string reasons;
    for (const std::string& w : why) reasons += (reasons.empty() ? "" : ", ") + w;
    out += fmt::format("\n{} differs: {}\n", RankName(ranks, f.rank), reasons);
    for (const RankDeviation& d : f.deviations) out += "  " + DeviationText(d) + "\n";
    for (const SiteMemory& s : f.extra_sites) {
      out += fmt::format("  extra call site: {} holds {} at its peak; no other rank has it\n",
                         s.site, FormatBytes(s.peak_live_bytes));
    }
    for (const SiteMemory& s : f.missing_sites) {
      out += fmt::format(
          "  missing call site: {} (a median of {} at its peak on the other ranks) is absent\n",
          s.site, FormatBytes(s.peak_live_bytes));
    }
  }
  out += fmt::format(
      "\n(a figure differs at |z| >= {}: z = (value - median of the others) / max(1.4826 x their "
      "median absolute deviation, {:.0f}% of their median, 1 MiB or 1 point); docs/metrics.md, "
      "\"Comparing runs\")\n",
      analysis::kRankZThreshold, 100 * analysis::kRankMinRelativeScale);
  return out;
}

std::string RenderRanksJson(const RankComparison& ranks, int indent) {
  Json j;
  j["schema"] = kDiffSchemaName;
  j["schema_version"] = kDiffSchemaVersion;
  j["mode"] = "ranks";
  j["z_threshold"] = analysis::kRankZThreshold;
  j["min_relative_scale"] = analysis::kRankMinRelativeScale;
  Json list = Json::array();
  for (std::size_t i = 0; i < ranks.ranks.size(); ++i) {
    Json r = RunJson(ranks.ranks[i]);
    r["rank"] = i;
    const DeviceFigures* d = analysis::MainDevice(ranks.ranks[i]);
    r["device"] = d == nullptr ? Json(nullptr) : DiffDeviceJson(*d);
    list.push_back(std::move(r));
  }
  j["ranks"] = std::move(list);
  Json differing = Json::array();
  for (const RankFinding& f : ranks.differing) {
    Json deviations = Json::array();
    for (const RankDeviation& d : f.deviations) {
      deviations.push_back({{"figure", d.key},
                            {"direction", d.z > 0 ? "more" : "less"},
                            {"value", d.value},
                            {"median_of_others", d.median_of_others},
                            {"scale", d.scale},
                            {"z", d.z}});
    }
    Json extra = Json::array();
    for (const SiteMemory& s : f.extra_sites) extra.push_back(DiffSiteJson(s));
    Json missing = Json::array();
    for (const SiteMemory& s : f.missing_sites) {
      missing.push_back({{"site", s.site}, {"median_peak_live_bytes", s.peak_live_bytes}});
    }
    differing.push_back({{"rank", f.rank},
                         {"path", ranks.ranks[f.rank].path},
                         {"device", f.device},
                         {"score", f.score},
                         {"deviations", std::move(deviations)},
                         {"extra_sites", std::move(extra)},
                         {"missing_sites", std::move(missing)}});
  }
  j["differing"] = std::move(differing);
  return Dump(j, indent);
}

}  // namespace fragscope::sinks
