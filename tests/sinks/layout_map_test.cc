#include "sinks/report/layout_map.h"

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/units.h"
#include "sinks/sample_results.h"

namespace fragscope::sinks {
namespace {

using testing::MakeSegment;

constexpr std::uint64_t kCell = 1024;  // bytes per cell in the DrawSegmentCells tests
constexpr std::uint64_t kBase = 0x10000000;

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The segment rows of a map: lines holding a bar.
std::vector<std::string> Rows(const std::string& map) {
  std::vector<std::string> rows;
  for (const std::string& line : Lines(map)) {
    if (line.find('|') != std::string::npos) rows.push_back(line);
  }
  return rows;
}

// The cells between the first two '|' of a row.
std::string Bar(const std::string& row) {
  const auto open = row.find('|');
  const auto close = row.find('|', open + 1);
  return row.substr(open + 1, close - open - 1);
}

TEST(DrawSegmentCellsTest, AllocatedSegmentIsAllHashes) {
  const auto s = MakeSegment(kBase, {{64 * kCell, '#'}});
  EXPECT_EQ(DrawSegmentCells(s, kCell, 64), std::string(64, '#'));
}

TEST(DrawSegmentCellsTest, EachStateHasItsSymbol) {
  const auto s =
      MakeSegment(kBase, {{2 * kCell, '#'}, {2 * kCell, '+'}, {2 * kCell, '.'}, {2 * kCell, '!'}});
  EXPECT_EQ(DrawSegmentCells(s, kCell, 8), "##++..!!");
}

TEST(DrawSegmentCellsTest, CellShowsTheStateHoldingMostBytes) {
  // Cell 1 holds 700 allocated and 324 free bytes; cell 2 holds 1024 free.
  const auto s = MakeSegment(kBase, {{kCell + 700, '#'}, {kCell + 324, '.'}, {kCell, '#'}});
  EXPECT_EQ(DrawSegmentCells(s, kCell, 4), "##.#");
}

TEST(DrawSegmentCellsTest, TieGoesToTheRarerState) {
  // Every cell is half allocated, half free or stranded: the gap wins the tie.
  const auto s =
      MakeSegment(kBase, {{512, '#'}, {512, '.'}, {512, '#'}, {512, '!'}, {512, '+'}, {512, '#'}});
  EXPECT_EQ(DrawSegmentCells(s, kCell, 3), ".!+");
}

TEST(DrawSegmentCellsTest, StrandedGapStraddlingTwoCellsIsDrawn) {
  // A one-cell stranded gap starting 300 bytes into cell 10: drawn in cell 10 (724 bytes of it).
  const auto s =
      MakeSegment(kBase, {{10 * kCell + 300, '#'}, {kCell, '!'}, {53 * kCell - 300, '#'}});
  const std::string cells = DrawSegmentCells(s, kCell, 64);
  EXPECT_EQ(std::count(cells.begin(), cells.end(), '!'), 1);
  EXPECT_EQ(cells[10], '!');
  EXPECT_EQ(cells[11], '#');
}

TEST(DrawSegmentCellsTest, EveryGapAtLeastOneCellLongShows) {
  // Gaps of exactly one cell at every offset within a cell: each must show.
  for (std::uint64_t offset = 0; offset < kCell; offset += 64) {
    const auto s = MakeSegment(kBase, {{3 * kCell + offset, '#'},
                                       {kCell, '!'},
                                       {3 * kCell, '#'},
                                       {kCell, '.'},
                                       {kCell * 2 - offset, '#'}});
    const std::string cells = DrawSegmentCells(s, kCell, 10);
    // A gap split evenly between two cells ties in both and shows twice.
    EXPECT_GE(std::count(cells.begin(), cells.end(), '!'), 1)
        << "offset " << offset << ": " << cells;
    EXPECT_GE(std::count(cells.begin(), cells.end(), '.'), 1)
        << "offset " << offset << ": " << cells;
  }
}

TEST(DrawSegmentCellsTest, GapSmallerThanACellMayVanish) {
  const auto s = MakeSegment(kBase, {{kCell, '#'}, {100, '!'}, {2 * kCell - 100, '#'}});
  EXPECT_EQ(DrawSegmentCells(s, kCell, 3), "###");
}

TEST(DrawSegmentCellsTest, PartialLastCellUsesTheBytesItHas) {
  // 2.25 cells: the last cell covers 256 bytes, all free.
  const auto s = MakeSegment(kBase, {{2 * kCell, '#'}, {256, '.'}});
  EXPECT_EQ(DrawSegmentCells(s, kCell, 3), "##.");
}

TEST(DrawSegmentCellsTest, ManySmallBlocksInOneCell) {
  // 16 blocks of 64 bytes in one cell, 9 allocated and 7 free: allocated wins.
  analysis::LayoutSegment s = MakeSegment(kBase, {});
  std::uint64_t at = kBase;
  for (int i = 0; i < 16; ++i) {
    analysis::LayoutBlock b;
    b.addr = at;
    b.size = 64;
    b.state = i % 2 == 0 || i == 15 ? model::BlockState::kAllocated : model::BlockState::kFree;
    s.blocks.push_back(b);
    at += 64;
  }
  s.size = at - kBase;
  EXPECT_EQ(DrawSegmentCells(s, kCell, 1), "#");
}

TEST(RenderLayoutMapTest, EmptyLayoutSaysSo) {
  EXPECT_NE(RenderLayoutMap({}, {}).find("no segments"), std::string::npos);
}

TEST(RenderLayoutMapTest, LegendNamesEverySymbol) {
  const std::string map = RenderLayoutMap({MakeSegment(kBase, {{kMiB, '#'}})}, {});
  EXPECT_NE(map.find("# allocated"), std::string::npos);
  EXPECT_NE(map.find("+ pending free"), std::string::npos);
  EXPECT_NE(map.find(". free"), std::string::npos);
  EXPECT_NE(map.find("! stranded"), std::string::npos);
  EXPECT_NE(map.find("1 cell = 16.0 KiB"), std::string::npos) << map;
}

TEST(RenderLayoutMapTest, SharedScaleMakesRowLengthsProportional) {
  const std::vector<analysis::LayoutSegment> layout = {
      MakeSegment(kBase, {{16 * kMiB, '#'}}),
      MakeSegment(kBase + 64 * kMiB, {{32 * kMiB, '.'}, {32 * kMiB, '#'}}),
      MakeSegment(kBase + 256 * kMiB, {{100, '#'}}, Pool::kSmall)};
  const auto rows = Rows(RenderLayoutMap(layout, {}));
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(Bar(rows[0]), std::string(32, '.') + std::string(32, '#'));  // largest first
  EXPECT_EQ(Bar(rows[1]), std::string(16, '#'));                         // a quarter as long
  EXPECT_EQ(Bar(rows[2]), "#");  // smaller than a cell: still one cell
  // Columns after the bars line up.
  EXPECT_EQ(rows[0].find("0x"), rows[1].find("0x"));
  EXPECT_EQ(rows[1].find("0x"), rows[2].find("0x"));
}

TEST(RenderLayoutMapTest, PerSegmentScaleFillsEveryRow) {
  LayoutMapOptions options;
  options.scale = MapScale::kPerSegment;
  options.width_cells = 32;
  const std::vector<analysis::LayoutSegment> layout = {
      MakeSegment(kBase, {{16 * kMiB, '#'}, {16 * kMiB, '.'}}),
      MakeSegment(kBase + 64 * kMiB, {{kMiB, '#'}, {kMiB, '!'}}, Pool::kSmall)};
  const std::string map = RenderLayoutMap(layout, options);
  const auto rows = Rows(map);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(Bar(rows[0]), std::string(16, '#') + std::string(16, '.'));
  EXPECT_EQ(Bar(rows[1]), std::string(16, '#') + std::string(16, '!'));
  EXPECT_NE(map.find("each row scaled to its segment"), std::string::npos);
}

TEST(RenderLayoutMapTest, RowEndsWithAddressSizePoolAndShareAllocated) {
  const auto rows =
      Rows(RenderLayoutMap({MakeSegment(0x7f0002000000, {{15 * kMiB, '#'}, {5 * kMiB, '.'}})}, {}));
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_NE(rows[0].find("0x7f0002000000  20.0 MiB  large  75% allocated"), std::string::npos)
      << rows[0];
}

TEST(RenderLayoutMapTest, RowsAreCappedWithASummaryLine) {
  std::vector<analysis::LayoutSegment> layout;
  for (std::uint64_t i = 0; i < 40; ++i) {
    layout.push_back(MakeSegment(kBase + i * 4 * kMiB, {{(i + 1) * 64 * kKiB, '#'}}));
  }
  LayoutMapOptions options;
  options.max_rows = 32;
  const std::string map = RenderLayoutMap(layout, options);
  const auto rows = Rows(map);
  ASSERT_EQ(rows.size(), 32u);
  // The 32 largest are drawn, largest first: the first row is segment 39.
  EXPECT_NE(rows[0].find(FormatAddress(kBase + 39 * 4 * kMiB)), std::string::npos);
  EXPECT_NE(rows[31].find(FormatAddress(kBase + 8 * 4 * kMiB)), std::string::npos);
  // Hidden: segments 0..7, (1+..+8) * 64 KiB = 2.25 MiB.
  EXPECT_NE(map.find("... 8 more segments (2.2 MiB, 100% allocated)"), std::string::npos) << map;
}

TEST(RenderLayoutMapTest, EqualSizesKeepAddressOrder) {
  const auto rows = Rows(RenderLayoutMap(
      {MakeSegment(kBase + 2 * kMiB, {{kMiB, '#'}}), MakeSegment(kBase, {{kMiB, '.'}})}, {}));
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_NE(rows[0].find(FormatAddress(kBase)), std::string::npos);
}

TEST(RenderLayoutMapTest, ColorOnlyWhenAsked) {
  const std::vector<analysis::LayoutSegment> layout = {
      MakeSegment(kBase, {{kMiB, '#'}, {kMiB, '!'}})};
  EXPECT_EQ(RenderLayoutMap(layout, {}).find('\x1b'), std::string::npos);
  LayoutMapOptions options;
  options.color = true;
  const std::string colored = RenderLayoutMap(layout, options);
  EXPECT_NE(colored.find("\x1b[1;31m!!"), std::string::npos);
}

}  // namespace
}  // namespace fragscope::sinks
