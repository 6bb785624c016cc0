// TopFrame: one screen of `fragscope top` as lines of text, from the daemon's process list and
// the view's state (sort key, job filter, selection, an open map). A pure function of its
// inputs, so a frame is tested without a terminal; the command only fetches, reads keys and
// writes the lines. docs/live-monitoring.md, "fragscope top".
//
// Every string that came from the daemon (job names, hosts, UUIDs, its error text) is made
// terminal-safe (common/terminal_text.h) before it is placed; colour is SGR sequences only.
// Widths count code points: a job name in a wide script may take more columns than counted.
//
// Thread safety: pure functions.
#ifndef FRAGSCOPE_SINKS_LIVE_TOP_FRAME_H_
#define FRAGSCOPE_SINKS_LIVE_TOP_FRAME_H_

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sinks/live/process_api.h"

namespace fragscope::sinks::live {

enum class TopSort { kLevel, kReserved, kAllocated, kFragmentation, kRisk };

/// "level", "reserved", "allocated", "fragmentation", "risk".
std::string_view TopSortName(TopSort sort);
/// The key named `name` (TopSortName's words); nullopt for anything else.
std::optional<TopSort> ParseTopSort(std::string_view name);

struct TopView {
  TopSort sort = TopSort::kLevel;
  std::string job_filter;         // rows whose job contains it; empty: all
  bool editing_filter = false;    // the '/' prompt is open (job_filter is being typed)
  std::string selected_id;        // the highlighted row's id; empty or gone: the first row
  std::optional<ProcessRow> map;  // the process whose map is shown, if one is open
  std::string status;             // a problem to show (daemon unreachable, bad answer); "" none
  std::string source;             // where the data comes from (the URL), for the title
  std::string clock;              // the time of the data, as the caller wants it shown
  bool interactive = true;        // false (--once): no key help, no selection mark
};

struct FrameOptions {
  int width = 80;
  int height = 24;  // 0: as many lines as the rows need (--once to a pipe)
  bool color = false;
  bool utf8 = true;  // block characters for bars and sparklines; ASCII otherwise
};

/// Indices into `list.processes` of the rows shown, in order: the filter applied, sorted by
/// `view.sort` (kLevel: worst first — level, then P(OOM), then fewest steps to OOM).
std::vector<std::size_t> VisibleRows(const ProcessList& list, const TopView& view);

/// The frame: at most `height` lines (when height > 0), none wider than `width` columns
/// (colour sequences aside). Columns are dropped, least important first, when the width
/// cannot hold them all; the job column and the sparkline take the room left over.
std::vector<std::string> RenderTopFrame(const ProcessList& list, const TopView& view,
                                        const FrameOptions& options);

/// Bytes in at most 4 characters: "512B", "8.0M", "80G", "1.0T".
std::string CompactBytes(std::uint64_t bytes);

}  // namespace fragscope::sinks::live

#endif  // FRAGSCOPE_SINKS_LIVE_TOP_FRAME_H_
