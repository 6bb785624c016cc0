// The HTML report (`fragscope report`): one self-contained file — the analysis as JSON inside
// a <script> element, the page's JavaScript and CSS inlined (src/sinks/html/report.js,
// report.css, compiled into the binary) — that draws the timeline charts, the memory map at a
// chosen moment, the OOM panel and the call sites. No network at view time. docs/report.md.
//
// Thread safety: pure functions.
#ifndef FRAGSCOPE_SINKS_HTML_HTML_REPORT_H_
#define FRAGSCOPE_SINKS_HTML_HTML_REPORT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "analysis/analysis_result.h"
#include "analysis/explain.h"
#include "analysis/layout_frames.h"
#include "analysis/replay_result.h"
#include "analysis/tune.h"
#include "fragscope/trace.h"

namespace fragscope::sinks {

struct HtmlReportInput {
  const analysis::AnalysisResult* result = nullptr;  // required
  /// Set when the report is of a replay (a request trace or snapshot under --capacity).
  const analysis::ReplayResult* replay = nullptr;
  std::vector<analysis::DeviceFrames> frames;  // the layouts at chosen moments, per device
  std::vector<Frame> call_sites;               // the input's call-site table (ids index it)
  /// A snapshot's stack table (Event::stack ids index it; frame ids index call_sites); empty
  /// for a trace. The page shows the stack of every allocation in a kept map.
  std::vector<std::vector<std::uint32_t>> stacks;
  /// The call sites drawn one by one in "active memory by call site" (the rest is "other").
  std::size_t top_sites = 8;
  /// Per device: explain's verdict and ranked remedies for its first OOM (ExplainOom on the
  /// figures of the diagnosis, remedies maybe checked by VerifyRemedies).
  std::map<std::int32_t, analysis::OomExplanation> explanations;
  const std::vector<analysis::TuneOutcome>* tune = nullptr;  // --tune: ranked settings
  /// Why the recorded history cannot tell those settings apart (analysis::TuneCannotRank), or
  /// empty: shown above the table.
  std::string tune_cannot_rank;
  std::string command;  // the command line that made the report
  /// `report --compare B`: the comparison of this input (A) with B, as `diff --format json`
  /// writes it (sinks/report/diff_report.h); empty: no compare section.
  std::string compare_json;
};

/// The one-sentence verdict of a device: "Out of memory at step 12 (event 3,041) on device 0:
/// fragmentation — ..." or "Fits: peak reserved 3.1 GiB ...". The page shows it as is.
std::string DeviceVerdict(const analysis::AnalysisResult& result,
                          const analysis::DeviceReport& device);

/// The verdict of the whole input: the first device that ran out of memory, else the one with
/// the highest peak reserved; "no device had an event" when there is none.
std::string ReportVerdict(const analysis::AnalysisResult& result);

/// The report page.
std::string RenderHtml(const HtmlReportInput& input);

}  // namespace fragscope::sinks

#endif  // FRAGSCOPE_SINKS_HTML_HTML_REPORT_H_
