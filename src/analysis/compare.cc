#include "analysis/compare.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "common/units.h"

namespace fragscope::analysis {

// ---------------------------------------------------------------------------------------------
// SiteMemoryTracker
// ---------------------------------------------------------------------------------------------

void SiteMemoryTracker::Consume(const Event& e) {
  switch (e.action) {
    case Action::kAlloc:
    case Action::kBlock: {
      const auto key = std::make_pair(e.device, e.addr);
      if (live_.count(key) != 0) return;  // the analysis refuses it; it is counted once
      live_[key] = Live{e.frame, e.size};
      Counters& c = counters_[{e.device, e.frame}];
      c.live += e.size;
      c.peak = std::max(c.peak, c.live);
      ++c.allocs;
      c.requested += e.size;
      return;
    }
    case Action::kFreeRequested:
    case Action::kFreeCompleted: {
      const auto found = live_.find({e.device, e.addr});
      if (found == live_.end()) return;  // freed already (free_requested, then _completed)
      Counters& c = counters_[{e.device, found->second.frame}];
      c.live -= std::min(c.live, found->second.bytes);
      live_.erase(found);
      return;
    }
    case Action::kOom:
      first_oom_frame_.emplace(e.device, e.frame);
      return;
    default:
      return;
  }
}

std::vector<SiteMemory> SiteMemoryTracker::Sites(const std::vector<Frame>& frames) const {
  std::map<std::pair<std::int32_t, std::string>, SiteMemory> by_name;
  for (const auto& [key, c] : counters_) {
    SiteStranding named;
    named.frame = key.second;
    NameSite(frames, &named);
    SiteMemory& s = by_name[{key.first, named.site}];
    s.device = key.first;
    s.site = named.site;
    s.peak_live_bytes += c.peak;
    s.live_bytes_at_end += c.live;
    s.allocs += c.allocs;
    s.requested_bytes += c.requested;
  }
  std::vector<SiteMemory> out;
  out.reserve(by_name.size());
  for (auto& [key, s] : by_name) out.push_back(std::move(s));
  const auto larger = [](const SiteMemory& x, const SiteMemory& y) {
    if (x.device != y.device) return x.device < y.device;
    if (x.peak_live_bytes != y.peak_live_bytes) return x.peak_live_bytes > y.peak_live_bytes;
    return x.site < y.site;
  };
  std::sort(out.begin(), out.end(), larger);
  return out;
}

std::int32_t SiteMemoryTracker::FirstOomFrame(std::int32_t device) const {
  const auto found = first_oom_frame_.find(device);
  return found == first_oom_frame_.end() ? -1 : found->second;
}

// ---------------------------------------------------------------------------------------------
// One run's figures
// ---------------------------------------------------------------------------------------------

RunFigures FiguresOf(const AnalysisResult& result, const std::vector<SiteMemory>& sites,
                     const std::map<std::int32_t, std::string>& first_oom_site) {
  RunFigures run;
  run.path = result.source;
  run.notes = result.notes;
  run.steps = result.steps;
  for (const DeviceReport& d : result.devices) {
    DeviceFigures f;
    f.device = d.device;
    f.capacity_bytes = d.capacity_bytes;
    f.peak_reserved_bytes = d.peak_reserved.bytes;
    f.peak_allocated_bytes = d.peak_allocated.bytes;
    f.peak_requested_bytes = d.peak_live_requested.bytes;
    if (d.worst_fragmentation.seen) {
      f.worst_fragmentation_ratio = d.worst_fragmentation_ratio;
      f.worst_fragmentation_reserved_bytes = d.worst_fragmentation_reserved;
    }
    f.stranded_bytes_at_end = d.final_metrics.all.stranded_bytes;
    f.num_ooms = d.num_ooms;
    if (!d.oom_diagnoses.empty()) {
      const OomDiagnosis& o = d.oom_diagnoses.front();
      RunOom oom;
      oom.event_index = o.event_index;
      oom.step = o.step;
      oom.time_us = o.time_us;
      oom.requested = o.requested;
      oom.rounded = o.rounded;
      oom.pool = o.pool;
      oom.cause = o.cause;
      oom.margin = o.margin;
      if (const auto s = first_oom_site.find(d.device); s != first_oom_site.end()) {
        oom.site = s->second;
      }
      f.first_oom = oom;
    }
    for (const SiteMemory& s : sites) {
      if (s.device == d.device) f.sites.push_back(s);
    }
    run.devices.push_back(std::move(f));
  }
  const auto by_device = [](const DeviceFigures& x, const DeviceFigures& y) {
    return x.device < y.device;
  };
  std::sort(run.devices.begin(), run.devices.end(), by_device);
  return run;
}

void UseReplayOoms(const std::vector<model::ReplayOom>& ooms, RunFigures* run) {
  for (DeviceFigures& d : run->devices) {
    for (const model::ReplayOom& oom : ooms) {
      if (oom.device != d.device) continue;
      if (!d.first_oom) {
        d.first_oom = RunOom{};
        d.first_oom->requested = oom.details.requested;
        d.first_oom->rounded = oom.details.rounded;
      }
      d.first_oom->event_index = oom.event_index;
      d.first_oom->request_index = true;
      d.first_oom->step = oom.step;
      d.first_oom->time_us = -1;
      break;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Two runs
// ---------------------------------------------------------------------------------------------

namespace {

DeviceDiff PairDevices(std::optional<DeviceFigures> a, std::optional<DeviceFigures> b,
                       std::size_t top_sites) {
  DeviceDiff diff;
  std::map<std::string, SiteChange> changes;
  if (a) {
    for (const SiteMemory& s : a->sites) {
      SiteChange& c = changes[s.site];
      c.site = s.site;
      c.a_peak_bytes = s.peak_live_bytes;
      c.in_a = true;
    }
  }
  if (b) {
    for (const SiteMemory& s : b->sites) {
      SiteChange& c = changes[s.site];
      c.site = s.site;
      c.b_peak_bytes = s.peak_live_bytes;
      c.in_b = true;
    }
  }
  for (auto& [name, c] : changes) {
    if (c.ChangeBytes() == 0) continue;
    ++diff.sites_changed;
    diff.site_changes.push_back(std::move(c));
  }
  // Largest |change| first; ties: the larger peak, then the name, so the order is stable.
  const auto most_changed = [](const SiteChange& x, const SiteChange& y) {
    const std::uint64_t dx = static_cast<std::uint64_t>(std::llabs(x.ChangeBytes()));
    const std::uint64_t dy = static_cast<std::uint64_t>(std::llabs(y.ChangeBytes()));
    if (dx != dy) return dx > dy;
    const std::uint64_t px = std::max(x.a_peak_bytes, x.b_peak_bytes);
    const std::uint64_t py = std::max(y.a_peak_bytes, y.b_peak_bytes);
    if (px != py) return px > py;
    return x.site < y.site;
  };
  std::sort(diff.site_changes.begin(), diff.site_changes.end(), most_changed);
  if (diff.site_changes.size() > top_sites) diff.site_changes.resize(top_sites);
  diff.a = std::move(a);
  diff.b = std::move(b);
  return diff;
}

}  // namespace

RunDiff CompareRuns(RunFigures a, RunFigures b, std::size_t top_sites) {
  RunDiff diff;
  if (a.devices.size() == 1 && b.devices.size() == 1) {
    diff.devices.push_back(PairDevices(a.devices.front(), b.devices.front(), top_sites));
  } else {
    std::set<std::int32_t> ids;
    for (const DeviceFigures& d : a.devices) ids.insert(d.device);
    for (const DeviceFigures& d : b.devices) ids.insert(d.device);
    for (std::int32_t id : ids) {
      std::optional<DeviceFigures> da, db;
      for (const DeviceFigures& d : a.devices) {
        if (d.device == id) da = d;
      }
      for (const DeviceFigures& d : b.devices) {
        if (d.device == id) db = d;
      }
      diff.devices.push_back(PairDevices(std::move(da), std::move(db), top_sites));
    }
  }
  diff.a = std::move(a);
  diff.b = std::move(b);
  return diff;
}

// ---------------------------------------------------------------------------------------------
// N ranks
// ---------------------------------------------------------------------------------------------

const DeviceFigures* MainDevice(const RunFigures& run) {
  const DeviceFigures* main = nullptr;
  for (const DeviceFigures& d : run.devices) {
    if (main == nullptr || d.peak_reserved_bytes > main->peak_reserved_bytes) main = &d;
  }
  return main;
}

namespace {

double MedianOf(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

struct RankFigureDef {
  const char* figure;
  const char* key;
  bool bytes;
  double (*value)(const DeviceFigures&);
};

double PeakRequested(const DeviceFigures& d) { return static_cast<double>(d.peak_requested_bytes); }
double PeakAllocated(const DeviceFigures& d) { return static_cast<double>(d.peak_allocated_bytes); }
double PeakReserved(const DeviceFigures& d) { return static_cast<double>(d.peak_reserved_bytes); }
double WorstFragmentation(const DeviceFigures& d) {
  return d.worst_fragmentation_ratio.value_or(0);
}
double StrandedAtEnd(const DeviceFigures& d) {
  return static_cast<double>(d.stranded_bytes_at_end);
}

// The figures a rank is judged on, in the order a finding lists them when |z| ties.
constexpr RankFigureDef kRankFigures[] = {
    {"peak requested", "peak_requested_bytes", true, &PeakRequested},
    {"peak allocated", "peak_allocated_bytes", true, &PeakAllocated},
    {"peak reserved", "peak_reserved_bytes", true, &PeakReserved},
    {"worst fragmentation ratio", "worst_fragmentation_ratio", false, &WorstFragmentation},
    {"stranded at the end", "stranded_bytes_at_end", true, &StrandedAtEnd},
};

bool Significant(const SiteMemory& s, const DeviceFigures& d) {
  const double floor = std::max(static_cast<double>(kMiB),
                                kRankSiteMinShare * static_cast<double>(d.peak_requested_bytes));
  return static_cast<double>(s.peak_live_bytes) >= floor;
}

// Per site name: on how many ranks it is, and on how many it is significant.
struct SiteCounts {
  std::unordered_map<std::string_view, std::size_t> ranks_with;
  std::map<std::string_view, std::size_t> ranks_significant;  // ordered: findings are stable
};

}  // namespace

RankComparison CompareRanks(std::vector<RunFigures> ranks) {
  RankComparison out;
  std::vector<const DeviceFigures*> main;
  for (const RunFigures& r : ranks) main.push_back(MainDevice(r));
  const std::size_t n = ranks.size();
  // Each rank's sites by name, and on how many ranks each site is (significant), so that the
  // site findings cost O(ranks x sites), not its square: per-rank dumps of a real job can
  // hold thousands of sites each.
  std::vector<std::unordered_map<std::string_view, const SiteMemory*>> index(n);
  SiteCounts sites;
  std::size_t ranks_with_device = 0;
  for (std::size_t j = 0; j < n; ++j) {
    if (main[j] == nullptr) continue;
    ++ranks_with_device;
    for (const SiteMemory& s : main[j]->sites) {
      index[j].emplace(s.site, &s);
      ++sites.ranks_with[s.site];
      if (Significant(s, *main[j])) ++sites.ranks_significant[s.site];
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (main[i] == nullptr) continue;
    RankFinding finding;
    finding.rank = i;
    finding.device = main[i]->device;
    for (const RankFigureDef& def : kRankFigures) {
      std::vector<double> others;
      for (std::size_t j = 0; j < n; ++j) {
        if (j != i && main[j] != nullptr) others.push_back(def.value(*main[j]));
      }
      if (others.empty()) continue;
      const double median = MedianOf(others);
      std::vector<double> deviations;
      for (double x : others) deviations.push_back(std::fabs(x - median));
      const double unit_floor = def.bytes ? static_cast<double>(kMiB) : 0.01;
      const double scale = std::max(
          {1.4826 * MedianOf(deviations), kRankMinRelativeScale * std::fabs(median), unit_floor});
      const double value = def.value(*main[i]);
      const double z = (value - median) / scale;
      if (std::fabs(z) < kRankZThreshold) continue;
      finding.deviations.push_back(
          RankDeviation{def.figure, def.key, def.bytes, value, median, scale, z});
      finding.score = std::max(finding.score, std::fabs(z));
    }
    const auto by_abs_z = [](const RankDeviation& x, const RankDeviation& y) {
      return std::fabs(x.z) > std::fabs(y.z);
    };
    std::stable_sort(finding.deviations.begin(), finding.deviations.end(), by_abs_z);
    // Sites: only this rank has it, or every other rank has it (significant) and this one not.
    for (const SiteMemory& s : main[i]->sites) {
      if (Significant(s, *main[i]) && sites.ranks_with[s.site] == 1) {
        finding.extra_sites.push_back(s);
      }
    }
    for (const auto& [site, count] : sites.ranks_significant) {
      if (count != ranks_with_device - 1 || index[i].count(site) != 0) continue;
      std::vector<double> peaks;
      for (std::size_t j = 0; j < n; ++j) {
        if (j == i || main[j] == nullptr) continue;
        peaks.push_back(static_cast<double>(index[j].at(site)->peak_live_bytes));
      }
      SiteMemory missing;
      missing.device = main[i]->device;
      missing.site = site;
      missing.peak_live_bytes = static_cast<std::uint64_t>(MedianOf(peaks));
      finding.missing_sites.push_back(std::move(missing));
    }
    const auto by_peak = [](const SiteMemory& x, const SiteMemory& y) {
      if (x.peak_live_bytes != y.peak_live_bytes) return x.peak_live_bytes > y.peak_live_bytes;
      return x.site < y.site;
    };
    std::sort(finding.missing_sites.begin(), finding.missing_sites.end(), by_peak);
    if (!finding.deviations.empty() || !finding.extra_sites.empty() ||
        !finding.missing_sites.empty()) {
      out.differing.push_back(std::move(finding));
    }
  }
  const auto most_different = [](const RankFinding& x, const RankFinding& y) {
    if (x.score != y.score) return x.score > y.score;
    return x.rank < y.rank;
  };
  std::stable_sort(out.differing.begin(), out.differing.end(), most_different);
  for (const DeviceFigures* d : main) out.devices.push_back(d == nullptr ? -1 : d->device);
  out.ranks = std::move(ranks);
  return out;
}

}  // namespace fragscope::analysis
