// `fragscope history`: records run summaries in the SQLite history and compares a run with
// the earlier runs of its model architecture (docs/history.md). Wiring only: the analysis is
// `analyze`'s (AnalyzeInput), the summary and comparison are analysis::RunSummary's, the store
// is sinks::HistoryStore.
#ifndef FRAGSCOPE_APPS_FRAGSCOPE_HISTORY_COMMAND_H_
#define FRAGSCOPE_APPS_FRAGSCOPE_HISTORY_COMMAND_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "analysis/analysis_result.h"
#include "analysis/run_summary.h"
#include "command.h"
#include "fragscope/status.h"

namespace CLI {
class App;
}  // namespace CLI

namespace fragscope::cli {

/// Registers `history` (record, list, show, compare, forget) on `app`.
Command AddHistoryCommand(CLI::App& app);

/// The history file to use: `flag` when set (--history PATH), else the XDG default
/// (sinks::DefaultHistoryPath). For the other commands that take --history.
Result<std::string> HistoryPath(const std::string& flag);

/// How `device` of `result` compares with the last `last` runs of `architecture` in the
/// history at `history_flag` (see HistoryPath). `run` names the current run (empty: the
/// result's "run" label), so that a run recorded already is not its own baseline. A missing history
/// file is "no baseline" (a comparison without runs), a damaged one an error. Errors of
/// SummarizeRun pass through.
Result<analysis::BaselineComparison> CompareWithHistory(const analysis::AnalysisResult& result,
                                                        std::int32_t device, const std::string& run,
                                                        const std::string& architecture,
                                                        const std::string& history_flag,
                                                        std::size_t last);

/// For a --baseline label without earlier runs: "; labels with runs: a, b (did you mean a?)"
/// from the history `history_flag` names (as --history), "; the history has no runs yet", or ""
/// when there is no history to read.
std::string KnownArchitecturesHint(const std::string& architecture,
                                   const std::string& history_flag);

}  // namespace fragscope::cli

#endif  // FRAGSCOPE_APPS_FRAGSCOPE_HISTORY_COMMAND_H_
