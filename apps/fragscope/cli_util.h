// Pieces every fragscope subcommand shares: option validators, the progress line, error
// exits, and the read loop over a trace.
#ifndef FRAGSCOPE_APPS_FRAGSCOPE_CLI_UTIL_H_
#define FRAGSCOPE_APPS_FRAGSCOPE_CLI_UTIL_H_

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "analysis/trace_analyzer.h"
#include "common/units.h"
#include "fragscope/event.h"
#include "fragscope/status.h"
#include "fragscope/trace.h"
#include "model/alloc_conf.h"
#include "model/request_extractor.h"
#include "model/seed_requests.h"
#include "sinks/report/text_report.h"
#include "sources/snapshot/snapshot_reader.h"
#include "sources/snapshot/snapshot_requests.h"

namespace fragscope::cli {

/// An integer >= min (CLI11's own PositiveNumber prints its range as a 300-digit double).
CLI::Validator IntegerAtLeast(std::int64_t min);
/// A byte size as ParseSize reads it ("2MiB", "1.5GiB", "4096"), at least `min` bytes.
CLI::Validator ByteSize(std::uint64_t min);
/// A device capacity as ParseCapacity reads it (a bare number below 1 MiB is refused).
CLI::Validator CapacitySize();

/// The report options `analyze` and `replay` share.
struct ReportFlags {
  bool json = false;
  std::uint64_t every_events = 0;  // 0: one timeline row per step
  bool no_map = false;
  std::size_t timeline_rows = 60;
  std::string color = "auto";
  bool check_invariants = false;
};
/// Registers --json, --every, --no-map, --timeline-rows, --color and --check-invariants.
void AddReportOptions(CLI::App& sub, ReportFlags* flags);
/// The analysis options these flags set (timeline sampling, invariant checks, layout).
void ApplyReportFlags(const ReportFlags& flags, analysis::AnalysisOptions* options);
/// Text-report options from these flags (color, map, timeline rows).
sinks::TextOptions TextOptionsFor(const ReportFlags& flags);

/// An optional size option: nullopt when `text` is empty, else ParseSize's value; errors start
/// with `flag` ("--capacity: ...").
Result<std::optional<std::uint64_t>> OptionalSize(std::string_view flag, const std::string& text);
/// OptionalSize for a device capacity (ParseCapacity): a decimal unit's note goes to stderr as
/// "fragscope: note: <flag>: ...".
Result<std::optional<std::uint64_t>> OptionalCapacity(std::string_view flag,
                                                      const std::string& text);

/// --torch-version 1.13|2|newest: which PyTorch generation's allocator to simulate.
void AddTorchVersionOption(CLI::App& sub, std::string* value);
model::ConfigVersion TorchVersion(const std::string& value);

/// --addresses recorded|simulated: where a snapshot's segments go (replay, tune).
void AddAddressesOption(CLI::App& sub, std::string* value);
/// --addresses as given: "recorded" true, "simulated" false, unset (empty) nullopt.
std::optional<bool> RecordedAddressesFlag(const std::string& value);
/// Whether a replay puts segments at the recorded addresses: `wanted` (unset: yes for a
/// snapshot, no for a request trace, which records none). Yes for a request trace is an error
/// naming `path`.
Result<bool> UseRecordedAddresses(std::optional<bool> wanted, bool snapshot,
                                  const std::string& path);

/// For a command line CLI11 refused: "unknown command 'anlyze' (did you mean 'analyze'?) ..."
/// or "replay: unknown option '--capacty' (did you mean '--capacity'?) ...", naming where to
/// look; "" when the mistake is another (main prints CLI11's own message then).
std::string UsageHint(CLI::App& app, int argc, const char* const* argv);

/// Prints "fragscope: <message>" to stderr and returns kExitBadInput.
int BadInput(std::string_view message);
/// Prints "fragscope: <message>" to stderr and returns kExitFailure (output could not be made).
int Failure(std::string_view message);
/// --color=auto|always|never: auto colors only a terminal, and honours NO_COLOR and TERM=dumb.
bool UseColor(const std::string& mode);
/// Writes `report` to stdout; on failure says so on stderr and returns kExitFailure, else
/// kExitOk.
int WriteReport(const std::string& report);

/// Progress on stderr: only on a terminal, only after a second, at most four times a second.
class ProgressLine {
 public:
  ProgressLine() : start_(Clock::now()), last_(start_) {
    enabled_ = isatty(STDERR_FILENO) != 0;
    // Test hook: how long to wait before the first line (default 1000 ms).
    if (const char* delay = std::getenv("FRAGSCOPE_PROGRESS_DELAY_MS")) {
      delay_ = std::chrono::milliseconds(std::strtoll(delay, nullptr, 10));
    }
  }

  // Cheap enough to call every few thousand events.
  void Update(const TraceReader& reader, std::uint64_t events) {
    Show(reader.input_bytes_consumed(), reader.input_bytes_total(),
         fmt::format("{:.1f} M events", static_cast<double>(events) / 1e6));
  }
  // Bytes of a file read so far, for inputs read before their events (snapshots).
  void UpdateBytes(std::uint64_t done, std::uint64_t total, std::string_view what) {
    Show(done, total, what);
  }

  // Erases the line, if one was printed.
  void Clear() {
    if (!shown_) return;
    std::fputs("\r\x1b[K", stderr);
    std::fflush(stderr);
    shown_ = false;
  }

 private:
  void Show(std::uint64_t done, std::uint64_t total, std::string_view what) {
    if (!enabled_) return;
    const Clock::time_point now = Clock::now();
    if (now - start_ < delay_ || (shown_ && now - last_ < std::chrono::milliseconds(250))) return;
    last_ = now;
    shown_ = true;
    std::string line = "\rfragscope: ";
    if (total > 0) {
      line += fmt::format("{:3.0f}% of {}, ",
                          100.0 * static_cast<double>(done) / static_cast<double>(total),
                          FormatBytes(total));
    } else {
      line += fmt::format("{} read, ", FormatBytes(done));
    }
    line += what;
    line += "\x1b[K";
    std::fputs(line.c_str(), stderr);
    std::fflush(stderr);
  }

  using Clock = std::chrono::steady_clock;
  bool enabled_ = false;
  bool shown_ = false;
  std::chrono::milliseconds delay_{1000};
  Clock::time_point start_;
  Clock::time_point last_;
};

/// An input file: a fragscope trace or a PyTorch memory snapshot, told apart by content.
struct OpenedInput {
  std::unique_ptr<TraceReader> reader;
  sources::SnapshotReader* snapshot = nullptr;  // reader itself, when the input is a snapshot
};
/// Opens `path`; a snapshot is read and decoded here, with a progress line for big files.
/// Errors start with the path.
Result<OpenedInput> OpenInput(const std::string& path, const TraceLimits& limits = {});

/// Reads every event of a snapshot into `consume`. A consumer error does not stop the read: the
/// event is skipped and a note naming the trace entry goes to `notes` (the first 20, then a
/// count), so that an inconsistent file is analyzed as far as it can be.
Result<std::uint64_t> ReadSnapshotEvents(sources::SnapshotReader& reader,
                                         const std::function<Status(const Event&)>& consume,
                                         std::vector<std::string>* notes);

/// `--forecast` and its tuning options (docs/forecast.md), for the commands that analyze.
void AddForecastOptions(CLI::App& sub, bool* enabled, analysis::ForecastOptions* forecast);

/// Threads for a command whose analysis can run beside its input (--threads): 0 means two when
/// the machine has more than one hardware thread; more than two are two.
unsigned AnalysisThreads(unsigned requested);

/// Reads every event of `reader` into `analyzer`, as ReadAllEvents does; with two threads
/// (AnalysisThreads) the analysis runs on the second while this one parses (same result, same
/// messages: a consumer error still names its line and comes before a later reader error).
Result<std::uint64_t> AnalyzeAllEvents(TraceReader& reader, analysis::TraceAnalyzer& analyzer,
                                       unsigned threads);

/// Reads every event of `reader` into `consume`, with a progress line. On a reader error
/// returns its message ("file:line: ..."); on a consumer error, "file:line: " + its message.
/// `status_out` (optional) receives the consumer's Status (to tell OOMs from bad input).
/// `prefetch` (optional) sees each event a few events before `consume` does.
Result<std::uint64_t> ReadAllEvents(TraceReader& reader,
                                    const std::function<Status(const Event&)>& consume,
                                    Status* status_out = nullptr,
                                    const std::function<void(const Event&)>& prefetch = {});

/// The request events of an opened input (`path` names it in messages), held in memory, for
/// replays that run several times (tune, explain): a request trace's events as they are
/// (segment events refused: that is an allocator trace), or a snapshot's requests rebuilt by
/// SnapshotRequests for an allocator with `rules` (its recorded OOMs kept as the requests that
/// failed, except on the `drop_ooms` devices: replayed with unlimited memory, the request would
/// succeed there). `notes` receives what a snapshot's rebuild assumed and the entries it
/// skipped. Errors name the path.
Result<std::vector<Event>> ReadRequestEvents(OpenedInput& input, const std::string& path,
                                             const model::AllocatorRules& rules,
                                             std::vector<std::string>* notes,
                                             std::vector<std::int32_t> drop_ooms = {});

}  // namespace fragscope::cli

#endif  // FRAGSCOPE_APPS_FRAGSCOPE_CLI_UTIL_H_
