// Fuzz target for the TensorFlow / JAX allocator log scanner (src/sources/bfc_text) and the
// verdicts of `fragscope explain` on it, with these oracles:
//   * the scan respects its limits: reports and kept chunks within BfcLogLimits, line numbers
//     within the lines read;
//   * every verdict agrees with its own figures (docs/explain.md, "TensorFlow and JAX"):
//     fragmentation means F >= S; shortage and cap mean F < S;
//   * both reports render (the JSON one parses back).
//
// Built two ways: with libFuzzer (fuzz/CMakeLists.txt) and with replay_main.cc
// (bfc_log_fuzz_replay, a ctest that runs fuzz/corpus/bfc_log/).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include <nlohmann/json.hpp>

#include "analysis/bfc_explain.h"
#include "sinks/report/explain_report.h"
#include "sources/bfc_text/bfc_log.h"

namespace {

// Real dumps run to megabytes, but 64 KiB holds several dumps' worth of every kind of line.
constexpr std::size_t kMaxInputBytes = 64 * 1024;

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "bfc_log oracle failed: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > kMaxInputBytes) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  // Small limits so the fuzzer reaches every cap quickly.
  fragscope::sources::BfcLogLimits limits;
  limits.max_line_bytes = 4096;
  limits.max_chunks = 64;
  limits.max_regions = 8;
  limits.max_reports = 8;
  const fragscope::sources::BfcLogScan scan = fragscope::sources::ScanBfcLog(text, limits);
  Check(scan.reports.size() <= limits.max_reports, "too many reports kept");
  fragscope::analysis::BfcExplainReport report;
  report.input = "fuzz";
  report.lines = scan.lines;
  for (const fragscope::BfcReport& r : scan.reports) {
    Check(r.line >= 1 && r.line <= scan.lines, "bad line numbers");
    std::size_t kept = 0;
    for (const fragscope::BfcRegion& g : r.regions) kept += g.chunks.size();
    Check(kept <= limits.max_chunks, "chunks beyond the cap");
    const fragscope::analysis::BfcExplanation e = fragscope::analysis::ExplainBfc(r, scan.context);
    if (e.figures && r.kind == fragscope::BfcReportKind::kBfc) {
      const auto& f = *e.figures;
      using fragscope::analysis::OomVerdict;
      if (e.verdict == OomVerdict::kFragmentation) Check(f.free_in_pool >= f.request, "frag");
      if (e.verdict == OomVerdict::kShortage || e.verdict == OomVerdict::kCap) {
        Check(f.free_in_pool < f.request, "shortage with enough free");
      }
    }
    report.errors.push_back(e);
  }
  (void)fragscope::sinks::RenderBfcExplainText(report);
  Check(nlohmann::json::accept(fragscope::sinks::RenderBfcExplainJson(report)),
        "the JSON report does not parse");
  return 0;
}
