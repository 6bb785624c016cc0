// Reports of `fragscope replay`: the replay's outcome (did the trace fit, where it ran out of
// memory and PyTorch's exact message, the simulator's memory_stats) followed by the analysis
// of the simulated allocator trace (the same report as `fragscope analyze`).
//
// JSON: schema "fragscope.replay" version 1 (docs/json-schema.md), with the analyze report
// embedded under "analysis".
#ifndef FRAGSCOPE_SINKS_REPORT_REPLAY_REPORT_H_
#define FRAGSCOPE_SINKS_REPORT_REPLAY_REPORT_H_

#include <string>

#include "analysis/analysis_result.h"
#include "analysis/replay_result.h"
#include "sinks/report/json_report.h"
#include "sinks/report/text_report.h"

namespace fragscope::sinks {

inline constexpr char kReplaySchemaName[] = "fragscope.replay";
inline constexpr int kReplaySchemaVersion = 1;

std::string RenderReplayText(const analysis::ReplayResult& replay,
                             const analysis::AnalysisResult& analysis, const TextOptions& options);

std::string RenderReplayJson(const analysis::ReplayResult& replay,
                             const analysis::AnalysisResult& analysis, const JsonOptions& options);

}  // namespace fragscope::sinks

#endif  // FRAGSCOPE_SINKS_REPORT_REPLAY_REPORT_H_
