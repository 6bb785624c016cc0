// What a replay of a PyTorch memory snapshot takes from the file besides its requests, shared
// by `replay`, `tune` and `explain`: the allocator settings it recorded, the recorded run
// analyzed as it happened (its peaks and OOMs), and the device capacities its recorded OOMs
// reveal. A snapshot does not record how much memory
// the GPU had; a device that ran out of memory tells it, as the allocator saw it: reserved +
// the driver's free bytes at its first OOM (memory used by others counts as part of neither).
// docs/snapshots.md, "Re-simulation".
#ifndef FRAGSCOPE_APPS_FRAGSCOPE_SNAPSHOT_REPLAY_H_
#define FRAGSCOPE_APPS_FRAGSCOPE_SNAPSHOT_REPLAY_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "analysis/analysis_result.h"
#include "fragscope/status.h"
#include "fragscope/trace.h"
#include "model/alloc_conf.h"
#include "sources/snapshot/snapshot_reader.h"

namespace fragscope::cli {

struct RecordedSettings {
  std::string conf;  // as PYTORCH_CUDA_ALLOC_CONF would say it
  model::AllocatorConfig config;
};

/// The allocator settings the snapshot recorded (SnapshotReader::RecordedConf, which notes how
/// it found them), parsed for `version`. An error names the file's allocator_settings.
Result<RecordedSettings> ReadRecordedSettings(sources::SnapshotReader& snapshot,
                                              const std::string& path, model::ConfigVersion version,
                                              std::vector<std::string>* notes);

/// Analyzes the snapshot's recorded history (without the memory map), then rewinds `snapshot`
/// for the next pass. Events the analysis rejects are skipped with a note (ReadSnapshotEvents).
Result<analysis::AnalysisResult> AnalyzeRecordedRun(sources::SnapshotReader& snapshot,
                                                    const std::string& path,
                                                    std::vector<std::string>* notes);

struct RecordedCapacities {
  std::map<std::int32_t, std::uint64_t> bytes;  // devices whose first recorded OOM tells it
  std::vector<std::int32_t> unknown;            // the other devices of the header, ascending
};

/// The capacity of each device of `header` that `real` (AnalyzeRecordedRun) shows running out
/// of memory with the driver's free bytes recorded. Appends a note per device found, and one
/// for the devices left without (`unknown_meaning` says what happens to them, e.g. "are
/// replayed with unlimited memory").
RecordedCapacities CapacitiesFromRecordedOoms(const analysis::AnalysisResult& real,
                                              const TraceHeader& header,
                                              std::string_view unknown_meaning,
                                              std::vector<std::string>* notes);

}  // namespace fragscope::cli

#endif  // FRAGSCOPE_APPS_FRAGSCOPE_SNAPSHOT_REPLAY_H_
