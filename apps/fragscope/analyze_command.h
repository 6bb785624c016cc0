// `fragscope analyze FILE`: reads a trace, runs it through the TraceAnalyzer and prints the
// text report (or JSON with --json). Wiring only: sources -> analysis -> sinks.
#ifndef FRAGSCOPE_APPS_FRAGSCOPE_ANALYZE_COMMAND_H_
#define FRAGSCOPE_APPS_FRAGSCOPE_ANALYZE_COMMAND_H_

#include "command.h"
#include "pipeline/input.h"

namespace CLI {
class App;
}  // namespace CLI

namespace fragscope::cli {

/// Registers `analyze` on `app`. The returned Command's run() prints the report to stdout and
/// returns kExitOk, or prints "fragscope: file:line: what is wrong" to stderr and returns
/// kExitBadInput.
Command AddAnalyzeCommand(CLI::App& app);

/// What `analyze` computes for a trace or snapshot (pipeline/input.h), for the commands that
/// build on it (`history record`, `history compare`, `check`).
using pipeline::AnalyzeInput;

}  // namespace fragscope::cli

#endif  // FRAGSCOPE_APPS_FRAGSCOPE_ANALYZE_COMMAND_H_
