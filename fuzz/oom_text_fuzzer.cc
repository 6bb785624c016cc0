// Fuzz target for the out-of-memory message scanner (src/sources/oom_text) and the verdict
// logic behind `fragscope explain`, with these oracles:
//   * the scan respects its limits: at most max_messages kept, each message's text at most
//     max_message_bytes, 1 <= line <= last_line <= lines read;
//   * every verdict agrees with its own figures (docs/explain.md): fragmentation means
//     S <= H + U + P; shortage and other_processes mean S > H + U + P;
//   * both reports render (the JSON one parses back);
//   * a size printed as PyTorch prints it parses back within the two-decimal rounding.
// The input is the log text itself; its first 8 bytes also seed the size round trip.
//
// Built two ways: with libFuzzer (fuzz/CMakeLists.txt, preset "fuzz") and with replay_main.cc
// (oom_text_fuzz_replay, a ctest that runs fuzz/corpus/oom_text/).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "analysis/explain.h"
#include "common/units.h"
#include "sinks/report/explain_report.h"
#include "sources/oom_text/oom_text_scanner.h"

namespace {

using fragscope::OomMessage;
using fragscope::analysis::OomVerdict;

// A real message is < 1 KiB and a log line rarely longer; 64 KiB leaves room for many lines,
// several messages and lines beyond the small line cap below.
constexpr std::size_t kMaxInputBytes = 64 * 1024;

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "oom_text oracle failed: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > kMaxInputBytes) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  // Small limits so the fuzzer reaches every cap quickly.
  fragscope::sources::OomTextLimits limits;
  limits.max_line_bytes = 4096;
  limits.max_message_bytes = 2048;
  limits.max_message_lines = 8;
  limits.max_messages = 16;
  const fragscope::sources::OomTextScan scan = fragscope::sources::ScanOomText(text, limits);
  Check(scan.messages.size() <= limits.max_messages, "too many messages kept");

  fragscope::analysis::ExplainReport report;
  report.input = "fuzz";
  report.lines = scan.lines;
  for (const OomMessage& m : scan.messages) {
    Check(m.text.size() <= limits.max_message_bytes, "message text beyond the cap");
    Check(m.line >= 1 && m.line <= m.last_line && m.last_line <= scan.lines, "bad line numbers");
    const fragscope::analysis::OomExplanation e = fragscope::analysis::ExplainOom(m);
    if (e.figures) {
      const fragscope::analysis::OomFigures& f = *e.figures;
      // The private pools' cache is not within the regular allocator's reach.
      const std::uint64_t reach = f.headroom + f.unallocated;
      if (e.verdict == OomVerdict::kFragmentation) Check(f.tried <= reach, "fragmentation");
      if (e.verdict == OomVerdict::kCap) {
        Check((m.allowed && f.reserved + f.tried > *m.allowed) || f.tried < f.free,
              "a cap without the cap or free memory beyond the request");
      }
      if (e.verdict == OomVerdict::kShortage || e.verdict == OomVerdict::kOtherProcesses) {
        Check(f.tried > reach, "shortage or other processes with enough cached");
      }
    } else {
      Check(e.verdict == OomVerdict::kUndetermined, "a verdict without figures");
      Check(!e.missing.empty() || m.text.rfind("CUDA error", 0) == 0, "nothing missing");
    }
    report.errors.push_back(e);
  }
  (void)fragscope::sinks::RenderExplainText(report);
  const std::string json = fragscope::sinks::RenderExplainJson(report);
  Check(nlohmann::json::accept(json), "the JSON report does not parse");

  // Size round trip: FormatBytesLikePyTorch prints two decimals of its unit.
  if (size >= 8) {
    std::uint64_t bytes = 0;
    std::memcpy(&bytes, data, sizeof(bytes));
    bytes >>= 14;  // < 2^50: the units PyTorch prints
    const std::string printed = fragscope::FormatBytesLikePyTorch(bytes);
    std::size_t used = 0;
    const std::optional<std::uint64_t> back = fragscope::sources::ParsePrintedSize(printed, &used);
    Check(back.has_value() && used == printed.size(), "a printed size does not parse");
    const std::uint64_t unit = bytes <= 1024           ? 1
                               : bytes <= (1u << 20)   ? 1024
                               : bytes <= (1ull << 30) ? (1u << 20)
                                                       : (1ull << 30);
    const std::uint64_t diff = *back > bytes ? *back - bytes : bytes - *back;
    Check(diff <= unit / 200 + 1, "a printed size parses back too far off");
  }
  return 0;
}
