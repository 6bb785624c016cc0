// `fragscope analyze FILE`: reads a trace, runs it through the TraceAnalyzer and prints the
// text report (or JSON with --json). Wiring only: sources -> analysis -> sinks.
#ifndef FRAGSCOPE_APPS_FRAGSCOPE_ANALYZE_COMMAND_H_
#define FRAGSCOPE_APPS_FRAGSCOPE_ANALYZE_COMMAND_H_

#include <functional>
#include <string>
#include <vector>

#include "analysis/analysis_result.h"
#include "analysis/trace_analyzer.h"
#include "command.h"
#include "fragscope/status.h"
#include "fragscope/trace.h"

namespace CLI {
class App;
}  // namespace CLI

namespace fragscope::cli {

/// Registers `analyze` on `app`. The returned Command's run() prints the report to stdout and
/// returns kExitOk, or prints "fragscope: file:line: what is wrong" to stderr and returns
/// kExitBadInput.
Command AddAnalyzeCommand(CLI::App& app);

/// What `analyze` computes for the trace or snapshot at `path` (snapshot notes and call-site
/// names included), for the commands that build on it (`history record`, `history compare`).
/// Errors name the file and where in it, as `analyze` prints them. `threads` as `--threads`
/// (AnalysisThreads): a trace is parsed and analyzed on two threads unless it is 1. `tap`
/// (optional) sees every event the analyzer accepted, after it, with the input's header
/// (`report` records layouts); with a tap the analysis runs on this thread. `call_sites` (optional)
/// receives the input's call-site table (the ids of Event::frame).
Result<analysis::AnalysisResult> AnalyzeInput(
    const std::string& path, const analysis::AnalysisOptions& options,
    const TraceLimits& limits = {}, unsigned threads = 0,
    const std::function<void(const TraceHeader&, const Event&)>& tap = {},
    std::vector<Frame>* call_sites = nullptr);

}  // namespace fragscope::cli

#endif  // FRAGSCOPE_APPS_FRAGSCOPE_ANALYZE_COMMAND_H_
