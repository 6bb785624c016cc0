#include "cli_util.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <string_view>

#include <fmt/ranges.h>

#include "command.h"
#include "common/did_you_mean.h"
#include "sources/budget.h"
#include "sources/trace/input_stream.h"

namespace fragscope::cli {

// An integer >= min (CLI11's own PositiveNumber prints its range as a 300-digit double).
CLI::Validator IntegerAtLeast(std::int64_t min) {
  return CLI::Validator(
      [min](std::string& text) -> std::string {
        std::int64_t value = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, value);
        if (ec != std::errc() || ptr != end) return fmt::format("'{}' is not an integer", text);
        if (value < min) return fmt::format("{} is less than {}", value, min);
        return "";
      },
      fmt::format("INT>={}", min));
}

// A byte size as ParseSize reads it ("2MiB", "1.5GiB", "4096"), at least `min` bytes.
CLI::Validator ByteSize(std::uint64_t min) {
  return CLI::Validator(
      [min](std::string& text) -> std::string {
        Result<std::uint64_t> size = ParseSize(text);
        if (!size.ok()) return size.status().message();
        if (*size < min) return fmt::format("'{}' is less than {} bytes", text, min);
        return "";
      },
      "");
}

// A fraction between 0 and 1, written as a ratio ("0.3") or a percentage ("30%"); the text is
// rewritten to the ratio. "30" is refused with both ways to write what was probably meant.
CLI::Validator Fraction() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        std::string_view number = text;
        const bool percent = !number.empty() && number.back() == '%';
        if (percent) number.remove_suffix(1);
        double value = 0;
        const char* end = number.data() + number.size();
        const auto [ptr, ec] = std::from_chars(number.data(), end, value);
        if (number.empty() || ec != std::errc() || ptr != end || !std::isfinite(value)) {
          return fmt::format("'{}' is not a fraction: write a ratio (0.3) or a percentage (30%)",
                             text);
        }
        if (percent) value /= 100;
        if (value < 0 || value > 1) {
          return percent ? fmt::format("{} is not between 0% and 100%", text)
                         : fmt::format("{} is not between 0 and 1: for {} percent write {}% or {}",
                                       text, text, text, value / 100);
        }
        text = fmt::format("{}", value);
        return "";
      },
      "");
}

void AddMaxInputBytesOption(CLI::App& sub) {
  sub.add_option_function<std::string>(
         "--max-input-bytes",
         [](const std::string& text) {
           // The validator has parsed it already.
           if (Result<std::uint64_t> bytes = ParseSize(text); bytes.ok()) {
             sources::SetStreamInputLimit(*bytes);
           }
         },
         fmt::format("Read at most this much of a pipe, FIFO or standard input before refusing "
                     "it as endless (default {}; regular files have no such limit)",
                     FormatBytes(sources::kDefaultStreamInputBytes)))
      ->type_name("SIZE")
      ->check(ByteSize(1));
}

CLI::Validator CapacitySize() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        Result<ParsedCapacity> size = ParseCapacity(text);
        return size.ok() ? "" : size.status().message();
      },
      "");
}

void AddBudgetOptions(CLI::App& sub) {
  // A SIZE option that sets one field of the process's budget.
  const auto add_size = [&sub](const char* name, std::uint64_t* field, const char* help) {
    sub.add_option_function<std::string>(
           name,
           [field](const std::string& text) { *field = *ParseSize(text); },  // ByteSize checked it
           help)
        ->type_name("SIZE")
        ->check(ByteSize(1))
        ->group("Input budgets");
  };
  sources::InputBudget& budget = sources::ProcessBudget();
  add_size("--max-memory", &budget.max_memory_bytes,
           "Memory budget for decoding an input (default: 64 x its size, at least 1GiB, at most "
           "half of the memory this process may use: physical memory, its cgroup's limit, "
           "RLIMIT_AS)");
  sub.add_option_function<std::uint64_t>(
         "--max-events", [&budget](std::uint64_t n) { budget.max_events = n; },
         "Segments, blocks and trace entries a snapshot may hold, counted each time one is "
         "reached (default: one per 4 decoded input bytes, at least 1000000); events of a "
         "trace (default: 64 per byte of the file, at least 1000000)")
      ->type_name("N")
      ->check(IntegerAtLeast(1))
      ->group("Input budgets");
  add_size("--max-decoded", &budget.max_decoded_bytes,
           "Bytes a snapshot may decompress to (default: 1024 x its size, at least 4GiB, at most "
           "64GiB)");
  add_size("--max-output", &budget.max_output_bytes,
           "Bytes `convert --to json` or `--to perfetto` may write (default: 1024 x the "
           "decoded input, or the input as stored for perfetto; at least 256MiB)");
}

void AddReportOptions(CLI::App& sub, ReportFlags* flags) {
  sub.add_flag("--json", flags->json, "Print JSON (docs/json-schema.md) instead of text");
  sub.add_option("--every", flags->every_events,
                 "One timeline row per N events instead of one per training step")
      ->type_name("N")
      ->check(IntegerAtLeast(1));
  sub.add_flag("--no-map", flags->no_map, "Leave out the memory map (JSON: \"layout\")");
  sub.add_option("--timeline-rows", flags->timeline_rows,
                 "Timeline rows shown in text (0 = all; --json has all)")
      ->type_name("N")
      ->check(IntegerAtLeast(0))
      ->capture_default_str();
  sub.add_option("--color", flags->color, "Color the text: auto = when stdout is a terminal")
      ->check(CLI::IsMember({"auto", "always", "never"}))
      ->capture_default_str();
  sub.add_flag("--check-invariants", flags->check_invariants,
               "Check the model's invariants after every event (slow)");
}

void ApplyReportFlags(const ReportFlags& flags, analysis::AnalysisOptions* options) {
  options->every_events = flags.every_events;
  options->check_invariants = flags.check_invariants;
  options->keep_layout = !flags.no_map;
}

sinks::TextOptions TextOptionsFor(const ReportFlags& flags) {
  sinks::TextOptions text;
  text.color = UseColor(flags.color);
  text.show_map = !flags.no_map;
  text.max_timeline_rows = flags.timeline_rows == 0 ? SIZE_MAX : flags.timeline_rows;
  return text;
}

void AddTorchVersionOption(CLI::App& sub, std::string* value) {
  sub.add_option("--torch-version", *value,
                 "Allocator behaviour of: " + model::ConfigVersionChoices())
      ->check(CLI::IsMember({"1.13", "2", "newest"}))
      ->capture_default_str();
}

void AddAddressesOption(CLI::App& sub, std::string* value) {
  sub.add_option("--addresses", *value,
                 "Where a snapshot's segments go: at the addresses the real driver gave them "
                 "(recorded, the default for a snapshot) or by the simulator's own rule "
                 "(simulated, the only choice for a request trace)")
      ->type_name("WHERE")
      ->check(CLI::IsMember({"simulated", "recorded"}));
}

std::optional<bool> RecordedAddressesFlag(const std::string& value) {
  if (value.empty()) return std::nullopt;
  return value == "recorded";
}

model::ConfigVersion TorchVersion(const std::string& value) {
  if (value == "1.13") return model::ConfigVersion::kV1_13;
  if (value == "2") return model::ConfigVersion::kV2;
  return model::ConfigVersion::kNewest;
}

std::string UsageHint(CLI::App& app, int argc, const char* const* argv) {
  if (argc < 2) return "";
  const std::string first = argv[1];
  if (first.empty() || first.front() == '-') return "";
  std::vector<std::string> commands;
  CLI::App* command = nullptr;
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    commands.push_back(sub->get_name());
    if (sub->get_name() == first) command = sub;
  }
  if (command == nullptr) {
    return fmt::format("unknown command '{}'{}; the commands are {} (`fragscope --help`)", first,
                       DidYouMean(first, commands), fmt::join(commands, ", "));
  }
  // Nested commands (`history record`): the options are the innermost command's (and its
  // parents').
  std::string path = first;
  std::vector<std::string> names;
  auto add_names = [&names](const CLI::App* c) {
    for (const CLI::Option* option : c->get_options()) {
      for (const std::string& name : option->get_lnames()) names.push_back("--" + name);
    }
  };
  add_names(command);
  int i = 2;
  for (; i < argc; ++i) {
    CLI::App* nested = nullptr;
    for (CLI::App* sub : command->get_subcommands([](CLI::App*) { return true; })) {
      if (sub->get_name() == argv[i]) nested = sub;
    }
    if (nested == nullptr) break;
    command = nested;
    path += std::string(" ") + argv[i];
    add_names(command);
  }
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 3 || !arg.starts_with("--")) continue;
    arg = arg.substr(0, arg.find('='));
    if (std::find(names.begin(), names.end(), arg) != names.end()) continue;
    return fmt::format("{}: unknown option '{}'{} (`fragscope {} --help` lists them)", path, arg,
                       DidYouMean(arg, names), path);
  }
  return "";
}

namespace {

// An error is one line: a newline or tab inside it (from a quoted path, value or token) is
// escaped as well, so input cannot forge a line of its own.
void PrintError(std::string_view message) {
  std::string line = "fragscope: ";
  AppendTerminalSafe(message, TerminalEscape::kField, &line);
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace

int BadInput(std::string_view message) {
  PrintError(message);
  return kExitBadInput;
}

int Failure(std::string_view message) {
  PrintError(message);
  return kExitFailure;
}

void PrintSafe(std::FILE* stream, std::string_view text) {
  const std::string safe = TerminalSafeLines(text);
  std::fwrite(safe.data(), 1, safe.size(), stream);
  std::fflush(stream);
}

int OutputFailure(const Status& status) {
  return status.code() == StatusCode::kInvalidArgument ? BadInput(status.message())
                                                       : Failure(status.message());
}

bool UseColor(const std::string& mode) {
  if (mode == "always") return true;
  if (mode == "never") return false;
  const char* term = std::getenv("TERM");
  return isatty(STDOUT_FILENO) != 0 && std::getenv("NO_COLOR") == nullptr &&
         !(term != nullptr && std::string_view(term) == "dumb");
}

int WriteReport(const std::string& report, ReportForm form) {
  std::string safe;
  safe.reserve(report.size());
  AppendTerminalSafe(report,
                     form == ReportForm::kJson          ? TerminalEscape::kJson
                     : form == ReportForm::kColoredText ? TerminalEscape::kColoredLines
                                                        : TerminalEscape::kLines,
                     &safe);
  if (std::fwrite(safe.data(), 1, safe.size(), stdout) != safe.size() || std::fflush(stdout) != 0) {
    std::fputs("fragscope: cannot write the report to stdout\n", stderr);
    return kExitFailure;
  }
  return kExitOk;
}

void AddForecastOptions(CLI::App& sub, bool* enabled, analysis::ForecastOptions* f) {
  sub.add_flag("--forecast", *enabled, "Forecast the risk of an OOM per step (docs/forecast.md)");
  sub.add_option("--forecast-every", f->every, "Steps per forecaster sample (1 = every step)")
      ->type_name("N")
      ->check(IntegerAtLeast(1))
      ->capture_default_str();
  sub.add_option("--forecast-fragmentation", f->fragmentation_threshold,
                 "Fragmentation ratio above which a device is at least 'watch' (default: none; "
                 "the ratio alone is information: a healthy job caches most of what it reserves)")
      ->type_name("R")
      ->transform(Fraction());
  sub.add_option("--forecast-warning-steps", f->warning_steps,
                 "Steps-to-OOM at or below which the level is 'warning'")
      ->type_name("N")
      ->check(CLI::Range(0.0, 1e12))
      ->capture_default_str();
  sub.add_option("--forecast-critical-steps", f->critical_steps,
                 "Steps-to-OOM at or below which the level is 'critical'")
      ->type_name("N")
      ->check(CLI::Range(0.0, 1e12))
      ->capture_default_str();
  sub.add_option("--forecast-watch-steps", f->watch_steps,
                 "Steps-to-OOM at or below which the level is 'watch'")
      ->type_name("N")
      ->check(CLI::Range(0.0, 1e12))
      ->capture_default_str();
  sub.add_option("--forecast-half-life", f->half_life_steps,
                 "Steps after which a sample's weight in the trends halves")
      ->type_name("N")
      ->check(CLI::Range(1.0, 1e9))
      ->capture_default_str();
  sub.add_option("--forecast-allowance", f->fragmentation_allowance,
                 "Device bytes a step needs per byte of peak allocated memory")
      ->type_name("X")
      ->check(CLI::Range(1.0, 100.0))
      ->capture_default_str();
  sub.add_option("--forecast-risk-horizons", f->risk_options.horizons,
                 "Steps ahead for which P(OOM) is reported (docs/forecast.md, \"OOM risk\")")
      ->type_name("N,N,...")
      ->delimiter(',')
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{10'000'000}))
      ->capture_default_str();
  // Each --forecast-* option tunes the forecaster, so it needs --forecast.
  for (CLI::Option* option : sub.get_options(
           [](const CLI::Option* o) { return o->get_name().rfind("--forecast-", 0) == 0; })) {
    option->needs("--forecast");
  }
}

Result<std::optional<std::uint64_t>> OptionalSize(std::string_view flag, const std::string& text) {
  if (text.empty()) return std::optional<std::uint64_t>();
  Result<std::uint64_t> size = ParseSize(text);
  if (!size.ok()) return size.status().WithPrefix(std::string(flag));
  return std::optional<std::uint64_t>(*size);
}

Result<std::optional<std::uint64_t>> OptionalCapacity(std::string_view flag,
                                                      const std::string& text) {
  if (text.empty()) return std::optional<std::uint64_t>();
  Result<ParsedCapacity> size = ParseCapacity(text);
  if (!size.ok()) return size.status().WithPrefix(std::string(flag));
  if (!size->note.empty()) {
    PrintSafe(stderr, fmt::format("fragscope: note: {}: {}\n", flag, size->note));
  }
  return std::optional<std::uint64_t>(size->bytes);
}

Status CheckUsedByOthers(const std::optional<std::uint64_t>& capacity,
                         const std::optional<std::uint64_t>& used_by_others) {
  if (!capacity || !used_by_others || *used_by_others <= *capacity) return Status::Ok();
  return Status::InvalidArgument(fmt::format(
      "--used-by-others: {} ({} bytes) is more than --capacity, {} ({} bytes): other processes "
      "cannot hold more than the device has",
      FormatBytes(*used_by_others), *used_by_others, FormatBytes(*capacity), *capacity));
}

}  // namespace fragscope::cli
