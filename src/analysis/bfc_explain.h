// Explain for TensorFlow and JAX/XLA: the verdict on one allocator failure a log reports
// (BfcReport) — fragmentation (the pool's free bytes were enough, no chunk was large enough),
// shortage, or a configured cap (memory_limit_ from a memory fraction or a logical device's
// limit) — with the arithmetic, the stranded bytes and the remedies in that framework's own
// terms (TF_GPU_ALLOCATOR=cuda_malloc_async, XLA_PYTHON_CLIENT_PREALLOCATE=false,
// XLA_PYTHON_CLIENT_ALLOCATOR=platform, memory growth, the fraction). docs/explain.md, "TensorFlow
// and JAX", gives every formula.
//
// Remedies are not replayed here: each names its setting (Remedy::setting), which
// VerifyBfcRemedies (bfc_verify.h) replays through the BFC allocator model on a request trace.
//
// Thread safety: pure functions.
#ifndef FRAGSCOPE_ANALYSIS_BFC_EXPLAIN_H_
#define FRAGSCOPE_ANALYSIS_BFC_EXPLAIN_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "analysis/explain.h"
#include "fragscope/bfc_report.h"

namespace fragscope::analysis {

/// The figures every BFC verdict uses, in bytes (docs/explain.md, "TensorFlow and JAX").
struct BfcFigures {
  std::uint64_t request = 0;       // S: the request rounded to 256 bytes
  std::uint64_t limit = 0;         // L: memory_limit_ (the pool may grow to it)
  std::uint64_t pool = 0;          // P: bytes of the regions (total_region_allocated_bytes_)
  std::uint64_t in_use = 0;        // U: bytes of chunks in use
  std::uint64_t free_in_pool = 0;  // F = P - U
  std::uint64_t largest_free = 0;  // G: the largest free chunk
  bool largest_known = false;      // G came from the chunk map, Stats or the summary
  std::uint64_t room = 0;          // A = L - P, rounded down to 256: what the pool may grow by
  /// The device's memory, when the log (TF 1.x "totalMemory", cuda_malloc_async) or
  /// --capacity gives it.
  std::optional<std::uint64_t> device_total;
};

/// Per bin: the chunks whose size falls in [256 << i, 256 << (i + 1)) (the last bin: from
/// 256 << 20 on), from the chunk map.
struct BfcBinUse {
  int bin = 0;
  std::uint64_t chunks = 0;
  std::uint64_t free_chunks = 0;
  std::uint64_t bytes = 0;
  std::uint64_t free_bytes = 0;
  std::uint64_t largest_free = 0;
};
/// The bins of a report's chunk map (all 21; empty ones included).
std::array<BfcBinUse, kBfcNumBins> BfcBinUses(const BfcReport& report);

struct BfcExplanation {
  std::size_t report = 0;  // index into BfcLogScan::reports
  std::string framework;   // "tensorflow", "jax" or "" (remedies for both)
  std::string allocator;   // "GPU_0_bfc", "gpu_async_0"
  std::string wording;     // which log text it came from, with its era
  std::uint64_t line = 0;
  std::uint64_t last_line = 0;
  OomVerdict verdict = OomVerdict::kUndetermined;
  std::vector<std::string> missing;  // figures the log lacks, named as it prints them
  std::optional<BfcFigures> figures;
  std::string summary;
  std::vector<std::string> reasons;  // the formula lines, with numbers
  std::uint64_t stranded = 0;        // free in the pool, in chunks too small for the request
  std::uint64_t shortfall = 0;       // what was lacking beyond everything free and growable
  std::vector<std::string> notes;
  std::vector<Remedy> remedies;  // best first; Remedy::setting names the framework setting
  /// The chunk map's bins (when the dump lists chunks).
  std::optional<std::array<BfcBinUse, kBfcNumBins>> bins;
};

// ---- Replaying the remedies (bfc_verify.h) ----

struct BfcVerifyOptions {
  /// The device (--capacity, or the log's total); 0: unknown, only a memory limit bounds.
  std::uint64_t capacity_bytes = 0;
  std::uint64_t used_by_others_bytes = 0;  // --used-by-others
  /// The job's settings as `replay --bfc-conf` takes them; unset: read from the log
  /// (JobBfcSettings).
  std::optional<std::string> current_conf;
};

/// How a remedy's replay was made.
enum class BfcCheckKind {
  kModel,  // through the BFC model under the remedy's setting
  kBound,  // no pool: the trace's live bytes against the limit (an upper bound on the benefit)
};

struct BfcVerification {
  std::string source;  // the trace path
  std::uint64_t request_events = 0;
  BfcVerifyOptions options;
  std::string current_conf;  // the settings replayed as the job's, canonical ("" = defaults)
  /// Where current_conf came from: "--bfc-conf", or what in the log decided it.
  std::string current_from;
  std::uint64_t limit_bytes = 0;  // the job's memory limit in the replay
  RemedyCheck current;            // peak_reserved: the peak pool
  bool reproduced = false;        // the job's settings run out of memory, as the log says
  /// Remedy id -> how it was checked (only for checked remedies), and why others were not.
  std::vector<std::pair<std::string, BfcCheckKind>> kinds;
  std::vector<std::string> not_replayed;  // "<action>: <why>"
};

/// Everything `fragscope explain` reports on a TensorFlow / JAX log.
struct BfcExplainReport {
  std::string input;  // path, or "-" for standard input
  std::uint64_t lines = 0;
  std::uint64_t cut_lines = 0;
  std::uint64_t dropped_reports = 0;   // failures beyond the scanner's limit
  std::vector<BfcExplanation> errors;  // in input order
  std::uint64_t soft_failures = 0;     // "not a failure" allocation attempts seen
  std::uint64_t pytorch_messages = 0;  // PyTorch messages in the same input (not explained)
  std::optional<BfcVerification> verification;  // --trace
  std::size_t verified_error = 0;               // index into errors of the verified one
};

/// The verdict and remedies for one report. `capacity` (optional) is the device's memory (the
/// user's --capacity). Never fails: a report without its figures gets kUndetermined and
/// `missing`.
BfcExplanation ExplainBfc(const BfcReport& report, const BfcLogContext& context,
                          std::optional<std::uint64_t> capacity = std::nullopt);

}  // namespace fragscope::analysis

#endif  // FRAGSCOPE_ANALYSIS_BFC_EXPLAIN_H_
