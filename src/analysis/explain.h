// Explain: the verdict on one out-of-memory message (OomMessage) — fragmentation, shortage,
// memory held by other processes, or undetermined — how much memory was stranded, and the
// remedies ranked; optionally checked by re-simulating the job's requests under each proposed
// allocator setting (VerifyRemedies, through Tune). docs/explain.md gives every formula.
//
// Thread safety: pure functions (VerifyRemedies runs Tune's worker threads internally).
#ifndef FRAGSCOPE_ANALYSIS_EXPLAIN_H_
#define FRAGSCOPE_ANALYSIS_EXPLAIN_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fragscope/event.h"
#include "fragscope/oom_message.h"
#include "fragscope/status.h"
#include "model/alloc_conf.h"
#include "model/recorded_addresses.h"

namespace fragscope::analysis {

enum class OomVerdict : std::uint8_t {
  kFragmentation,   // free + cached-but-unallocated >= the request: memory was there, in pieces
  kShortage,        // free + cached-but-unallocated < the request, whoever holds the rest
  kOtherProcesses,  // would have fit without the memory other processes held
  kUndetermined,    // the message lacks a figure the decision needs (see missing)
  /// A limit on this process's memory was the bound: reserved + request beyond the printed
  /// "allowed" (a memory fraction), or the device reported far more free memory than the
  /// request (a limit the message does not print).
  kCap,
};
/// "fragmentation", "shortage", "other_processes", "undetermined", "cap".
std::string_view OomVerdictName(OomVerdict verdict);

/// The outcome of one replay under a remedy's setting (VerifyRemedies).
struct RemedyCheck {
  bool oom = false;
  std::uint64_t oom_event = 0;  // request event index of the first OOM
  std::int64_t oom_step = -1;
  std::uint64_t peak_reserved = 0;
  /// (reserved - allocated) / reserved when the OOM happened; nullopt without an OOM.
  std::optional<double> fragmentation_at_oom;
  /// Worse than the job's own settings: runs out of memory at an earlier request event than
  /// they do, or at all when they fit.
  bool worse = false;
};

struct Remedy {
  std::string id;                    // stable key: "expandable_segments", "max_split_size_mb", ...
  std::string alloc_conf;            // the PYTORCH_CUDA_ALLOC_CONF it proposes; "" for code changes
  std::string action;                // what to do, one line
  std::string why;                   // the figures behind it
  std::optional<RemedyCheck> check;  // set by VerifyRemedies for allocator settings
  /// alloc_conf is the whole setting (a search result), not something added to the job's own.
  bool whole_setting = false;
  /// TensorFlow / JAX remedies (bfc_explain.h): the framework setting it proposes, as the user
  /// writes it ("TF_GPU_ALLOCATOR=cuda_malloc_async"); "" for code changes and PyTorch's.
  std::string setting = {};
};

/// The figures every verdict uses, in bytes (docs/explain.md, "Formulas").
struct OomFigures {
  std::uint64_t tried = 0;          // S
  std::uint64_t total = 0;          // T
  std::uint64_t free = 0;           // F
  std::uint64_t reserved = 0;       // R
  std::uint64_t allocated = 0;      // A (includes private-pool cache in 2.4+ wording)
  std::uint64_t unallocated = 0;    // U = R - A - P
  std::uint64_t private_pools = 0;  // P
  std::uint64_t headroom = 0;       // H = F, or min(F, allowed - R) under a memory-fraction limit
  std::uint64_t outside = 0;        // O = T - F - R: device memory outside this process's cache
  std::optional<std::uint64_t> others;    // memory of other processes, when the message lists it
  std::optional<std::uint64_t> self_pid;  // a "Process P" entry taken to be this process
  /// R + F − T when the figures exceed the card in the pattern of Windows' WDDM "sysmem
  /// fallback" (docs/explain.md, "Figures beyond the card"); 0 otherwise.
  std::uint64_t sysmem_fallback = 0;
};

struct OomExplanation {
  OomMessage message;
  OomVerdict verdict = OomVerdict::kUndetermined;
  std::vector<std::string> missing;   // figures the message lacks (MissingFigures)
  std::optional<OomFigures> figures;  // when the message has the figures
  std::string summary;                // one sentence
  std::vector<std::string> reasons;   // the formula lines, with numbers
  /// False when the figures contradict each other (R + F beyond T: a garbled message); then
  /// stranded and shortfall mean nothing.
  bool figures_agree = true;
  /// U: cached by PyTorch outside private pools, free but not in one block for the request.
  /// The private pools' cache P is not counted: only their own graphs and pools can use it.
  std::uint64_t stranded = 0;
  std::uint64_t shortfall = 0;     // S - H: what the driver lacked
  std::vector<std::string> notes;  // caveats (rounded request, wording version, ...)
  std::vector<Remedy> remedies;    // best first
};

/// The figures `message` lacks for a verdict, named as PyTorch's text names them ("Tried to
/// allocate", "total capacity", "free", "reserved"); empty when it has them all.
std::vector<std::string> MissingFigures(const OomMessage& message);

/// The verdict and ranked remedies for one message. Never fails: a message without its
/// figures gets kUndetermined and `missing`.
OomExplanation ExplainOom(const OomMessage& message);

/// Drops the remedies whose allocator setting the job already has: those that, applied on top
/// of `current` (PyTorch's parse, `version`), leave it unchanged. Each dropped one becomes a
/// note naming `source` ("--alloc-conf", "the snapshot's recorded settings"). A remedy that
/// does not parse under `version` is kept.
void OmitRemediesInEffect(const model::AllocatorConfig& current, std::string_view source,
                          model::ConfigVersion version, OomExplanation* explanation);

struct VerifyOptions {
  std::uint64_t capacity_bytes = 0;        // the device: T of the message, or --capacity
  std::uint64_t used_by_others_bytes = 0;  // O of the message, or --used-by-others
  std::string current_conf;                // the job's own PYTORCH_CUDA_ALLOC_CONF
  model::ConfigVersion version = model::ConfigVersion::kNewest;
  unsigned threads = 0;
  /// A snapshot's recorded segment addresses per device (TuneOptions::addresses).
  std::map<std::int32_t, model::RecordedAddresses> addresses;
  /// Where each device's recorded requests begin (TuneOptions::recorded_from).
  std::map<std::int32_t, std::size_t> recorded_from;
  /// Whole settings searched beside the remedies, in the same replays (`fragscope tune`'s grid,
  /// DefaultTuneGrid): the best that fits becomes a remedy when no proposed setting fits with a
  /// peak as low. Empty: the remedies only.
  std::vector<std::string> search;
  /// Device allocations the snapshot's recorded history holds (TuneOptions::
  /// recorded_device_allocs); unset for a request trace.
  std::optional<std::uint64_t> recorded_device_allocs;
};

/// What the replay under the job's own settings did, for the report.
struct Verification {
  std::string source;  // the trace or snapshot path
  std::uint64_t request_events = 0;
  VerifyOptions options;
  RemedyCheck current;
  bool reproduced = false;  // the current settings run out of memory, as the job did
  /// Why the replays cannot rank the remedies (TuneCannotRank), or "": the remedies then keep
  /// the message's order, without checks, and no searched setting joins them.
  std::string cannot_rank;
};

/// Everything `fragscope explain` reports on one input.
struct ExplainReport {
  std::string input;  // path, or "-" for standard input
  std::uint64_t lines = 0;
  std::uint64_t cut_lines = 0;         // lines longer than the scanner's limit
  std::uint64_t dropped_messages = 0;  // beyond the scanner's limit
  std::vector<OomExplanation> errors;  // in input order
  std::optional<Verification> verification;
  std::size_t verified_error = 0;  // index into errors of the verified one
};

/// Replays `requests` (a request trace) once with the current settings, once per remedy that
/// proposes an allocator setting (appended to the current settings) and once per setting of
/// options.search, in one Tune call; fills each remedy's check, adds the search's best fitting
/// setting as remedy "searched_setting" when no remedy fits with a peak as low, and re-ranks:
/// settings that avoid the OOM first (lowest peak reserved first), then the remedies a replay
/// cannot test (code changes) in their order, then settings that still run out of memory (the
/// later OOM first), then those worse than the current settings (an earlier OOM). For an XPU
/// message only expandable_segments of the search is tried (the XPU allocator reads no other
/// key). Errors: a trace the replayer rejects, a bad current_conf (kInvalidArgument).
Result<Verification> VerifyRemedies(const std::vector<Event>& requests,
                                    const VerifyOptions& options, OomExplanation* explanation);

}  // namespace fragscope::analysis

#endif  // FRAGSCOPE_ANALYSIS_EXPLAIN_H_
