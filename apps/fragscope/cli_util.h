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
#include "common/terminal_text.h"
#include "common/units.h"
#include "fragscope/event.h"
#include "fragscope/status.h"
#include "fragscope/trace.h"
#include "model/alloc_conf.h"
#include "pipeline/input.h"
#include "pipeline/progress.h"
#include "pipeline/replay.h"
#include "sinks/report/text_report.h"
#include "sources/snapshot/snapshot_reader.h"

namespace fragscope::cli {

/// An integer >= min (CLI11's own PositiveNumber prints its range as a 300-digit double).
CLI::Validator IntegerAtLeast(std::int64_t min);
/// A byte size as ParseSize reads it ("2MiB", "1.5GiB", "4096"), at least `min` bytes.
CLI::Validator ByteSize(std::uint64_t min);
/// A fraction between 0 and 1 written as a ratio (0.3) or a percentage (30%); use with
/// ->transform(), which rewrites the text to the ratio.
CLI::Validator Fraction();
/// A device capacity as ParseCapacity reads it (a bare number below 1 MiB is refused).
CLI::Validator CapacitySize();

/// --max-memory, --max-events and --max-output: the input budgets (sources/budget.h, issue 24
/// item 1), stored in sources::ProcessBudget() when parsed. For commands that read inputs.
void AddBudgetOptions(CLI::App& sub);

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

/// --used-by-others larger than --capacity leaves the job no memory: refused, as the Python
/// side refuses it (fragscope.torch.VirtualGPU). Either unset: Ok.
Status CheckUsedByOthers(const std::optional<std::uint64_t>& capacity,
                         const std::optional<std::uint64_t>& used_by_others);

/// --torch-version 1.13|2|newest: which PyTorch generation's allocator to simulate.
void AddTorchVersionOption(CLI::App& sub, std::string* value);
model::ConfigVersion TorchVersion(const std::string& value);

/// --max-input-bytes SIZE: how much of a stream input (a pipe, FIFO, "-", /dev/stdin,
/// <(...), a device) is read before it is refused as endless (sources::SetStreamInputLimit;
/// default 256 MiB). For every command that reads an input.
void AddMaxInputBytesOption(CLI::App& sub);
/// --addresses recorded|simulated: where a snapshot's segments go (replay, tune).
void AddAddressesOption(CLI::App& sub, std::string* value);
/// --addresses as given: "recorded" true, "simulated" false, unset (empty) nullopt.
std::optional<bool> RecordedAddressesFlag(const std::string& value);
/// For a command line CLI11 refused: "unknown command 'anlyze' (did you mean 'analyze'?) ..."
/// or "replay: unknown option '--capacty' (did you mean '--capacity'?) ...", naming where to
/// look; "" when the mistake is another (main prints CLI11's own message then).
std::string UsageHint(CLI::App& app, int argc, const char* const* argv);

/// Prints "fragscope: <message>" to stderr, one line, and returns kExitBadInput. Messages quote
/// input (paths, values, tokens), so control characters in them, newline and tab included, are
/// escaped (common/terminal_text.h).
int BadInput(std::string_view message);
/// Prints "fragscope: <message>" to stderr and returns kExitFailure (output could not be made).
int Failure(std::string_view message);
/// For an output that could not be made: a refused output path (a symbolic link, not a regular
/// file: kInvalidArgument, common/safe_file.h) is bad usage, kExitBadInput; anything else (a
/// full disk, no permission) is kExitFailure. Prints "fragscope: <message>".
int OutputFailure(const Status& status);
/// --color=auto|always|never: auto colors only a terminal, and honours NO_COLOR and TERM=dumb.
bool UseColor(const std::string& mode);

/// What a report on stdout holds, for the terminal-safety pass every output goes through
/// (common/terminal_text.h; docs/user-guide.md, "Terminal safety").
enum class ReportForm {
  kText,         // control characters escaped as \xNN, newline and tab kept
  kColoredText,  // kText, but the SGR color sequences the renderer wrote are kept
  kJson,         // DEL and C1 as \u007f..\u009f: still JSON, the same strings when parsed
};
/// The form of a text report colored or not.
inline ReportForm TextForm(bool color) {
  return color ? ReportForm::kColoredText : ReportForm::kText;
}
/// Writes `report` to stdout with its control characters escaped as `form` says; on failure
/// says so on stderr and returns kExitFailure, else kExitOk.
int WriteReport(const std::string& report, ReportForm form);
/// Writes `text` to `stream` (stdout or stderr: notes, progress messages, log lines), with
/// control characters escaped and newline and tab kept (TerminalSafeLines). Every message that
/// may hold an input-derived string is printed through here or BadInput/Failure/WriteReport.
void PrintSafe(std::FILE* stream, std::string_view text);

// The pipeline's readers and snapshot helpers (pipeline/input.h, replay.h), under the names the
// commands use.
using pipeline::AnalysisThreads;
using pipeline::AnalyzeAllEvents;
using pipeline::AnalyzeRecordedRun;
using pipeline::AnalyzeSnapshotEvents;
using pipeline::CapacitiesFromRecordedOoms;
using pipeline::OpenedInput;
using pipeline::OpenInput;
using pipeline::ProgressLine;
using pipeline::ReadAllEvents;
using pipeline::ReadRecordedSettings;
using pipeline::ReadRequestEvents;
using pipeline::ReadSnapshotEvents;
using pipeline::RecordedCapacities;
using pipeline::RecordedSettings;
using pipeline::UseRecordedAddresses;

/// `--forecast` and its tuning options (docs/forecast.md), for the commands that analyze.
void AddForecastOptions(CLI::App& sub, bool* enabled, analysis::ForecastOptions* forecast);

}  // namespace fragscope::cli

#endif  // FRAGSCOPE_APPS_FRAGSCOPE_CLI_UTIL_H_
