#include "sinks/html/html_report.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/units.h"
#include "sinks/html/packed_ints.h"

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

// The page's embedded data (docs/report.md, "The embedded data").
nlohmann::json PageData(const std::string& html) {
  const std::string open = "id=\"fragscope-data\">";
  const std::size_t from = html.find(open) + open.size();
  return nlohmann::json::parse(html.substr(from, html.find("</script>", from) - from));
}

std::vector<std::uint64_t> Unpacked(const nlohmann::json& packed) {
  const auto numbers = UnpackInts(packed.get<std::string>());
  EXPECT_TRUE(numbers.has_value());
  return numbers.value_or(std::vector<std::uint64_t>{});
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
  const nlohmann::json data = PageData(RenderHtml(input));
  const nlohmann::json& d = data["devices"][0];
  // Frame 1: row 0 of the segment table (tag 0), one free block of 2 MiB = 4096 × 512.
  EXPECT_EQ(Unpacked(d["frames"][0]["segs"]), (std::vector<std::uint64_t>{0, 1, 0, 8192, 0, 0}));
  // Frame 2: segment 0 of frame 1, unchanged (2 × 0 + 1).
  EXPECT_EQ(Unpacked(d["frames"][1]["segs"]), (std::vector<std::uint64_t>{1}));
  EXPECT_EQ(Unpacked(d["segments"]),
            (std::vector<std::uint64_t>{1 << 20, 2 * kMiB, 0, 1, 0}));  // large pool
}

// Issue 33 item 1 (page size): every field of a block survives packing, including the cases
// the packing makes cheap only when they are common (sizes off the 512-byte grid, a gap
// between blocks, requested below size, a free block with a requested size).
TEST(HtmlReportTest, PackedBlocksKeepEveryField) {
  analysis::AnalysisResult r = OneDevice();
  analysis::LayoutSegment seg;
  seg.addr = (std::uint64_t{1} << 47) + 4096;
  seg.size = 20 * kMiB;
  seg.stream = 7;
  seg.expandable = true;
  const std::uint64_t a = seg.addr;
  seg.blocks = {
      analysis::LayoutBlock{a, 1000, 999, model::BlockState::kAllocated, false, 3, 0},
      analysis::LayoutBlock{a + 4096, kMiB, 17, model::BlockState::kFree, true, -1, -1},
      analysis::LayoutBlock{a + 4096 + kMiB, 3 * kMiB, 3 * kMiB - 5,
                            model::BlockState::kPendingFree, false, 4, 1},
      analysis::LayoutBlock{a + 4096 + 4 * kMiB, 512, 0, model::BlockState::kFree, false, -1, -1}};
  analysis::DeviceFrames frames;
  analysis::LayoutFrame f;
  f.segments = {seg};
  f.blocks = seg.blocks.size();
  frames.frames.push_back(f);
  frames.allocations.resize(2);
  HtmlReportInput input;
  input.result = &r;
  input.frames.push_back(frames);
  const nlohmann::json data = PageData(RenderHtml(input));
  const nlohmann::json& d = data["devices"][0];
  EXPECT_EQ(Unpacked(d["segments"]), (std::vector<std::uint64_t>{seg.addr, seg.size, 7, 1, 1}));
  const std::vector<std::uint64_t> u = Unpacked(d["frames"][0]["segs"]);
  ASSERT_EQ(u.size(), 2 + 4 * seg.blocks.size());
  EXPECT_EQ(u[0], 0u);
  EXPECT_EQ(u[1], seg.blocks.size());
  std::uint64_t end = 0;
  for (std::size_t i = 0; i < seg.blocks.size(); ++i) {
    const analysis::LayoutBlock& b = seg.blocks[i];
    const std::uint64_t* x = &u[2 + 4 * i];
    const std::uint64_t offset = end + static_cast<std::uint64_t>(Unzigzag(x[0]));
    EXPECT_EQ(offset, b.addr - seg.addr) << i;
    const std::uint64_t size = x[1] % 2 == 0 ? x[1] / 2 * 512 : x[1] / 2;
    EXPECT_EQ(size, b.size) << i;
    const std::uint64_t state = x[2] % 4;
    EXPECT_EQ(state, i == 0 ? 1u : i == 1 ? 3u : i == 2 ? 2u : 0u) << i;
    EXPECT_EQ(static_cast<std::int64_t>(x[2] / 4) - 1, b.allocation) << i;
    const std::uint64_t base = state == 1 || state == 2 ? size : 0;
    EXPECT_EQ(static_cast<std::int64_t>(base) - Unzigzag(x[3]),
              static_cast<std::int64_t>(b.requested))
        << i;
    end = offset + size;
  }
}

}  // namespace
}  // namespace fragscope::sinks
