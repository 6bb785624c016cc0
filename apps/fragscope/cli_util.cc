#include "cli_util.h"

#include <algorithm>
#include <array>
#include <charconv>

#include "analysis/analyzer_thread.h"
#include "command.h"

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
  sub.add_option("--torch-version", *value, "Allocator behaviour of: 1.13, 2 (2.0-2.8), newest")
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

Result<bool> UseRecordedAddresses(std::optional<bool> wanted, bool snapshot,
                                  const std::string& path) {
  const bool recorded = wanted.value_or(snapshot);
  if (recorded && !snapshot) {
    return Status::InvalidArgument(
        fmt::format("{}: --addresses recorded needs a PyTorch memory snapshot; a request trace "
                    "records no segment addresses",
                    path));
  }
  return recorded;
}

model::ConfigVersion TorchVersion(const std::string& value) {
  if (value == "1.13") return model::ConfigVersion::kV1_13;
  if (value == "2") return model::ConfigVersion::kV2;
  return model::ConfigVersion::kNewest;
}

int BadInput(std::string_view message) {
  std::fputs(fmt::format("fragscope: {}\n", message).c_str(), stderr);
  return kExitBadInput;
}

int Failure(std::string_view message) {
  std::fputs(fmt::format("fragscope: {}\n", message).c_str(), stderr);
  return kExitFailure;
}

bool UseColor(const std::string& mode) {
  if (mode == "always") return true;
  if (mode == "never") return false;
  const char* term = std::getenv("TERM");
  return isatty(STDOUT_FILENO) != 0 && std::getenv("NO_COLOR") == nullptr &&
         !(term != nullptr && std::string_view(term) == "dumb");
}

int WriteReport(const std::string& report) {
  if (std::fwrite(report.data(), 1, report.size(), stdout) != report.size() ||
      std::fflush(stdout) != 0) {
    std::fputs("fragscope: cannot write the report to stdout\n", stderr);
    return kExitFailure;
  }
  return kExitOk;
}

Result<OpenedInput> OpenInput(const std::string& path, const TraceLimits& limits) {
  Result<sources::InputKind> kind = sources::DetectInputKind(path);
  if (!kind.ok()) return kind.status();
  OpenedInput opened;
  if (*kind == sources::InputKind::kTrace) {
    Result<std::unique_ptr<TraceReader>> reader = TraceReader::Open(path, limits);
    if (!reader.ok()) return reader.status();
    opened.reader = std::move(*reader);
    return opened;
  }
  ProgressLine progress;
  sources::SnapshotReadOptions options;
  options.progress = [&](std::uint64_t done, std::uint64_t total) {
    progress.UpdateBytes(done, total, "reading the snapshot");
  };
  Result<std::unique_ptr<sources::SnapshotReader>> snapshot =
      sources::SnapshotReader::Open(path, options);
  progress.Clear();
  if (!snapshot.ok()) return snapshot.status();
  opened.snapshot = snapshot->get();
  opened.reader = std::move(*snapshot);
  return opened;
}

Result<std::uint64_t> ReadSnapshotEvents(sources::SnapshotReader& reader,
                                         const std::function<Status(const Event&)>& consume,
                                         std::vector<std::string>* notes) {
  constexpr std::size_t kMaxNotes = 20;
  std::uint64_t events = 0, skipped = 0;
  ProgressLine progress;
  Event e;
  while (true) {
    Result<bool> next = reader.Next(&e);
    if (!next.ok()) {
      progress.Clear();
      return next.status().WithPrefix(reader.Where());
    }
    if (!*next) break;
    ++events;
    if (Status st = consume(e); !st.ok()) {
      if (++skipped <= kMaxNotes) {
        notes->push_back(fmt::format("{}: {}; event skipped", reader.Where(), st.message()));
      }
    }
    if ((events & 0xfff) == 0) progress.Update(reader, events);
  }
  progress.Clear();
  if (skipped > kMaxNotes) {
    notes->push_back(fmt::format("... {} events skipped in all", skipped));
  }
  return events;
}

namespace {

// What "file:line" messages start with: reader.Where() without its ":line" (after a Next).
std::string TraceName(const TraceReader& reader) {
  const std::string where = reader.Where();
  const std::string suffix = ":" + std::to_string(reader.line_number());
  return where.size() >= suffix.size() &&
                 where.compare(where.size() - suffix.size(), suffix.size(), suffix) == 0
             ? where.substr(0, where.size() - suffix.size())
             : where;
}

}  // namespace

Result<std::uint64_t> AnalyzeAllEvents(TraceReader& reader, analysis::TraceAnalyzer& analyzer,
                                       unsigned threads) {
  if (AnalysisThreads(threads) < 2) {
    return ReadAllEvents(
        reader, [&](const Event& e) { return analyzer.Consume(e); }, nullptr,
        [&](const Event& e) { analyzer.Prefetch(e); });
  }
  // The name is set before the first event is sent, and so seen by the analyzing thread.
  std::string name;
  analysis::AnalyzerThread thread(analyzer, [&](const Event& e, std::uint64_t line) {
    Status s = analyzer.Consume(e);
    if (s.ok()) return s;
    return Status(s.code(), fmt::format("{}:{}: {}", name, line, s.message()));
  });
  ProgressLine progress;
  std::uint64_t events = 0;
  Event e;
  while (!thread.failed()) {
    Result<bool> next = reader.Next(&e);
    if (!next.ok()) {
      // An analysis error is on an earlier line than the reader's: it comes first.
      Status analyzed = thread.Finish();
      progress.Clear();
      return analyzed.ok() ? next.status() : analyzed;
    }
    if (!*next) break;
    if (name.empty()) name = TraceName(reader);
    thread.Send(e, std::nullopt, reader.line_number());
    if ((++events & 0xfff) == 0) progress.Update(reader, events);
  }
  Status analyzed = thread.Finish();
  progress.Clear();
  if (!analyzed.ok()) return analyzed;
  return events;
}

void AddForecastOptions(CLI::App& sub, bool* enabled, analysis::ForecastOptions* f) {
  sub.add_flag("--forecast", *enabled, "Forecast the risk of an OOM per step (docs/forecast.md)");
  sub.add_option("--forecast-every", f->every, "Steps per forecaster sample (1 = every step)")
      ->type_name("N")
      ->check(IntegerAtLeast(1))
      ->capture_default_str();
  sub.add_option("--forecast-fragmentation", f->fragmentation_threshold,
                 "Fragmentation ratio above which a device is at least 'watch'")
      ->type_name("R")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
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

unsigned AnalysisThreads(unsigned requested) {
  if (requested == 0) return std::thread::hardware_concurrency() >= 2 ? 2 : 1;
  return std::min(requested, 2u);
}

Result<std::uint64_t> ReadAllEvents(TraceReader& reader,
                                    const std::function<Status(const Event&)>& consume,
                                    Status* status_out,
                                    const std::function<void(const Event&)>& prefetch) {
  // Events are read kAhead ahead of consumption so that `prefetch` can warm the caches for
  // them; each keeps its line number so that messages still name the right line.
  constexpr std::size_t kAhead = 8;
  std::array<Event, kAhead> ring;
  std::array<std::uint64_t, kAhead> lines{};
  std::size_t head = 0, count = 0;
  bool eof = false;
  Status read_error;
  std::string name;  // Where() is "name:line"
  ProgressLine progress;
  std::uint64_t events = 0;
  while (true) {
    while (!eof && read_error.ok() && count < kAhead) {
      const std::size_t slot = (head + count) % kAhead;
      Result<bool> next = reader.Next(&ring[slot]);
      if (!next.ok()) {
        read_error = next.status();
        break;
      }
      if (!*next) {
        eof = true;
        break;
      }
      lines[slot] = reader.line_number();
      if (name.empty()) name = TraceName(reader);
      if (prefetch) prefetch(ring[slot]);
      ++count;
    }
    if (count == 0) break;
    if (Status s = consume(ring[head]); !s.ok()) {
      progress.Clear();
      if (status_out != nullptr) *status_out = s;
      return Status(s.code(), fmt::format("{}:{}: {}", name, lines[head], s.message()));
    }
    head = (head + 1) % kAhead;
    --count;
    if ((++events & 0xfff) == 0) progress.Update(reader, events);
  }
  progress.Clear();
  if (!read_error.ok()) return read_error;
  return events;
}

Result<std::optional<std::uint64_t>> OptionalSize(std::string_view flag, const std::string& text) {
  if (text.empty()) return std::optional<std::uint64_t>();
  Result<std::uint64_t> size = ParseSize(text);
  if (!size.ok()) return size.status().WithPrefix(std::string(flag));
  return std::optional<std::uint64_t>(*size);
}

Result<std::vector<Event>> ReadRequestEvents(OpenedInput& input, const std::string& path,
                                             const model::AllocatorRules& rules,
                                             std::vector<std::string>* notes,
                                             std::vector<std::int32_t> drop_ooms) {
  std::vector<Event> events;
  if (input.snapshot != nullptr) {
    sources::SnapshotRequests requests(*input.snapshot, rules, [&](const Event& e) -> Status {
      events.push_back(e);
      return Status::Ok();
    });
    requests.DropOoms(std::move(drop_ooms));
    Result<std::uint64_t> read = ReadSnapshotEvents(
        *input.snapshot, [&](const Event& e) { return requests.Consume(e); }, notes);
    if (!read.ok()) return read.status();
    requests.AddNotes(notes);
    return events;
  }
  TraceReader& reader = *input.reader;
  if (reader.header().kind == TraceKind::kAllocator) {
    return Status::InvalidArgument(fmt::format(
        "{}: this is an allocator trace; a replay takes a request trace (`fragscope convert {} "
        "-o requests.jsonl --to requests` makes one) or a snapshot",
        path, path));
  }
  Result<std::uint64_t> read = ReadAllEvents(reader, [&](const Event& e) -> Status {
    if (e.action == Action::kSegmentAlloc || e.action == Action::kSegmentFree ||
        e.action == Action::kSegmentMap || e.action == Action::kSegmentUnmap) {
      return Status::Corruption(fmt::format("{} in a request trace", ActionName(e.action)));
    }
    events.push_back(e);
    return Status::Ok();
  });
  if (!read.ok()) return read.status();
  return events;
}

}  // namespace fragscope::cli
