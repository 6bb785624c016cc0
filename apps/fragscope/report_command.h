// `fragscope report FILE [-o report.html]`: one self-contained HTML page of the analysis — the
// verdict, the timeline charts, the memory map at any chosen moment, the OOM panel with
// explain's remedies, the call sites that strand memory. Wiring only: sources -> analysis
// (TraceAnalyzer, LayoutRecorder, ExplainOom, Tune) -> sinks/html. docs/report.md.
#ifndef FRAGSCOPE_APPS_FRAGSCOPE_REPORT_COMMAND_H_
#define FRAGSCOPE_APPS_FRAGSCOPE_REPORT_COMMAND_H_

#include "command.h"

namespace CLI {
class App;
}  // namespace CLI

namespace fragscope::cli {

/// Registers `report` on `app`. Exit status: 0 when the report was written, 2 for bad input or
/// usage (the same messages as `analyze`/`replay`) or a report over --max-size (nothing is
/// written then), 1 when the output cannot be written.
Command AddReportCommand(CLI::App& app);

}  // namespace fragscope::cli

#endif  // FRAGSCOPE_APPS_FRAGSCOPE_REPORT_COMMAND_H_
