// Comparing runs (issue 33 item 2): what `fragscope diff` and `report --compare` put side by
// side. Main types:
//   SiteMemoryTracker  the requested bytes each call site holds live, over one input's events;
//   RunFigures         one run's figures per device, taken from its AnalysisResult (the same
//                      peaks and worst fragmentation `analyze` prints) and its call sites;
//   RunDiff            two runs against each other (CompareRuns);
//   RankComparison     N per-rank runs of one job, each against the median of the others
//                      (CompareRanks). docs/metrics.md, "Comparing runs", defines every figure.
//
// Thread safety: SiteMemoryTracker is not thread-safe; the functions are pure.
#ifndef FRAGSCOPE_ANALYSIS_COMPARE_H_
#define FRAGSCOPE_ANALYSIS_COMPARE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "analysis/analysis_result.h"
#include "analysis/diagnosis.h"
#include "fragscope/event.h"
#include "fragscope/trace.h"
#include "model/request_replayer.h"

namespace fragscope::analysis {

/// The memory one call site held over a run, on one device. Bytes are requested bytes (what the
/// program asked for), so a site's figures are the same whether the run was recorded or
/// replayed, and under any allocator settings.
struct SiteMemory {
  std::int32_t device = 0;
  std::string site;                   // NameSite's text: "file:line in name", or a label
  std::uint64_t peak_live_bytes = 0;  // max over the run of Σ requested bytes of its live allocs
  std::uint64_t live_bytes_at_end = 0;
  std::uint64_t allocs = 0;
  std::uint64_t requested_bytes = 0;  // Σ over all its allocs
};

/// Follows one input's events (a snapshot's rebuilt start state included: its live blocks are
/// the run's first moment) and keeps, per device and call-site id, the requested bytes of the
/// live allocations: an alloc (or a start-state block) adds its size, the first free_requested
/// or free_completed of its address removes it. Also keeps the call site of each device's first
/// oom event.
class SiteMemoryTracker {
 public:
  void Consume(const Event& e);
  /// The sites, named from the input's call-site table `frames` (the ids of Event::frame;
  /// allocations without one are "(no stack recorded)"), largest peak first; ids that name the
  /// same text are one site (their peaks add: an upper bound).
  std::vector<SiteMemory> Sites(const std::vector<Frame>& frames) const;
  /// The call-site id of `device`'s first oom event; -1 when it had none or named no site.
  std::int32_t FirstOomFrame(std::int32_t device) const;

 private:
  struct Live {
    std::int32_t frame = -1;
    std::uint64_t bytes = 0;
  };
  struct Counters {
    std::uint64_t live = 0;
    std::uint64_t peak = 0;
    std::uint64_t allocs = 0;
    std::uint64_t requested = 0;
  };
  std::map<std::pair<std::int32_t, std::uint64_t>, Live> live_;         // (device, addr)
  std::map<std::pair<std::int32_t, std::int32_t>, Counters> counters_;  // (device, frame)
  std::map<std::int32_t, std::int32_t> first_oom_frame_;                // device -> frame
};

/// The first OOM of a device: where, and which request.
struct RunOom {
  /// Event index of the oom event in the input (allocator traces, snapshots); for a replay, the
  /// index of the request event that failed in the replayed requests (request_index true).
  std::uint64_t event_index = 0;
  bool request_index = false;
  std::int64_t step = -1;     // step in progress, -1 before the first step marker
  std::int64_t time_us = -1;  // -1 unknown
  std::uint64_t requested = 0;
  std::uint64_t rounded = 0;
  Pool pool = Pool::kLarge;
  OomCause cause = OomCause::kShortage;
  std::uint64_t margin = 0;  // OomDiagnosis::margin
  std::string site;          // the request's call site, "" when the input names none
};

/// One device of a run.
struct DeviceFigures {
  std::int32_t device = 0;
  std::optional<std::uint64_t> capacity_bytes;
  std::uint64_t peak_reserved_bytes = 0;
  std::uint64_t peak_allocated_bytes = 0;
  std::uint64_t peak_requested_bytes = 0;  // peak live requested
  /// DeviceReport::worst_fragmentation_ratio; unset when no moment qualified.
  std::optional<double> worst_fragmentation_ratio;
  std::uint64_t worst_fragmentation_reserved_bytes = 0;
  std::uint64_t stranded_bytes_at_end = 0;  // final_metrics.all.stranded_bytes
  std::uint64_t num_ooms = 0;
  std::optional<RunOom> first_oom;
  std::vector<SiteMemory> sites;  // this device's, largest peak first
};

/// One run: an input as recorded, or replayed under some settings.
struct RunFigures {
  std::string path;
  std::string kind;                    // "snapshot", "allocator trace", "request trace"
  std::string how;                     // "as recorded", or "replayed on 1.00 GiB under <conf>"
  std::string alloc_conf;              // a replay's settings; "" as recorded (or the defaults)
  std::uint64_t steps = 0;             // step markers the run saw (AnalysisResult::steps)
  std::vector<DeviceFigures> devices;  // ascending device
  std::vector<std::string> notes;
};

/// The figures of a run from its analysis (`result`: of the input, or of a replay's simulated
/// trace) and its call sites' memory (`sites`: SiteMemoryTracker::Sites of the input).
/// `first_oom_site` gives a device's first oom call site ("" unknown).
RunFigures FiguresOf(const AnalysisResult& result, const std::vector<SiteMemory>& sites,
                     const std::map<std::int32_t, std::string>& first_oom_site);

/// For a replay: each device's first OOM is the replayer's (the request event that failed,
/// its step), keeping the diagnosis' cause and figures.
void UseReplayOoms(const std::vector<model::ReplayOom>& ooms, RunFigures* run);

/// One call site's change between two runs (the same device pairing as DeviceDiff).
struct SiteChange {
  std::string site;
  std::uint64_t a_peak_bytes = 0;  // 0 when the site is absent from A
  std::uint64_t b_peak_bytes = 0;
  bool in_a = false;
  bool in_b = false;
  std::int64_t ChangeBytes() const {
    return static_cast<std::int64_t>(b_peak_bytes) - static_cast<std::int64_t>(a_peak_bytes);
  }
};

/// One device of A against one of B; either may be absent (a device of one run only).
struct DeviceDiff {
  std::optional<DeviceFigures> a;
  std::optional<DeviceFigures> b;
  std::vector<SiteChange> site_changes;  // the `top_sites` largest |change|, nonzero only
  std::size_t sites_changed = 0;         // sites whose peak changed at all
};

struct RunDiff {
  RunFigures a;
  RunFigures b;
  /// Devices are paired by index, except when each run has exactly one device: then those two
  /// are compared whatever their indexes (per-rank dumps record each rank's own device).
  std::vector<DeviceDiff> devices;
};

/// A against B, with the `top_sites` call sites whose peak live bytes changed most.
RunDiff CompareRuns(RunFigures a, RunFigures b, std::size_t top_sites = 10);

/// A figure of a rank that lies far from the other ranks'.
struct RankDeviation {
  std::string figure;  // "peak requested", ...
  std::string key;     // its JSON key: "peak_requested_bytes", ...
  bool bytes = true;   // false: a ratio
  double value = 0;
  double median_of_others = 0;
  double scale = 0;  // max(1.4826 × MAD of the others, the floor)
  double z = 0;      // (value - median_of_others) / scale
};

/// Why one rank differs from the others.
struct RankFinding {
  std::size_t rank = 0;  // position among the inputs (0-based)
  std::int32_t device = 0;
  std::vector<RankDeviation> deviations;  // |z| >= kRankZThreshold, largest |z| first
  std::vector<SiteMemory> extra_sites;    // significant here, absent from every other rank
  std::vector<SiteMemory> missing_sites;  // significant in every other rank, absent here
                                          // (peak_live_bytes: the median of the others')
  double score = 0;                       // largest |z| (0 when only sites differ)
};

/// A rank differs when a figure lies at least this many robust deviations from the median of
/// the other ranks (Iglewicz and Hoaglin's cut-off for modified z-scores).
inline constexpr double kRankZThreshold = 3.5;
/// The deviation is at least this fraction of the others' median (and 1 MiB for bytes, 0.01
/// for a ratio), so that identical ranks do not make a tiny difference infinite.
inline constexpr double kRankMinRelativeScale = 0.02;
/// A call site counts for extra/missing when its peak reaches max(1 MiB, this fraction of the
/// rank's peak requested).
inline constexpr double kRankSiteMinShare = 0.01;

struct RankComparison {
  std::vector<RunFigures> ranks;
  std::vector<std::int32_t> devices;   // the device compared of each rank (MainDevice)
  std::vector<RankFinding> differing;  // most different first (score, then site findings)
};

/// The device a rank's figures come from: the one with the highest peak reserved (ties: the
/// lowest index); nullptr when the run has none.
const DeviceFigures* MainDevice(const RunFigures& run);

/// Each rank against the median of the others. REQUIRES: at least three ranks.
RankComparison CompareRanks(std::vector<RunFigures> ranks);

}  // namespace fragscope::analysis

#endif  // FRAGSCOPE_ANALYSIS_COMPARE_H_
