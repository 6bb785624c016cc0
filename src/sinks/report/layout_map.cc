#include "sinks/report/layout_map.h"

#include <algorithm>
#include <array>
#include <string_view>

#include <fmt/format.h>

#include "common/units.h"
#include "fragscope/event.h"

namespace fragscope::sinks {
namespace {

using analysis::LayoutBlock;
using analysis::LayoutSegment;
using model::BlockState;

// The four things a cell can show, in tie-break order: a later kind wins a tie.
enum Kind : int { kAllocated = 0, kPending = 1, kFree = 2, kStranded = 3, kNumKinds = 4 };
constexpr std::array<char, kNumKinds> kKindCell = {kAllocatedCell, kPendingCell, kFreeCell,
                                                   kStrandedCell};

Kind KindOf(const LayoutBlock& block) {
  switch (block.state) {
    case BlockState::kAllocated:
      return kAllocated;
    case BlockState::kPendingFree:
      return kPending;
    case BlockState::kFree:
      return block.stranded ? kStranded : kFree;
  }
  return kAllocated;
}

std::uint64_t CeilDiv(std::uint64_t a, std::uint64_t b) { return a / b + (a % b != 0); }

// The part of `block` inside [lo, hi), clipped; {0, 0} when disjoint.
struct Span {
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  std::uint64_t size() const { return end > begin ? end - begin : 0; }
};
Span Clip(std::uint64_t begin, std::uint64_t end, std::uint64_t lo, std::uint64_t hi) {
  Span s{std::max(begin, lo), std::min(end, hi)};
  if (s.end < s.begin) s.end = s.begin;
  return s;
}

// ANSI color of a cell symbol; empty for none.
std::string_view ColorOf(char cell) {
  switch (cell) {
    case kAllocatedCell:
      return "\x1b[32m";  // green: in use
    case kPendingCell:
      return "\x1b[33m";  // yellow: on its way back
    case kFreeCell:
      return "\x1b[2m";  // dim: cached, usable
    case kStrandedCell:
      return "\x1b[1;31m";  // bold red: the waste to look at
    default:
      return "";
  }
}

std::string Colorize(std::string_view cells) {
  std::string out;
  std::size_t i = 0;
  while (i < cells.size()) {
    std::size_t j = i;
    while (j < cells.size() && cells[j] == cells[i]) ++j;
    const std::string_view color = ColorOf(cells[i]);
    if (!color.empty()) out += color;
    out.append(cells.substr(i, j - i));
    if (!color.empty()) out += "\x1b[0m";
    i = j;
  }
  return out;
}

std::uint64_t AllocatedBytes(const LayoutSegment& segment) {
  std::uint64_t bytes = 0;
  for (const LayoutBlock& b : segment.blocks) {
    if (b.state == BlockState::kAllocated) bytes += b.size;
  }
  return bytes;
}

std::string PercentOf(std::uint64_t part, std::uint64_t whole) {
  if (whole == 0) return "-";
  return fmt::format("{:.0f}%", 100.0 * static_cast<double>(part) / static_cast<double>(whole));
}

}  // namespace

std::string DrawSegmentCells(const LayoutSegment& segment, std::uint64_t bytes_per_cell,
                             int cells) {
  if (cells <= 0 || bytes_per_cell == 0) return "";
  const auto n = static_cast<std::size_t>(cells);
  const std::uint64_t seg_begin = segment.addr;
  const std::uint64_t seg_end = segment.addr + segment.size;
  auto cell_begin = [&](std::size_t c) { return seg_begin + c * bytes_per_cell; };
  auto cell_end = [&](std::size_t c) {
    return std::min(seg_end, seg_begin + (c + 1) * bytes_per_cell);
  };
  // Bytes of each kind per cell. O(blocks + cells): a block adds to the cells it overlaps.
  std::vector<std::array<std::uint64_t, kNumKinds>> bytes(n, {0, 0, 0, 0});
  for (const LayoutBlock& block : segment.blocks) {
    const Span span = Clip(block.addr, block.addr + block.size, seg_begin, seg_end);
    if (span.size() == 0) continue;
    const std::size_t first = (span.begin - seg_begin) / bytes_per_cell;
    const std::size_t last = std::min(n - 1, (span.end - 1 - seg_begin) / bytes_per_cell);
    for (std::size_t c = first; c <= last && c < n; ++c) {
      bytes[c][KindOf(block)] += Clip(span.begin, span.end, cell_begin(c), cell_end(c)).size();
    }
  }
  // Majority per cell; a later kind wins a tie.
  std::string out(n, kUnknownCell);
  for (std::size_t c = 0; c < n; ++c) {
    std::uint64_t best = 0;
    for (int k = 0; k < kNumKinds; ++k) {
      if (bytes[c][k] > 0 && bytes[c][k] >= best) {
        best = bytes[c][k];
        out[c] = kKindCell[k];
      }
    }
  }
  // A free gap at least one cell long must show: give it the cell where it has most bytes.
  for (const LayoutBlock& block : segment.blocks) {
    const Kind kind = KindOf(block);
    if (kind != kFree && kind != kStranded) continue;
    const Span span = Clip(block.addr, block.addr + block.size, seg_begin, seg_end);
    if (span.size() < bytes_per_cell) continue;
    const std::size_t first = (span.begin - seg_begin) / bytes_per_cell;
    const std::size_t last = std::min(n - 1, (span.end - 1 - seg_begin) / bytes_per_cell);
    if (first >= n) continue;
    bool shown = false;
    std::size_t best_cell = first;
    std::uint64_t best_bytes = 0;
    for (std::size_t c = first; c <= last; ++c) {
      if (out[c] == kKindCell[kind]) shown = true;
      const std::uint64_t mine = Clip(span.begin, span.end, cell_begin(c), cell_end(c)).size();
      if (mine > best_bytes) {
        best_bytes = mine;
        best_cell = c;
      }
    }
    if (!shown) out[best_cell] = kKindCell[kind];
  }
  return out;
}

std::string RenderLayoutMap(const std::vector<LayoutSegment>& layout,
                            const LayoutMapOptions& options) {
  if (layout.empty()) return "  (no segments: nothing is reserved at the end of the trace)\n";
  const int width = std::max(1, options.width_cells);

  // Largest first; ties by address, so the order is deterministic.
  std::vector<const LayoutSegment*> order;
  order.reserve(layout.size());
  for (const LayoutSegment& s : layout) order.push_back(&s);
  std::stable_sort(order.begin(), order.end(), [](const LayoutSegment* a, const LayoutSegment* b) {
    if (a->size != b->size) return a->size > b->size;
    return a->addr < b->addr;
  });
  const std::size_t shown = std::min(order.size(), options.max_rows);

  const std::uint64_t largest = std::max<std::uint64_t>(1, order.front()->size);
  const std::uint64_t shared_bytes_per_cell = CeilDiv(largest, static_cast<std::uint64_t>(width));

  std::string out;
  out += fmt::format("  {} allocated  {} pending free  {} free  {} stranded (free, < threshold)\n",
                     kAllocatedCell, kPendingCell, kFreeCell, kStrandedCell);
  if (options.scale == MapScale::kShared) {
    out += fmt::format(
        "  one row per segment, largest first; 1 cell = {} (all rows share this scale)\n",
        FormatBytes(shared_bytes_per_cell));
  } else {
    out += fmt::format(
        "  one row per segment, largest first; each row scaled to its segment (1 cell = 1/{})\n",
        width);
  }
  out += "  a cell shows the state holding most of its bytes; a free gap >= 1 cell always shows\n";

  // Row text first, then align the columns after the bar.
  struct Row {
    std::string bar, addr, size, pool, used;
  };
  std::vector<Row> rows;
  rows.reserve(shown);
  std::size_t addr_w = 0, size_w = 0, pool_w = 0, used_w = 0;
  for (std::size_t i = 0; i < shown; ++i) {
    const LayoutSegment& s = *order[i];
    std::uint64_t bytes_per_cell = shared_bytes_per_cell;
    if (options.scale == MapScale::kPerSegment) {
      bytes_per_cell =
          CeilDiv(std::max<std::uint64_t>(1, s.size), static_cast<std::uint64_t>(width));
    }
    const auto cells = static_cast<int>(std::clamp<std::uint64_t>(
        CeilDiv(s.size, bytes_per_cell), 1, static_cast<std::uint64_t>(width)));
    std::string cells_text = DrawSegmentCells(s, bytes_per_cell, cells);
    std::string bar = "|" + (options.color ? Colorize(cells_text) : cells_text) + "|";
    bar.append(static_cast<std::size_t>(width - cells), ' ');
    std::string pool(PoolName(s.pool));
    if (s.expandable) pool += " expandable";
    if (s.stream != 0) pool += fmt::format(" stream {}", s.stream);
    Row row{std::move(bar), FormatAddress(s.addr), FormatBytes(s.size), std::move(pool),
            PercentOf(AllocatedBytes(s), s.size) + " allocated"};
    addr_w = std::max(addr_w, row.addr.size());
    size_w = std::max(size_w, row.size.size());
    pool_w = std::max(pool_w, row.pool.size());
    used_w = std::max(used_w, row.used.size());
    rows.push_back(std::move(row));
  }
  for (const Row& r : rows) {
    std::string line = fmt::format("  {}  {:<{}}  {:>{}}  {:<{}}  {:>{}}", r.bar, r.addr, addr_w,
                                   r.size, size_w, r.pool, pool_w, r.used, used_w);
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line;
    out += '\n';
  }
  if (shown < order.size()) {
    std::uint64_t hidden_bytes = 0, hidden_allocated = 0;
    for (std::size_t i = shown; i < order.size(); ++i) {
      hidden_bytes += order[i]->size;
      hidden_allocated += AllocatedBytes(*order[i]);
    }
    out += fmt::format("  ... {} more segments ({}, {} allocated) not drawn; --json lists all\n",
                       order.size() - shown, FormatBytes(hidden_bytes),
                       PercentOf(hidden_allocated, hidden_bytes));
  }
  return out;
}

}  // namespace fragscope::sinks
