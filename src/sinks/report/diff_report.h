// The reports of `fragscope diff` (issue 33 item 2): two runs side by side (RunDiff), or N
// per-rank runs with the ranks that differ (RankComparison), as text for a terminal and as
// JSON in the schema "fragscope.diff" version 1 (docs/json-schema.md). They only format what
// analysis/compare.h computed. `report --compare` embeds the JSON in its page.
//
// Thread safety: pure functions.
#ifndef FRAGSCOPE_SINKS_REPORT_DIFF_REPORT_H_
#define FRAGSCOPE_SINKS_REPORT_DIFF_REPORT_H_

#include <string>

#include "analysis/compare.h"

namespace fragscope::sinks {

inline constexpr char kDiffSchemaName[] = "fragscope.diff";
inline constexpr int kDiffSchemaVersion = 1;

/// A against B, per device pair: the figures, their changes, the first OOMs and the call sites
/// whose memory changed most. Ends with a newline.
std::string RenderDiffText(const analysis::RunDiff& diff);
/// Each rank's figures in one table, then the ranks that differ and why.
std::string RenderRanksText(const analysis::RankComparison& ranks);

/// The same as JSON documents ending with a newline; `indent` -1 gives one line.
std::string RenderDiffJson(const analysis::RunDiff& diff, int indent = 2);
std::string RenderRanksJson(const analysis::RankComparison& ranks, int indent = 2);

/// One sentence on what changed most from A to B ("B peaks 12.0% higher in reserved memory
/// (+6.0 MiB); B runs out of memory, A does not"), or that nothing changed.
std::string DiffHeadline(const analysis::DeviceDiff& device);

}  // namespace fragscope::sinks

#endif  // FRAGSCOPE_SINKS_REPORT_DIFF_REPORT_H_
