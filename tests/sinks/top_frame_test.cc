// `fragscope top`'s frames (src/sinks/live/top_frame.h): order, columns at 80 and wider, the
// selection, the filter, the map, colour and no colour, and hostile strings from the daemon.
#include "sinks/live/top_frame.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace fragscope::sinks::live {
namespace {

ProcessRow Row(std::string job, std::int32_t rank, RiskLevel level, std::optional<double> risk,
               std::uint64_t reserved_gib, double frag) {
  ProcessRow r;
  r.job = std::move(job);
  r.rank = rank;
  r.pid = 1000 + static_cast<std::uint32_t>(rank);
  r.id = ProcessId(r.pid, "GPU-x");
  r.host = "node-7";
  r.device_index = rank;
  r.step = 100;
  r.reserved_bytes = reserved_gib << 30;
  r.allocated_bytes = (reserved_gib << 30) / 2;
  r.fragmentation_ratio = frag;
  r.largest_free_block_bytes = 2ull << 20;
  r.largest_request_bytes = 3ull << 20;
  r.oom_risk = risk;
  r.level = level;
  if (level >= RiskLevel::kWarning) r.steps_to_oom = 40;
  // 8 points: the narrowest trend column shows them all, from empty to full.
  for (int i = 0; i < 8; ++i) {
    r.history.push_back(
        {i, r.reserved_bytes, r.reserved_bytes / 7 * static_cast<std::uint64_t>(i)});
  }
  return r;
}

ProcessList Two() {
  ProcessList list;
  list.host = "node-7";
  list.processes.push_back(Row("bert", 0, RiskLevel::kOk, 0.001, 20, 0.6));
  list.processes.push_back(Row("llama", 1, RiskLevel::kWarning, 0.45, 70, 0.1));
  return list;
}

// Visible columns of a line: code points, colour sequences skipped.
std::size_t Width(const std::string& line) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < line.size(); ++i) {
    if (line[i] == '\x1b') {
      while (i < line.size() && line[i] != 'm') ++i;
      continue;
    }
    n += (static_cast<unsigned char>(line[i]) & 0xc0) != 0x80;
  }
  return n;
}

std::string Joined(const std::vector<std::string>& lines) {
  std::string all;
  for (const std::string& l : lines) all += l + "\n";
  return all;
}

std::size_t LineWith(const std::vector<std::string>& lines, const std::string& text) {
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].find(text) != std::string::npos) return i;
  }
  return lines.size();
}

TEST(TopFrameTest, WorstFirstAtEightyByTwentyFour) {
  const ProcessList list = Two();
  TopView view;
  view.source = "http://127.0.0.1:9464";
  const std::vector<std::string> lines = RenderTopFrame(list, view, {80, 24, false, true});
  ASSERT_EQ(lines.size(), 24u);
  for (const std::string& l : lines) EXPECT_LE(Width(l), 80u) << l;
  const std::string all = Joined(lines);
  EXPECT_EQ(all.find('\x1b'), std::string::npos);  // no colour asked
  // Every column of the issue fits at 80 columns; HOST, GPU and STEP need more room.
  for (const char* h : {"JOB", "RANK", "PID", "RESV", "ALLOC", "FRAG", "FREE/REQ", "P100", "LEVEL",
                        "STEPS", "TREND"}) {
    EXPECT_NE(lines[2].find(h), std::string::npos) << h;
  }
  EXPECT_EQ(lines[2].find("HOST"), std::string::npos);
  // The warning row first, selected (the mark), with its numbers.
  const std::size_t llama = LineWith(lines, "llama"), bert = LineWith(lines, "bert");
  ASSERT_LT(llama, bert);
  EXPECT_EQ(lines[llama].rfind("> ", 0), 0u);
  EXPECT_NE(lines[llama].find("70G"), std::string::npos);
  EXPECT_NE(lines[llama].find("2.0M/3.0M!"), std::string::npos);  // the request does not fit
  EXPECT_NE(lines[llama].find("45%"), std::string::npos);
  EXPECT_NE(lines[llama].find("warning"), std::string::npos);
  EXPECT_NE(lines[bert].find("<1%"), std::string::npos);
  // The sparkline climbs from the lowest block to the full one.
  EXPECT_NE(lines[llama].find("\u2581\u2582\u2583\u2584\u2585\u2586\u2587\u2588"),
            std::string::npos)
      << lines[llama];
  EXPECT_NE(lines.back().find("q quit"), std::string::npos);
}

TEST(TopFrameTest, WiderAddsColumnsNarrowerDropsThem) {
  const ProcessList list = Two();
  TopView view;
  const auto wide = RenderTopFrame(list, view, {140, 10, false, true});
  for (const char* h : {"HOST", "GPU", "STEP"}) EXPECT_NE(wide[2].find(h), std::string::npos) << h;
  for (const std::string& l : wide) EXPECT_LE(Width(l), 140u);
  const auto narrow = RenderTopFrame(list, view, {50, 10, false, true});
  for (const std::string& l : narrow) EXPECT_LE(Width(l), 50u) << l;
  for (const char* h : {"JOB", "RESV", "P100", "LEVEL"}) {
    EXPECT_NE(narrow[2].find(h), std::string::npos) << h;
  }
  EXPECT_EQ(narrow[2].find("TREND"), std::string::npos);
  // Absurdly small still draws within bounds.
  for (const std::string& l : RenderTopFrame(list, view, {5, 3, true, true})) {
    EXPECT_LE(Width(l), 5u) << l;
  }
  EXPECT_EQ(RenderTopFrame(list, view, {5, 3, true, true}).size(), 3u);
}

TEST(TopFrameTest, SortKeysAndTheJobFilter) {
  const ProcessList list = Two();
  TopView view;
  view.sort = TopSort::kFragmentation;
  auto rows = VisibleRows(list, view);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(list.processes[rows[0]].job, "bert");
  view.sort = TopSort::kReserved;
  EXPECT_EQ(list.processes[VisibleRows(list, view)[0]].job, "llama");
  view.sort = TopSort::kRisk;
  EXPECT_EQ(list.processes[VisibleRows(list, view)[0]].job, "llama");
  for (TopSort s : {TopSort::kLevel, TopSort::kReserved, TopSort::kAllocated,
                    TopSort::kFragmentation, TopSort::kRisk}) {
    EXPECT_EQ(ParseTopSort(TopSortName(s)), s);
  }
  EXPECT_FALSE(ParseTopSort("worst"));
  view.job_filter = "ber";
  const auto lines = RenderTopFrame(list, view, {80, 24, false, true});
  EXPECT_EQ(LineWith(lines, "llama"), lines.size());
  EXPECT_LT(LineWith(lines, "bert"), lines.size());
  EXPECT_NE(lines[0].find("(1 shown)"), std::string::npos);
  EXPECT_NE(lines[0].find("job: ber"), std::string::npos);
  view.job_filter = "gpt";
  EXPECT_LT(LineWith(RenderTopFrame(list, view, {80, 24, false, true}),
                     "no process of a job matching \"gpt\""),
            24u);
  EXPECT_LT(LineWith(RenderTopFrame(ProcessList{}, TopView{}, {80, 24, false, true}),
                     "no training process reports"),
            24u);
}

TEST(TopFrameTest, ManyRowsKeepTheSelectionOnScreen) {
  ProcessList list;
  for (int i = 0; i < 100; ++i)
    list.processes.push_back(Row("job", i, RiskLevel::kOk, 0.0, 10, 0.1));
  TopView view;
  view.sort = TopSort::kReserved;  // all equal: by id
  const auto rows = VisibleRows(list, view);
  view.selected_id = list.processes[rows[60]].id;
  const auto lines = RenderTopFrame(list, view, {80, 24, false, true});
  ASSERT_EQ(lines.size(), 24u);
  const std::size_t mark = LineWith(lines, "> ");
  ASSERT_LT(mark, lines.size());
  EXPECT_NE(lines[mark].find(std::to_string(list.processes[rows[60]].pid)), std::string::npos);
  EXPECT_LT(LineWith(lines, "more (filter with /"), lines.size());
  // --once (no height): every row, no mark, no key help.
  view.interactive = false;
  const auto all = RenderTopFrame(list, view, {80, 0, false, true});
  EXPECT_EQ(all.size(), 3u + 100u);
  EXPECT_EQ(LineWith(all, "> "), all.size());
  EXPECT_EQ(LineWith(all, "q quit"), all.size());
}

TEST(TopFrameTest, ColourAndAscii) {
  const ProcessList list = Two();
  TopView view;
  view.selected_id = list.processes[0].id;  // bert: the warning row is not reversed
  const auto colored = RenderTopFrame(list, view, {80, 24, true, true});
  const std::string all = Joined(colored);
  EXPECT_NE(all.find("\x1b[31mwarning"), std::string::npos);
  EXPECT_NE(all.find("\x1b[7m> "), std::string::npos);  // the selected row, reversed
  EXPECT_NE(all.find("\x1b[1;7mfragscope top"), std::string::npos);
  const auto ascii = RenderTopFrame(list, view, {80, 24, false, false});
  for (const std::string& l : ascii) {
    for (char c : l) EXPECT_LT(static_cast<unsigned char>(c), 0x80) << l;
  }
}

TEST(TopFrameTest, TheMapOfOneProcess) {
  ProcessList list = Two();
  TopView view;
  ProcessRow m = list.processes[1];
  m.cached_free_bytes = 35ull << 30;
  m.free_blocks = {{1ull << 20, 3, 3ull << 20}, {2ull << 20, 1, 2ull << 20}};
  view.map = m;
  const auto lines = RenderTopFrame(list, view, {80, 24, false, true});
  ASSERT_EQ(lines.size(), 24u);
  for (const std::string& l : lines) EXPECT_LE(Width(l), 80u) << l;
  EXPECT_LT(LineWith(lines, "process 1001 - job llama - rank 1"), 24u);
  EXPECT_LT(LineWith(lines, "level warning  P(OOM within 100 steps) 45%"), 24u);
  EXPECT_LT(LineWith(lines, "reserved ["), 24u);
  EXPECT_LT(LineWith(lines, "free blocks by size"), 24u);
  const std::size_t bucket = LineWith(lines, "1.0M-2.0M");
  ASSERT_LT(bucket, 24u);
  EXPECT_NE(lines[bucket].find("3 blocks"), std::string::npos);
  EXPECT_LT(LineWith(lines, "Enter/Esc back"), 24u);
}

TEST(TopFrameTest, StringsFromTheDaemonCannotDriveTheTerminal) {
  ProcessList list = Two();
  list.host = "evil\x1b]0;pwned\x07";
  list.processes[0].job = "job\x1b[2J\nrow";
  TopView view;
  view.status = "daemon said \x1b[31m";
  for (bool color : {false, true}) {
    const std::string all = Joined(RenderTopFrame(list, view, {200, 24, color, true}));
    EXPECT_EQ(all.find("\x1b]"), std::string::npos);
    EXPECT_EQ(all.find("\x1b[2J"), std::string::npos);
    EXPECT_EQ(all.find('\x07'), std::string::npos);
    EXPECT_NE(all.find("job\\x1b[2J\\x0arow"), std::string::npos);
  }
}

TEST(TopFrameTest, CompactBytesStaysShort) {
  EXPECT_EQ(CompactBytes(0), "0B");
  EXPECT_EQ(CompactBytes(999), "999B");
  EXPECT_EQ(CompactBytes(1000), "1.0K");
  EXPECT_EQ(CompactBytes(8ull << 20), "8.0M");
  EXPECT_EQ(CompactBytes(80ull << 30), "80G");
  EXPECT_EQ(CompactBytes(1023ull << 30), "1.0T");
  for (std::uint64_t v = 1; v < (1ull << 62); v = v * 3 + 7) {
    EXPECT_LE(CompactBytes(v).size(), 4u) << v;
  }
}

}  // namespace
}  // namespace fragscope::sinks::live
