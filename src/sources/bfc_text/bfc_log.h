// BfcLogScanner: finds the out-of-memory reports of TensorFlow's and JAX/XLA's allocators in a
// log and reads their figures: the BFC allocator's dump (every era: TensorFlow 1.x
// core/common_runtime, 2.x tsl/framework, XLA's xla/tsl/framework with chunk tags and its
// "Allocator memory summary:"), JAX's "RESOURCE_EXHAUSTED: Out of memory while trying to
// allocate N bytes", and the cuda_malloc_async allocator's "cuMemAllocAsync failed to
// allocate" with the pool's RESERVED/USED attributes (docs/formats.md, "BFC allocator logs").
//
// Main types: BfcChunk, BfcRegion, BfcBin, BfcReport (one failure and its dump), BfcLogScan.
// Line based and bounded (BfcLogLimits): only the last report keeps its chunk map; every search
// is a plain substring scan. Lines may carry any logger prefix (glog's "I tensorflow/...cc:123]",
// "2024-01-01 12:00:00.000000: W external/local_tsl/...", "[rank0]:") and be interleaved with
// other output: each figure is recognised by its own words, wherever it sits on the line.
//
// Thread safety: none; one scanner per input.
#ifndef FRAGSCOPE_SOURCES_BFC_TEXT_BFC_LOG_H_
#define FRAGSCOPE_SOURCES_BFC_TEXT_BFC_LOG_H_

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fragscope/bfc_report.h"
#include "fragscope/status.h"

namespace fragscope::sources {

struct BfcLogLimits {
  std::size_t max_line_bytes = std::size_t{1} << 20;  // longer lines are searched up to here
  std::size_t max_chunks = std::size_t{1} << 22;      // chunks kept of the last dump (~4M)
  std::size_t max_regions = std::size_t{1} << 16;
  std::size_t max_reports = 1000;  // failures kept (figures only); later ones are counted
};

struct BfcLogScan {
  std::vector<BfcReport> reports;  // in input order; only the last keeps its chunk map
  std::uint64_t dropped_reports = 0;
  BfcLogContext context;
  std::uint64_t lines = 0;
  std::uint64_t cut_lines = 0;
};

class BfcLogScanner {
 public:
  explicit BfcLogScanner(BfcLogLimits limits = {}) : limits_(limits) {}
  /// Feeds one line without its '\n' (a trailing '\r' is ignored).
  void AddLine(std::string_view line);
  /// Ends the input and returns what was found. The scanner is spent afterwards.
  BfcLogScan Finish();

 private:
  BfcReport& Begin(BfcReportKind kind);
  BfcReport* Current();
  void Note(BfcReport& r, std::string text);
  void ChunkLine(std::string_view text, bool in_use);

  BfcLogLimits limits_;
  BfcLogScan scan_;
  bool open_ = false;          // the last report still takes lines
  int stats_lines_ = 0;        // > 0: "Name: value" lines of a Stats block may follow
  bool buffer_stats_ = false;  // inside "BufferAssignment stats:"
  std::uint64_t kept_chunks_ = 0;
};

/// Scans a whole text in memory (tests, the fuzzer).
BfcLogScan ScanBfcLog(std::string_view text, const BfcLogLimits& limits = {});

/// Scans a file, or standard input for "-", in one pass (as ReadOomText reads it: a FIFO or a
/// pipe once, at most --max-input-bytes). Errors name the path.
Result<BfcLogScan> ReadBfcLog(const std::string& path, const BfcLogLimits& limits = {});

/// True when the scan found anything to explain.
inline bool HasBfcReport(const BfcLogScan& scan) { return !scan.reports.empty(); }

}  // namespace fragscope::sources

#endif  // FRAGSCOPE_SOURCES_BFC_TEXT_BFC_LOG_H_
