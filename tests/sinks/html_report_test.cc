#include "sinks/html/html_report.h"

#include <string>

#include <gtest/gtest.h>

#include "common/units.h"

namespace fragscope::sinks {
namespace {

std::size_t Count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

analysis::AnalysisResult OneDevice() {
  analysis::AnalysisResult r;
  r.kind = TraceKind::kAllocator;
  analysis::DeviceReport d;
  d.device = 0;
  d.peak_reserved.bytes = 3 * kGiB;
  d.peak_reserved.seen = true;
  d.peak_allocated.bytes = 2 * kGiB;
  d.worst_fragmentation_ratio = 0.25;
  r.devices.push_back(d);
  return r;
}

TEST(HtmlReportTest, TextFromTheInputCannotEndTheDataElement) {
  analysis::AnalysisResult r = OneDevice();
  r.source = "</script><script>alert(1)</script>";
  r.notes.push_back("<!-- a note -->");
  HtmlReportInput input;
  input.result = &r;
  const std::string html = RenderHtml(input);
  // The data element and the page script: two closing tags, none from the input.
  EXPECT_EQ(Count(html, "</script>"), 2u);
  EXPECT_EQ(Count(html, "<!--"), 0u);
  EXPECT_NE(html.find("&lt;/script&gt;"), std::string::npos);  // the <title>
  EXPECT_NE(html.find("default-src 'none'"), std::string::npos);
}

TEST(HtmlReportTest, VerdictNamesTheFirstOomOrThePeaks) {
  analysis::AnalysisResult r = OneDevice();
  EXPECT_EQ(ReportVerdict(r),
            "Fits on device 0: no out-of-memory; peak reserved 3.00 GiB, peak allocated 2.00 "
            "GiB.");
  // Issue 29, item 3: the green verdict carries the risk figure, not the ratio: whether the
  // largest request still fitted at the tightest moment (with a known capacity).
  r.devices[0].capacity_bytes = 4 * kGiB;
  r.devices[0].min_max_allocatable = analysis::Extreme{kGiB, {}, true};
  r.devices[0].requests.max = 256 * kMiB;
  EXPECT_EQ(ReportVerdict(r),
            "Fits on device 0: no out-of-memory; peak reserved 3.00 GiB of 4.00 GiB, peak "
            "allocated 2.00 GiB; at its tightest a 1.00 GiB request still fitted (the largest "
            "was 256.0 MiB).");
  r.devices[0].capacity_bytes.reset();
  analysis::OomDiagnosis o;
  o.event_index = 41;
  o.step = 3;
  // Issue 29, item 7: the words add up. The margin is free - block (80 - 62.5), and the block
  // (the rounded request) is named apart from the segment a cudaMalloc would have taken.
  o.rounded = 62 * kMiB + 512 * kKiB;
  o.needed = 64 * kMiB;
  o.free_unusable = 80 * kMiB;
  o.device_free = 0;
  o.cause = analysis::OomCause::kFragmentation;
  o.margin = o.free_unusable - o.rounded;
  r.devices[0].oom_diagnoses.push_back(o);
  r.devices[0].num_ooms = 1;
  EXPECT_EQ(ReportVerdict(r),
            "Out of memory at event 41 (step 3) on device 0: fragmentation — 80.0 MiB was free "
            "(gaps + device), 17.5 MiB more than the 62.5 MiB block it needed (a new segment of "
            "64.0 MiB), but no free block was large enough.");
  // The case: 63.9 MiB free, a 31.25 MiB block, a 32.0 MiB segment. Rounded apart, the
  // margin (32.65 MiB) printed 32.6 beside 63.9 and 31.2; one rounding makes them add up.
  r.devices[0].oom_diagnoses[0].free_unusable = 67'000'000;
  r.devices[0].oom_diagnoses[0].rounded = 32'768'000;
  r.devices[0].oom_diagnoses[0].needed = 32 * kMiB;
  r.devices[0].oom_diagnoses[0].margin = 67'000'000 - 32'768'000;
  EXPECT_EQ(ReportVerdict(r),
            "Out of memory at event 41 (step 3) on device 0: fragmentation — 63.9 MiB was free "
            "(gaps + device), 32.7 MiB more than the 31.2 MiB block it needed (a new segment of "
            "32.0 MiB), but no free block was large enough.");
  EXPECT_EQ(ReportVerdict(analysis::AnalysisResult{}),
            "No device had an event: nothing to report.");
}

TEST(HtmlReportTest, UnchangedSegmentsAreWrittenAsReferences) {
  analysis::AnalysisResult r = OneDevice();
  analysis::DeviceFrames frames;
  analysis::LayoutSegment seg;
  seg.addr = 1 << 20;
  seg.size = 2 * kMiB;
  seg.blocks.push_back(
      analysis::LayoutBlock{seg.addr, seg.size, 0, model::BlockState::kFree, false, -1, -1});
  for (std::uint64_t e : {10u, 20u}) {
    analysis::LayoutFrame f;
    f.event_index = e;
    f.segments = {seg};
    f.blocks = 1;
    frames.frames.push_back(f);
  }
  HtmlReportInput input;
  input.result = &r;
  input.frames.push_back(frames);
  const std::string html = RenderHtml(input);
  EXPECT_NE(html.find("\"segs\":[[1048576,2097152,"), std::string::npos);
  EXPECT_NE(html.find("\"segs\":[0]"), std::string::npos);  // frame 2: segment 0 of frame 1
}

}  // namespace
}  // namespace fragscope::sinks
