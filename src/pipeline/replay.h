// The pipeline's one entry point for "replay this input under these settings on this device":
// a request trace or a PyTorch memory snapshot, opened and told apart, its allocator settings
// (the flag's, the header's or the snapshot's recorded ones), the device capacities (the flag's,
// the header's, or what a snapshot's recorded OOMs reveal), the simulated trace analyzed, and
// for a snapshot the recorded run analyzed beside it and compared. `replay`, `check`, `tune`,
// `explain` and `report` build on it; a command parses flags, calls it and prints.
//
// A snapshot's figures come from what was recorded: the events that rebuild the state before
// its recorded history (SnapshotReader's start state, and the requests that rebuild it in a
// replay) are not part of the run, so peaks, extremes and the timeline count from the state
// they leave (TraceAnalyzer::ConsumeStartState, RequestReplayer::ResetPeakStats).
// docs/snapshots.md, "Recorded and rebuilt figures".
//
// Thread safety: each call is independent; ReplayInput may use a second thread internally.
#ifndef FRAGSCOPE_PIPELINE_REPLAY_H_
#define FRAGSCOPE_PIPELINE_REPLAY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "analysis/analysis_result.h"
#include "analysis/replay_result.h"
#include "analysis/trace_analyzer.h"
#include "fragscope/status.h"
#include "fragscope/trace.h"
#include "model/alloc_conf.h"
#include "model/bfc_allocator_sim.h"
#include "sources/snapshot/snapshot_reader.h"

namespace fragscope::pipeline {

/// What to replay and how.
struct ReplayRequest {
  std::string path;                       // request trace or snapshot
  std::optional<std::uint64_t> capacity;  // unset: the header's (a snapshot: see replay)
  std::optional<std::uint64_t> used_by_others;
  std::optional<std::string> alloc_conf;  // unset: the header's (a snapshot: recorded)
  model::ConfigVersion version = model::ConfigVersion::kNewest;
  bool continue_after_oom = false;
  std::string emit;  // also write the simulated allocator trace here (empty: don't)
  // The user named `emit` (--emit), so a link there to an existing file is followed; false for
  // a name the program chose (a temporary): a link there is refused (common/safe_file.h).
  bool emit_named_by_user = true;
  /// Whether a snapshot's segments are placed at the addresses the real driver gave them
  /// (model/recorded_addresses.h) instead of the simulator's own. Unset: yes for a snapshot (a
  /// request trace has none); true with a request trace is an error.
  std::optional<bool> recorded_addresses;
  /// 1: simulate and analyze on one thread; 2: analyze on a second thread meanwhile (the same
  /// result); 0: 2 when the machine has more than one hardware thread.
  unsigned threads = 0;
  analysis::AnalysisOptions options;  // for the analysis of the simulated allocator trace
  /// Set: replay through the BFC allocator model (TensorFlow / JAX) with these settings
  /// instead of PyTorch's caching allocator (ReplayBfcInput); alloc_conf, version and
  /// recorded_addresses must then be unset, and the input must be a request trace.
  std::optional<model::BfcSettings> bfc;
  /// Optional: sees every simulated event after the analysis accepted it (on the analysis
  /// thread), with the simulated trace's header and whether it rebuilds a snapshot's start
  /// state. An error ends the replay with it (`report` records its layouts here, so the
  /// simulated trace is never written to a file and read again).
  std::function<Status(const TraceHeader&, const Event&, bool start)> tap;
};

struct ReplayRun {
  analysis::ReplayResult replay;
  analysis::AnalysisResult result;  // the analysis of the simulated allocator trace
};

/// Replays `request.path` as `fragscope replay` does. An OOM is a result (replay.ooms), not an
/// error; errors (kInvalidArgument) name the file and where.
Result<ReplayRun> ReplayInput(const ReplayRequest& request);

/// ReplayInput for request.bfc: the request trace through model::BfcAllocatorSim, one per
/// device, each with the limit the settings give (memory_limit, or memory_fraction of the
/// device's capacity). Regions are reported as segments, chunks as blocks; memory_stats use
/// TensorFlow's / JAX's names (bytes_in_use, peak_bytes_in_use, pool_bytes, bytes_limit, ...).
Result<ReplayRun> ReplayBfcInput(const ReplayRequest& request);

/// Whether a replay puts segments at the recorded addresses: `wanted` (unset: yes for a
/// snapshot, no for a request trace, which records none). Yes for a request trace is an error
/// naming `path`.
Result<bool> UseRecordedAddresses(std::optional<bool> wanted, bool snapshot,
                                  const std::string& path);

struct RecordedSettings {
  std::string conf;  // as PYTORCH_CUDA_ALLOC_CONF would say it
  model::AllocatorConfig config;
};

/// The allocator settings the snapshot recorded (SnapshotReader::RecordedConf, which notes how
/// it found them), parsed for `version`. An error names the file's allocator_settings.
Result<RecordedSettings> ReadRecordedSettings(sources::SnapshotReader& snapshot,
                                              const std::string& path, model::ConfigVersion version,
                                              std::vector<std::string>* notes);

/// Analyzes the snapshot's recorded history (without the memory map; the rebuilt start state
/// counts only as the history's starting point), then rewinds `snapshot` for the next pass.
/// Events the analysis rejects are skipped with a note (ReadSnapshotEvents).
Result<analysis::AnalysisResult> AnalyzeRecordedRun(sources::SnapshotReader& snapshot,
                                                    const std::string& path,
                                                    std::vector<std::string>* notes);

struct RecordedCapacities {
  std::map<std::int32_t, std::uint64_t> bytes;  // devices whose first recorded OOM tells it
  std::vector<std::int32_t> unknown;            // the other devices of the header, ascending
};

/// The capacity of each device of `header` that `real` (AnalyzeRecordedRun) shows running out
/// of memory with the driver's free bytes recorded: as the allocator saw it, reserved + the
/// driver's free bytes at its first OOM. Appends a note per device found, and one for the
/// devices left without (`unknown_meaning` says what happens to them, e.g. "are replayed with
/// unlimited memory").
RecordedCapacities CapacitiesFromRecordedOoms(const analysis::AnalysisResult& real,
                                              const TraceHeader& header,
                                              std::string_view unknown_meaning,
                                              std::vector<std::string>* notes);

}  // namespace fragscope::pipeline

#endif  // FRAGSCOPE_PIPELINE_REPLAY_H_
