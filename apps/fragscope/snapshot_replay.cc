#include "snapshot_replay.h"

#include <algorithm>
#include <memory>

#include <fmt/format.h>

#include "analysis/trace_analyzer.h"
#include "cli_util.h"
#include "common/units.h"

namespace fragscope::cli {

Result<RecordedSettings> ReadRecordedSettings(sources::SnapshotReader& snapshot,
                                              const std::string& path, model::ConfigVersion version,
                                              std::vector<std::string>* notes) {
  RecordedSettings out;
  out.conf = snapshot.RecordedConf(notes);
  Result<model::AllocatorConfig> parsed = model::ParseAllocatorConfig(out.conf, version);
  if (!parsed.ok()) {
    return Status::InvalidArgument(
        fmt::format("{}:1: allocator_settings: {}", path, parsed.status().message()));
  }
  out.config = *parsed;
  return out;
}

Result<analysis::AnalysisResult> AnalyzeRecordedRun(sources::SnapshotReader& snapshot,
                                                    const std::string& path,
                                                    std::vector<std::string>* notes) {
  analysis::AnalysisOptions options;
  options.keep_layout = false;
  Result<std::unique_ptr<analysis::TraceAnalyzer>> analyzer =
      analysis::TraceAnalyzer::Create(snapshot.header(), options);
  if (!analyzer.ok()) {
    return Status::InvalidArgument(fmt::format("{}: {}", path, analyzer.status().message()));
  }
  Result<std::uint64_t> read = ReadSnapshotEvents(
      snapshot, [&](const Event& e) { return (*analyzer)->Consume(e); }, notes);
  if (!read.ok()) return Status::InvalidArgument(read.status().message());
  snapshot.Rewind();
  return (*analyzer)->Finish(path);
}

RecordedCapacities CapacitiesFromRecordedOoms(const analysis::AnalysisResult& real,
                                              const TraceHeader& header,
                                              std::string_view unknown_meaning,
                                              std::vector<std::string>* notes) {
  RecordedCapacities found;
  for (const DeviceInfo& d : header.devices) {
    const analysis::DeviceReport* report = nullptr;
    for (const analysis::DeviceReport& x : real.devices) {
      if (x.device == d.device) report = &x;
    }
    if (report == nullptr || report->oom_diagnoses.empty() ||
        !report->oom_diagnoses.front().device_free) {
      found.unknown.push_back(d.device);
      continue;
    }
    const analysis::OomDiagnosis& o = report->oom_diagnoses.front();
    const std::uint64_t bytes = o.reserved + *o.device_free;
    found.bytes[d.device] = bytes;
    notes->push_back(fmt::format(
        "device {}: capacity taken from its recorded OOM: reserved {} + driver free {} = {} "
        "(--capacity overrides)",
        d.device, FormatBytes(o.reserved), FormatBytes(*o.device_free), FormatBytes(bytes)));
  }
  std::sort(found.unknown.begin(), found.unknown.end());
  if (!found.unknown.empty()) {
    notes->push_back(fmt::format(
        "a snapshot does not record the device's capacity: devices without a recorded OOM {} "
        "(give --capacity to test a size)",
        unknown_meaning));
  }
  return found;
}

}  // namespace fragscope::cli
