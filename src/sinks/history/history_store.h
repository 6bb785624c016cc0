// HistoryStore: fragscope's embedded SQLite history (docs/history.md). It keeps
//   * run summaries (analysis::RunSummary), keyed by run name and grouped by model
//     architecture, which are the baselines a new run is compared with;
//   * agent samples (agent::AgentSample) as the daemon receives them, with bounded retention.
// One database file in WAL mode. A file that is not a fragscope history (not SQLite, another
// application's database, a newer schema, failing quick_check) is refused with an error naming
// the path and the problem, and is never written to.
//
// Thread safety: a HistoryStore is one SQLite connection and must be used by one thread at a
// time. Several processes may open the same file (WAL, busy timeout).
#ifndef FRAGSCOPE_SINKS_HISTORY_HISTORY_STORE_H_
#define FRAGSCOPE_SINKS_HISTORY_HISTORY_STORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "analysis/run_summary.h"
#include "fragscope/status.h"
#include "sources/agent/agent_sample.h"

struct sqlite3;
struct sqlite3_stmt;

namespace fragscope::sinks {

/// PRAGMA application_id of a fragscope history ("FrgS").
inline constexpr std::int32_t kHistoryApplicationId = 0x46726753;
/// The schema version this build writes; older databases are migrated on open.
inline constexpr int kHistorySchemaVersion = 3;

/// How long agent samples are kept, by age, rows and bytes (oldest first). Pruning runs after
/// each AppendSamples, in its own short transaction, and deletes at most max(prune_batch_rows,
/// twice the rows just appended) rows, so a write never waits for a long delete and pruning
/// always outruns the inflow; a backlog (e.g. after lowering the limits) drains over a few
/// appends.
struct SampleRetention {
  std::int64_t max_age_s = 14 * 24 * 3600;  // by received time; 0: no age limit
  std::uint64_t max_rows = 5'000'000;       // 0: no row limit
  /// The samples' size: each row's strings and histogram plus 200 bytes (0: no size limit).
  std::uint64_t max_bytes = std::uint64_t{1} << 30;
  std::uint32_t prune_batch_rows = 10'000;
};

struct HistoryOptions {
  /// Create the file (and its directory, mode 0700) when it does not exist; else NotFound.
  bool create_if_missing = true;
  /// true: synchronous=FULL, a commit that returned survives power loss. false:
  /// synchronous=NORMAL, a commit survives a crash of the process (kill -9) but the last
  /// commits may be lost on power loss or an OS crash; never corrupt either way.
  bool sync_full = true;
  int busy_timeout_ms = 5000;
  SampleRetention retention;
};

/// A sample as stored: what the agent sent plus when the daemon received it.
struct ReceivedSample {
  agent::AgentSample sample;
  std::int64_t received_us = 0;  // µs since the Unix epoch
};

struct RunFilter {
  std::string architecture;  // empty: any
  std::string run;           // empty: any
  std::size_t limit = 0;     // 0: all
};

struct SampleFilter {
  std::string run;  // empty: any
  std::string job;  // empty: any
};

class HistoryStore {
 public:
  /// Opens or creates the history at `path`. Errors (each message starts with the path):
  /// NotFound (missing and !create_if_missing), Corruption (not a SQLite database, another
  /// application's database, quick_check failure, a schema this build does not know), IoError.
  static Result<std::unique_ptr<HistoryStore>> Open(const std::string& path,
                                                    const HistoryOptions& options = {});
  ~HistoryStore();
  HistoryStore(const HistoryStore&) = delete;
  HistoryStore& operator=(const HistoryStore&) = delete;

  const std::string& path() const { return path_; }

  // ---- Run summaries ----
  /// Stores `summary`. With `replace`, a run of the same name is replaced; without, it is an
  /// InvalidArgument error. REQUIRES: summary.run and summary.architecture non-empty.
  Status RecordRun(const analysis::RunSummary& summary, bool replace = false);
  /// Runs matching `filter`, newest first (by time recorded, then by insertion).
  Result<std::vector<analysis::RunSummary>> ListRuns(const RunFilter& filter = {});
  /// The `n` newest runs of `architecture`.
  Result<std::vector<analysis::RunSummary>> LastRuns(const std::string& architecture,
                                                     std::size_t n);
  /// The run named `run`, or nullopt.
  Result<std::optional<analysis::RunSummary>> FindRun(const std::string& run);
  /// Deletes the run summary named `run` and the agent samples of that run; false when no such
  /// run summary existed.
  Result<bool> DeleteRun(const std::string& run);

  // ---- Agent samples ----
  /// Appends `samples` in one transaction (all or none), then prunes by the retention.
  Status AppendSamples(std::span<const ReceivedSample> samples);
  /// The same, every sample received at `received_us`.
  Status AppendSamples(std::span<const agent::AgentSample> samples, std::int64_t received_us);
  Result<std::uint64_t> CountSamples(const SampleFilter& filter = {});
  /// Samples matching `filter`, oldest first; `limit` 0: all.
  Result<std::vector<ReceivedSample>> Samples(const SampleFilter& filter, std::size_t limit = 0);
  /// One pruning pass (what AppendSamples runs): deletes up to max(prune_batch_rows, min_rows)
  /// samples older than max_age_s before `now_us`, beyond max_rows or beyond max_bytes, oldest
  /// first; returns how many were deleted.
  Result<std::uint64_t> PruneSamples(std::int64_t now_us, std::uint64_t min_rows = 0);
  /// The samples' size as retention counts it (SampleRetention::max_bytes).
  Result<std::uint64_t> SampleBytes();

  /// PRAGMA integrity_check; OK when it reports "ok".
  Status IntegrityCheck();

 private:
  HistoryStore(std::string path, sqlite3* db, HistoryOptions options);
  Status Exec(const char* sql);
  // Refuses a file that is not a usable fragscope history; `fresh`: empty, to be created.
  Status CheckOwnership(bool* fresh);
  Status SwitchToWal();
  Result<sqlite3_stmt*> Prepare(const char* sql);
  Status Error(const char* what) const;
  // The error for a database SQLite cannot read at all (damaged, or not SQLite).
  Status UnreadableError(const char* what) const;

  std::string path_;
  sqlite3* db_;
  HistoryOptions options_;
};

/// The default history path, by the XDG base directory convention: $XDG_STATE_HOME/fragscope/
/// history.sqlite, else $HOME/.local/state/fragscope/history.sqlite (relative values of either
/// are ignored, as the XDG spec says). InvalidArgument when neither gives a path.
Result<std::string> DefaultHistoryPath();

/// The compact encoding of a free-block histogram stored with each sample: for each non-empty
/// bucket, its index (1 byte) and its count and bytes (LEB128 varints). Decoding validates.
std::string EncodeHistogram(const agent::AgentSample& sample);
Status DecodeHistogram(std::string_view blob, agent::AgentSample* sample);

}  // namespace fragscope::sinks

#endif  // FRAGSCOPE_SINKS_HISTORY_HISTORY_STORE_H_
