// `fragscope replay TRACE --capacity SIZE`: replays a request trace through the caching-
// allocator simulator on a virtual GPU and reports whether and where it runs out of memory,
// then analyzes the simulated allocator trace. Wiring only: sources -> sim -> analysis -> sinks.
#ifndef FRAGSCOPE_APPS_FRAGSCOPE_REPLAY_COMMAND_H_
#define FRAGSCOPE_APPS_FRAGSCOPE_REPLAY_COMMAND_H_

#include <cstdint>
#include <optional>
#include <string>

#include "analysis/analysis_result.h"
#include "analysis/replay_result.h"
#include "analysis/trace_analyzer.h"
#include "command.h"
#include "fragscope/status.h"
#include "model/alloc_conf.h"

namespace CLI {
class App;
}  // namespace CLI

namespace fragscope::cli {

/// Registers `replay` on `app`. Exit status: 0 when the trace replays without an OOM, 1 when
/// it runs out of memory (the report says where), 2 for bad input or usage.
Command AddReplayCommand(CLI::App& app);

/// What to replay and how: the options of `replay`, already parsed.
struct ReplayRequest {
  std::string path;                       // request trace or snapshot
  std::optional<std::uint64_t> capacity;  // unset: the header's (a snapshot: see replay)
  std::optional<std::uint64_t> used_by_others;
  std::optional<std::string> alloc_conf;  // unset: the header's (a snapshot: recorded)
  model::ConfigVersion version = model::ConfigVersion::kNewest;
  bool continue_after_oom = false;
  std::string emit;  // also write the simulated allocator trace here (empty: don't)
  /// Whether a snapshot's segments are placed at the addresses the real driver gave them
  /// (model/recorded_addresses.h) instead of the simulator's own. Unset: yes for a snapshot (a
  /// request trace has none); true with a request trace is an error.
  std::optional<bool> recorded_addresses;
  /// 1: simulate and analyze on one thread; 2: analyze on a second thread meanwhile (the same
  /// result); 0: 2 when the machine has more than one hardware thread.
  unsigned threads = 0;
  analysis::AnalysisOptions options;  // for the analysis of the simulated allocator trace
};

struct ReplayRun {
  analysis::ReplayResult replay;
  analysis::AnalysisResult result;  // the analysis of the simulated allocator trace
};

/// Replays `request.path` as `fragscope replay` does, for the commands that build on it
/// (`check`). An OOM is a result (replay.ooms), not an error; errors name the file and where.
Result<ReplayRun> ReplayInput(const ReplayRequest& request);

}  // namespace fragscope::cli

#endif  // FRAGSCOPE_APPS_FRAGSCOPE_REPLAY_COMMAND_H_
