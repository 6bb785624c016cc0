// The human-readable report of `fragscope analyze`: per device, the peaks and worst moments
// with when they happened, the final state per pool, the timeline table and the memory map.
// It only formats an AnalysisResult; every number it prints is computed by the analysis stage
// (docs/metrics.md defines them).
//
// Thread safety: pure functions.
#ifndef FRAGSCOPE_SINKS_REPORT_TEXT_REPORT_H_
#define FRAGSCOPE_SINKS_REPORT_TEXT_REPORT_H_

#include <cstddef>
#include <string>
#include <vector>

#include "analysis/analysis_result.h"
#include "sinks/report/layout_map.h"

namespace fragscope::sinks {

struct TextOptions {
  /// ANSI colors (headings, the map's cells). Off unless the caller decides stdout is a TTY.
  bool color = false;
  /// Draw the memory map after the timeline.
  bool show_map = true;
  /// A longer timeline shows evenly spaced rows plus the first, the last and every row that
  /// holds an extreme, and says how many rows were left out.
  std::size_t max_timeline_rows = 60;
  LayoutMapOptions map;
};

/// The whole report, ending with a newline.
std::string RenderText(const analysis::AnalysisResult& result, const TextOptions& options);

/// Which timeline rows the text report shows (indexes into `timeline`, ascending): all of
/// them when there are at most `max_rows`; otherwise the first, the last, the rows whose
/// event range holds one of `extreme_events`, and evenly spaced rows up to about `max_rows`.
/// Exposed for tests.
std::vector<std::size_t> SelectTimelineRows(const std::vector<analysis::TimelineSample>& timeline,
                                            const std::vector<std::uint64_t>& extreme_events,
                                            std::size_t max_rows);

}  // namespace fragscope::sinks

#endif  // FRAGSCOPE_SINKS_REPORT_TEXT_REPORT_H_
