#include "sinks/report/text_report.h"

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/units.h"
#include "sinks/sample_results.h"

namespace fragscope::sinks {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The line that starts (after indentation) with `prefix`, or "".
std::string LineStartingWith(const std::string& text, const std::string& prefix) {
  for (const std::string& line : Lines(text)) {
    const auto first = line.find_first_not_of(' ');
    if (first != std::string::npos && line.compare(first, prefix.size(), prefix) == 0) {
      return line;
    }
  }
  return "";
}

TEST(RenderTextTest, HeaderSaysWhatWasRead) {
  const std::string text = RenderText(testing::MakeAllocatorResult(), {});
  EXPECT_THAT(text, HasSubstr("fragscope analyze: train.jsonl.gz\n"));
  EXPECT_THAT(text, HasSubstr("allocator trace, 40 events, 3 steps, 1 device; timeline: one "
                              "row per step"));
  EXPECT_THAT(text, HasSubstr("labels: model=toy"));
  EXPECT_THAT(text, HasSubstr("stranding threshold: the p50 of recent request sizes"));
  EXPECT_THAT(text, HasSubstr("Device 0: Fake GPU, capacity 1.00 GiB"));
  EXPECT_THAT(text, HasSubstr("40 events: 18 allocs, 15 frees, 0 OOMs"));
}

TEST(RenderTextTest, ExtremesSayWhen) {
  const std::string text = RenderText(testing::MakeAllocatorResult(), {});
  const std::string peak = LineStartingWith(text, "peak reserved");
  EXPECT_THAT(peak, HasSubstr("42.0 MiB"));
  EXPECT_THAT(peak, HasSubstr("event 12, step 1, t=2.500 s"));
  EXPECT_THAT(LineStartingWith(text, "worst fragmentation ratio"),
              HasSubstr("47.6%  event 30, step 2 (20.0 MiB cached free of 42.0 MiB reserved), "
                        "over moments with at least 21.0 MiB reserved, half the peak"));
  EXPECT_THAT(LineStartingWith(text, "min largest free block"),
              HasSubstr("event 3, setup (before step markers)"));
}

TEST(RenderTextTest, EpochTimesAreShownAsUtc) {
  auto r = testing::MakeAllocatorResult();
  r.devices[0].peak_reserved.when.time_us = 1708187029490123;
  EXPECT_THAT(LineStartingWith(RenderText(r, {}), "peak reserved"),
              HasSubstr("event 12, step 1, 2024-02-17 16:23:49.490 UTC"));
}

TEST(RenderTextTest, ShortRelativeTimesInMilliseconds) {
  auto r = testing::MakeAllocatorResult();
  r.devices[0].peak_reserved.when.time_us = 1500;
  EXPECT_THAT(LineStartingWith(RenderText(r, {}), "peak reserved"), HasSubstr("t=1.500 ms"));
}

TEST(RenderTextTest, TopSizesShowExactBytes) {
  auto r = testing::MakeRequestResult();
  r.devices[0].requests.top_sizes = {{3000, 2}, {3001, 1}};
  const std::string text = RenderText(r, {});
  EXPECT_THAT(text, HasSubstr("2.9 KiB  3,000      2"));
  EXPECT_THAT(text, HasSubstr("2.9 KiB  3,001      1"));
}

TEST(RenderTextTest, UnseenExtremeIsADash) {
  auto r = testing::MakeAllocatorResult();
  r.devices[0].min_max_allocatable.seen = false;
  EXPECT_THAT(LineStartingWith(RenderText(r, {}), "min max allocatable"),
              HasSubstr("never (no event with reserved memory)"));
}

TEST(RenderTextTest, FinalStateHasEveryMetricPerPool) {
  const std::string text = RenderText(testing::MakeAllocatorResult(), {});
  for (const char* name :
       {"reserved", "allocated", "active (allocated + pending free)", "requested",
        "cached free (reserved - allocated)", "fragmentation ratio", "largest free block",
        "external fragmentation", "internal waste", "stranded (free blocks < threshold)",
        "stranding threshold", "releasable", "segments", "blocks"}) {
    EXPECT_NE(LineStartingWith(text, name), "") << name;
  }
  const std::string reserved = LineStartingWith(text, "reserved");
  EXPECT_THAT(reserved, HasSubstr("42.0 MiB"));
  EXPECT_THAT(reserved, HasSubstr("2.0 MiB"));
  EXPECT_THAT(reserved, HasSubstr("40.0 MiB"));
  EXPECT_THAT(LineStartingWith(text, "fragmentation ratio"), HasSubstr("45.0%"));
  EXPECT_THAT(LineStartingWith(text, "external fragmentation"), HasSubstr("25.0%"));
  EXPECT_THAT(LineStartingWith(text, "stranding threshold "), HasSubstr("512 B"));
  EXPECT_THAT(text, HasSubstr("max allocatable now: 900.0 MiB (from cached blocks alone: "
                              "12.0 MiB; device free: 982.0 MiB)"));
  EXPECT_THAT(text, HasSubstr("live at the end: 3 requests, 21.0 MiB requested"));
  EXPECT_THAT(text, HasSubstr("docs/metrics.md"));
}

TEST(RenderTextTest, ColumnsAreAligned) {
  const std::string text = RenderText(testing::MakeAllocatorResult(), {});
  // Right-aligned values end at the same column.
  const std::string a = LineStartingWith(text, "reserved");
  const std::string b = LineStartingWith(text, "segments");
  EXPECT_EQ(a.size(), b.size()) << a << "\n" << b;
}

TEST(RenderTextTest, TimelineAndMarks) {
  const std::string text = RenderText(testing::MakeAllocatorResult(), {});
  EXPECT_THAT(text, HasSubstr("Timeline (one row per step)"));
  const std::string header = LineStartingWith(text, "step");
  EXPECT_THAT(header, HasSubstr("reserved"));
  EXPECT_THAT(header, HasSubstr("extremes"));
  const std::string setup = LineStartingWith(text, "setup");
  EXPECT_THAT(setup, HasSubstr("min largest free block"));
  const std::string step1 = LineStartingWith(text, "1 ");
  EXPECT_THAT(step1, HasSubstr("peak reserved, peak allocated, peak live requested"));
  EXPECT_THAT(text, Not(HasSubstr("left out")));
}

TEST(RenderTextTest, LongTimelineIsElidedButKeepsExtremes) {
  auto r = testing::MakeAllocatorResult();
  auto& d = r.devices[0];
  d.timeline.clear();
  for (std::uint64_t i = 0; i < 500; ++i) {
    analysis::TimelineSample s;
    s.step_first = s.step_last = static_cast<std::int64_t>(i);
    s.first_event = i * 10;
    s.end_event = i * 10 + 10;
    d.timeline.push_back(s);
  }
  d.peak_reserved = testing::MakeExtreme(42 * kMiB, 3377, 337);
  TextOptions options;
  options.max_timeline_rows = 60;
  const std::string text = RenderText(r, options);
  EXPECT_THAT(text, HasSubstr("--json has all of them"));
  EXPECT_THAT(text, HasSubstr("of 500 rows"));
  EXPECT_NE(LineStartingWith(text, "0 "), "");
  EXPECT_NE(LineStartingWith(text, "499 "), "");
  EXPECT_THAT(LineStartingWith(text, "337 "), HasSubstr("peak reserved"));
}

TEST(SelectTimelineRowsTest, ShortTimelineShowsEverything) {
  std::vector<analysis::TimelineSample> t(10);
  const auto rows = SelectTimelineRows(t, {}, 60);
  ASSERT_EQ(rows.size(), 10u);
  EXPECT_EQ(rows.front(), 0u);
  EXPECT_EQ(rows.back(), 9u);
}

TEST(SelectTimelineRowsTest, LongTimelineKeepsEndsAndExtremes) {
  std::vector<analysis::TimelineSample> t(1000);
  for (std::uint64_t i = 0; i < t.size(); ++i) {
    t[i].first_event = i * 5;
    t[i].end_event = i * 5 + 5;
  }
  // Events 2503 and 2504 are in row 500; 4999 in the last; 99999 is past the end (last row).
  const auto rows = SelectTimelineRows(t, {2503, 2504, 12, 4999, 99999}, 60);
  EXPECT_LE(rows.size(), 62u);
  EXPECT_GE(rows.size(), 55u);
  EXPECT_TRUE(std::is_sorted(rows.begin(), rows.end()));
  EXPECT_EQ(std::adjacent_find(rows.begin(), rows.end()), rows.end());
  EXPECT_EQ(rows.front(), 0u);
  EXPECT_EQ(rows.back(), 999u);
  EXPECT_NE(std::find(rows.begin(), rows.end(), 500u), rows.end());
  EXPECT_NE(std::find(rows.begin(), rows.end(), 2u), rows.end());
}

TEST(RenderTextTest, MapComesAfterTheTimeline) {
  const std::string text = RenderText(testing::MakeAllocatorResult(), {});
  const auto timeline = text.find("Timeline");
  const auto map = text.find("Memory map at the end of the trace");
  ASSERT_NE(map, std::string::npos);
  EXPECT_LT(timeline, map);
  // The 20 MiB segment with a stranded MiB, drawn at the shared scale (1 cell = 320 KiB).
  EXPECT_THAT(text, HasSubstr("|######"));
  EXPECT_THAT(text, HasSubstr("!!!"));
  EXPECT_THAT(text, HasSubstr("+++"));
}

TEST(RenderTextTest, NoMapWhenAskedNot) {
  TextOptions options;
  options.show_map = false;
  EXPECT_THAT(RenderText(testing::MakeAllocatorResult(), options), Not(HasSubstr("Memory map")));
}

TEST(RenderTextTest, NoColorByDefaultColorOnRequest) {
  EXPECT_THAT(RenderText(testing::MakeAllocatorResult(), {}), Not(HasSubstr("\x1b[")));
  TextOptions options;
  options.color = true;
  const std::string colored = RenderText(testing::MakeAllocatorResult(), options);
  EXPECT_THAT(colored, HasSubstr("\x1b[1m"));
  EXPECT_THAT(colored, HasSubstr("\x1b[1;31m"));
}

TEST(RenderTextTest, RequestTraceExplainsWhatIsMissing) {
  const std::string text = RenderText(testing::MakeRequestResult(), {});
  EXPECT_THAT(text, HasSubstr("request trace"));
  EXPECT_THAT(text, HasSubstr("`fragscope replay`"));
  EXPECT_THAT(text, Not(HasSubstr("Memory map")));
  EXPECT_THAT(text, Not(HasSubstr("Final state")));
  EXPECT_THAT(text, Not(HasSubstr("stranding threshold")));
  EXPECT_THAT(LineStartingWith(text, "peak"), HasSubstr("3.0 MiB"));
  EXPECT_THAT(LineStartingWith(text, "peak"), HasSubstr("event 6, step 1"));
  EXPECT_THAT(LineStartingWith(text, "at the end"), HasSubstr("1.5 KiB"));
  EXPECT_THAT(text, HasSubstr("min 512 B, p50 1.0 KiB, p90 3.0 MiB, p99 3.0 MiB, max 3.0 MiB"));
  EXPECT_THAT(text, HasSubstr("3 distinct sizes"));
  EXPECT_THAT(LineStartingWith(text, "[512 B, 1.0 KiB)"), HasSubstr("**"));
  const std::string header = LineStartingWith(text, "step");
  EXPECT_THAT(header, HasSubstr("peak live requested"));
  EXPECT_THAT(header, Not(HasSubstr("reserved")));
}

TEST(RenderTextTest, EventsTimelineLabelsRowsByEventRange) {
  auto r = testing::MakeRequestResult();
  r.timeline_unit = "events";
  r.every_events = 5;
  const std::string text = RenderText(r, {});
  EXPECT_THAT(text, HasSubstr("Timeline (one row per 5 events)"));
  EXPECT_NE(LineStartingWith(text, "0-4 "), "");
  EXPECT_NE(LineStartingWith(text, "5-7 "), "");
}

TEST(RenderTextTest, NotesAreShown) {
  auto r = testing::MakeAllocatorResult();
  r.notes.push_back("timeline downsampled");
  EXPECT_THAT(RenderText(r, {}), HasSubstr("note: timeline downsampled"));
}

// Issue 24 item 3: the input's strings are escaped as fields, so with colors on the only ESC
// bytes are the report's own SGR sequences, and a newline in a label starts no line.
TEST(RenderTextTest, Issue24InputStringsCannotDriveTheTerminal) {
  auto r = testing::MakeAllocatorResult();
  const std::string evil = "x\x1b]0;title\x07\x1b[2J\nFAKE LINE\t\xc2\x9b";
  r.source = "run" + evil + ".jsonl";
  r.producer = "producer" + evil;
  r.labels.emplace_back("key" + evil, "value" + evil);
  r.notes.push_back("note" + evil);
  r.devices.front().name = "gpu" + evil;
  TextOptions options;
  options.color = true;
  const std::string text = RenderText(r, options);
  EXPECT_THAT(text, HasSubstr("producer: producerx\\x1b]0;title\\x07\\x1b[2J\\x0aFAKE "
                              "LINE\\x09\\xc2\\x9b\n"));
  EXPECT_THAT(text, HasSubstr("Device 0: gpux\\x1b]0;title"));
  EXPECT_THAT(text, HasSubstr("keyx\\x1b]0;title"));
  for (const std::string& line : Lines(text)) {
    EXPECT_FALSE(line.starts_with("FAKE LINE")) << "a field started a line";
    EXPECT_THAT(line, Not(HasSubstr("\x07")));
    EXPECT_THAT(line, Not(HasSubstr("\xc2\x9b")));
    for (std::size_t at = line.find('\x1b'); at != std::string::npos;
         at = line.find('\x1b', at + 1)) {
      // Every ESC left is the start of one of the report's own SGR sequences.
      const std::size_t end = line.find_first_not_of("0123456789;", at + 2);
      ASSERT_TRUE(line.compare(at, 2, "\x1b[") == 0 && end != std::string::npos && line[end] == 'm')
          << line;
    }
  }
}

TEST(RenderTextTest, NoDevices) {
  analysis::AnalysisResult r;
  r.source = "empty.jsonl";
  EXPECT_THAT(RenderText(r, {}), HasSubstr("No device had an event"));
}

}  // namespace
}  // namespace fragscope::sinks
