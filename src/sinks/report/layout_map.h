// The memory map of `fragscope analyze`: a compact text picture of one device's final layout.
//
// One row per segment, largest first (ties: lower address first). Largest first, not address
// order, because segment addresses say nothing about adjacency that matters to the allocator
// (a block never spans two segments), and with the row cap the rows shown then hold the most
// bytes. Every row's bar is drawn cell by cell:
//
//   '#' allocated   '+' freed by the program, pending (waits on another stream)
//   '.' free (cached)   '!' stranded (free, but smaller than its pool's stranding threshold)
//
// Cell rule: a cell shows the state that holds most of the bytes it covers; ties go to the
// rarer, more telling state (stranded > free > pending > allocated). Then every free block
// (free or stranded) at least one cell long is guaranteed a cell of its own symbol: if it won
// no cell by majority (it straddles two cells without a majority in either), the cell where
// it has most bytes is drawn with its symbol. So a gap >= one cell never vanishes; a gap
// smaller than a cell may.
//
// Scale: with MapScale::kShared (the default) every row uses the same bytes-per-cell, chosen
// so that the largest segment fills the full width; row lengths compare segment sizes and a
// segment smaller than a cell still gets one cell. With MapScale::kPerSegment each row is
// scaled to its own segment (a cell is 1/width of it); the size column says how big it is.
//
// Thread safety: pure functions.
#ifndef FRAGSCOPE_SINKS_REPORT_LAYOUT_MAP_H_
#define FRAGSCOPE_SINKS_REPORT_LAYOUT_MAP_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "analysis/analysis_result.h"

namespace fragscope::sinks {

inline constexpr char kAllocatedCell = '#';
inline constexpr char kPendingCell = '+';
inline constexpr char kFreeCell = '.';
inline constexpr char kStrandedCell = '!';
/// Bytes of a cell not covered by any block (only in malformed layouts).
inline constexpr char kUnknownCell = ' ';

enum class MapScale { kShared, kPerSegment };

struct LayoutMapOptions {
  int width_cells = 64;       // cells of the longest row; >= 1
  std::size_t max_rows = 32;  // segments drawn; the rest are summarized on one line
  MapScale scale = MapScale::kShared;
  bool color = false;  // ANSI colors for the cells
};

/// The `cells` characters of one segment's bar, `bytes_per_cell` bytes per cell, drawn by the
/// rule in the file comment. Bytes past the segment's end are not drawn (the last cell may be
/// partial). REQUIRES: bytes_per_cell > 0, cells >= 0.
std::string DrawSegmentCells(const analysis::LayoutSegment& segment, std::uint64_t bytes_per_cell,
                             int cells);

/// The map of one device: the legend and scale lines, then one row per segment (capped at
/// options.max_rows, with a "... N more segments" line). Each row is the bar between '|',
/// then the segment's address, size, pool and the share of it allocated. A layout without
/// segments renders as a single line saying so. Every line ends with '\n'; the caller adds
/// the title.
std::string RenderLayoutMap(const std::vector<analysis::LayoutSegment>& layout,
                            const LayoutMapOptions& options);

}  // namespace fragscope::sinks

#endif  // FRAGSCOPE_SINKS_REPORT_LAYOUT_MAP_H_
