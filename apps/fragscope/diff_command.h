// `fragscope diff A B`: two runs side by side (snapshots, traces, or one trace under two
// allocator settings), and `fragscope diff r0 r1 ... rN`: the per-rank dumps of one job, with
// the rank that differs and why (issue 33 item 2). Wiring only: pipeline (AnalyzeInput,
// ReplayInput) -> analysis/compare.h -> sinks/report/diff_report.h. `report --compare` reads
// its two runs through ReadRunFigures too. docs/user-guide.md, "Comparing runs".
#ifndef FRAGSCOPE_APPS_FRAGSCOPE_DIFF_COMMAND_H_
#define FRAGSCOPE_APPS_FRAGSCOPE_DIFF_COMMAND_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "analysis/compare.h"
#include "command.h"
#include "fragscope/status.h"
#include "model/alloc_conf.h"

namespace CLI {
class App;
}  // namespace CLI

namespace fragscope::cli {

/// Registers `diff` on `app`. Exit status: 0 when the comparison was printed (whatever it
/// found), 2 for bad input or usage (one file without --alloc-conf, inputs of different
/// kinds, an unreadable file: the message names which input and where), 1 when the output
/// cannot be written.
Command AddDiffCommand(CLI::App& app);

/// One side of a comparison: an input, and how to run it.
struct RunSpec {
  std::string path;
  /// Replay the input's requests under these settings (a request trace is always replayed:
  /// under its header's settings when unset).
  std::optional<std::string> alloc_conf;
  std::optional<std::uint64_t> capacity;  // replay on a device of this size
  std::optional<std::uint64_t> used_by_others;
  model::ConfigVersion version = model::ConfigVersion::kNewest;
  /// Replay a snapshot even without alloc_conf or capacity (one input under two settings:
  /// both sides replayed, so that only the settings differ).
  bool force_replay = false;
};

/// The figures of each run: its input analyzed as recorded, or its requests replayed (a request
/// trace; any input given alloc_conf, capacity or force_replay), with each call site's memory
/// from the input's own events. Every input is read before any is replayed. Errors
/// (kInvalidArgument) start with "A: ", "B: " (two specs) or "rank N: " and name the file and
/// where; inputs of different kinds (snapshot, allocator trace, request trace) are refused.
Result<std::vector<analysis::RunFigures>> ReadRuns(const std::vector<RunSpec>& specs);

}  // namespace fragscope::cli

#endif  // FRAGSCOPE_APPS_FRAGSCOPE_DIFF_COMMAND_H_
