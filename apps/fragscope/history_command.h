// `fragscope history`: records run summaries in the SQLite history and compares a run with
// the earlier runs of its model architecture (docs/history.md). Wiring only: the analysis is
// `analyze`'s (AnalyzeInput), the summary and comparison are analysis::RunSummary's, the store
// is sinks::HistoryStore.
#ifndef FRAGSCOPE_APPS_FRAGSCOPE_HISTORY_COMMAND_H_
#define FRAGSCOPE_APPS_FRAGSCOPE_HISTORY_COMMAND_H_

#include <string>

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

}  // namespace fragscope::cli

#endif  // FRAGSCOPE_APPS_FRAGSCOPE_HISTORY_COMMAND_H_
