#include "history_command.h"

#include <algorithm>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "analysis/run_summary.h"
#include "analyze_command.h"
#include "cli_util.h"
#include "common/did_you_mean.h"
#include "common/units.h"
#include "replay_command.h"
#include "sinks/history/history_store.h"

namespace fragscope::cli {
namespace {

using analysis::BaselineComparison;
using analysis::RunSummary;
using sinks::HistoryStore;

struct HistoryFlags {
  std::string history;  // --history PATH; empty: the XDG default
  std::string input;
  std::string run;
  std::string arch;
  std::int32_t device = -1;
  std::size_t last = 5;
  std::size_t limit = 0;
  bool replace = false;
  bool json = false;
  std::string capacity;        // a size: a request trace is replayed on it
  std::string used_by_others;  // a size, with --capacity
};

constexpr std::string_view kHistoryDescription =
    "Record runs in the history database and compare a run with earlier runs of its model";

constexpr std::string_view kHistoryFooter =
    R"(The history is a SQLite database of run summaries: per run, its peaks, its request-size
profile, the fragmentation ratio at fixed steps (10, 20, 50, 100, 200, 500, 1000, ...) and how
fast fragmentation grows (a least-squares slope per 1000 steps). Runs are grouped by a model
architecture label; the last N runs of an architecture are the baseline a new run is compared
with, e.g. "fragmenting 2.3× faster than the last 5 runs of gpt-1.3b".

Where: --history PATH, else $XDG_STATE_HOME/fragscope/history.sqlite, else
~/.local/state/fragscope/history.sqlite (the directory is created with mode 0700). A file that
is not a fragscope history, or is damaged, is refused and left untouched, and so is a symbolic
link at PATH (or at PATH-wal, -shm, -journal): the history is opened only as a regular file.

Examples:
  fragscope history record run1.jsonl.gz --run gpt-1.3b-2026-11-20 --arch gpt-1.3b
  fragscope history compare today.jsonl.gz --arch gpt-1.3b --last 5
  fragscope history list --arch gpt-1.3b
  fragscope history show gpt-1.3b-2026-11-20 --json
  fragscope history forget gpt-1.3b-2026-11-20
  fragscope history list --history /shared/fragscope/history.sqlite

Docs: docs/history.md.)";

constexpr std::string_view kRecordFooter =
    R"(Analyzes INPUT as `fragscope analyze` does (an allocator trace or a PyTorch memory snapshot;
a request trace is replayed through the simulator first, as `check` does: on --capacity SIZE,
else the header's capacity, else an unlimited device), summarizes one device (--device,
else the one with the highest peak reserved) and stores the summary under --run, grouped by
--arch. Both default to the trace's "run" and "architecture" labels. Then prints how the run
compares with the earlier runs of that architecture.

Examples:
  fragscope history record run1.jsonl.gz --run nightly-1120 --arch gpt-1.3b
  fragscope history record snapshot.pickle --run oom-repro --arch llama-7b --device 1
  fragscope history record run1.jsonl.gz --run nightly-1120 --arch gpt-1.3b --replace

Exit status: 0 recorded; 2 bad input (unreadable trace, damaged or foreign history file, a
run name already recorded without --replace).)";

constexpr std::string_view kCompareFooter =
    R"(Analyzes INPUT and compares it with the last N recorded runs of --arch, without recording
it: the growth of fragmentation per 1000 steps, the fragmentation ratio at the step marks both
reached, and the peaks. A run with the same --run name is left out of its own baseline.

Examples:
  fragscope history compare today.jsonl.gz --arch gpt-1.3b
  fragscope history compare today.jsonl.gz --arch gpt-1.3b --last 10 --json

Exit status: 0 (also when there is no baseline yet: it says so); 2 bad input.)";

std::string FormatTime(std::int64_t unix_s) {
  std::time_t t = static_cast<std::time_t>(unix_s);
  std::tm tm{};
  if (gmtime_r(&t, &tm) == nullptr) return std::to_string(unix_s);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%SZ", &tm);
  return buf;
}

std::string FormatGrowth(const std::optional<double>& g) {
  return g ? fmt::format("{:+.4f}", *g) : std::string("-");
}

nlohmann::json HistoryToJson(const RunSummary& r) {
  nlohmann::json marks = nlohmann::json::array();
  for (const analysis::FragmentationMark& m : r.marks) {
    marks.push_back({{"step", m.step}, {"fragmentation_ratio", m.fragmentation_ratio}});
  }
  nlohmann::json j = {
      {"run", r.run},
      {"architecture", r.architecture},
      {"recorded_unix_s", r.recorded_unix_s},
      {"recorded", FormatTime(r.recorded_unix_s)},
      {"source", r.source},
      {"device", r.device},
      {"steps", r.steps},
      {"peak_allocated_bytes", r.peak_allocated_bytes},
      {"peak_reserved_bytes", r.peak_reserved_bytes},
      {"requests",
       {{"count", r.request_count},
        {"p50_bytes", r.request_p50_bytes},
        {"p90_bytes", r.request_p90_bytes},
        {"p99_bytes", r.request_p99_bytes},
        {"max_bytes", r.request_max_bytes}}},
      {"fragmentation_marks", marks},
      {"fragmentation_growth_per_1000_steps", nullptr},
      {"num_ooms", r.num_ooms},
  };
  if (r.fragmentation_growth_per_1000_steps) {
    j["fragmentation_growth_per_1000_steps"] = *r.fragmentation_growth_per_1000_steps;
  }
  return j;
}

nlohmann::json HistoryToJson(const BaselineComparison& c) {
  auto opt = [](const std::optional<double>& v) -> nlohmann::json {
    return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
  };
  nlohmann::json marks = nlohmann::json::array();
  for (const analysis::MarkComparison& m : c.marks) {
    marks.push_back({{"step", m.step},
                     {"current", m.current},
                     {"baseline", m.baseline},
                     {"baseline_runs", m.baseline_runs}});
  }
  return {{"architecture", c.architecture},
          {"baseline_runs", c.runs},
          {"has_baseline", c.has_baseline},
          {"sentence", c.sentence},
          {"growth_ratio", opt(c.growth_ratio)},
          {"current_growth_per_1000_steps", opt(c.current_growth)},
          {"baseline_growth_per_1000_steps", opt(c.baseline_growth)},
          {"mark_ratio", opt(c.mark_ratio)},
          {"peak_allocated_ratio", opt(c.peak_allocated_ratio)},
          {"peak_reserved_ratio", opt(c.peak_reserved_ratio)},
          {"marks", marks}};
}

std::string ComparisonText(const BaselineComparison& c) {
  std::string out = TerminalSafe(c.sentence) + "\n";
  auto ratio = [](const std::optional<double>& v) {
    return v ? fmt::format("{:.2f}×", *v) : std::string("-");
  };
  if (c.runs == 0) return out;
  out += fmt::format("  baseline: {} earlier {} of {}\n", c.runs, c.runs == 1 ? "run" : "runs",
                     TerminalSafe(c.architecture));
  out += fmt::format("  fragmentation growth per 1000 steps: {} now, {} baseline ({})\n",
                     FormatGrowth(c.current_growth), FormatGrowth(c.baseline_growth),
                     ratio(c.growth_ratio));
  out += fmt::format("  peak allocated: {} of baseline; peak reserved: {} of baseline\n",
                     ratio(c.peak_allocated_ratio), ratio(c.peak_reserved_ratio));
  if (!c.marks.empty()) {
    out += "  fragmentation ratio at common steps:\n";
    out += fmt::format("    {:>8}  {:>7}  {:>8}  {:>4}\n", "step", "now", "baseline", "runs");
    for (const analysis::MarkComparison& m : c.marks) {
      out += fmt::format("    {:>8}  {:>7.3f}  {:>8.3f}  {:>4}\n", m.step, m.current, m.baseline,
                         m.baseline_runs);
    }
  }
  return out;
}

std::string SummaryText(const RunSummary& r) {
  // Run names, labels and paths come from the input and the command line: escaped as fields.
  std::string out = fmt::format("run {} ({})\n", TerminalSafe(r.run), TerminalSafe(r.architecture));
  out += fmt::format("  recorded          {}\n", FormatTime(r.recorded_unix_s));
  out += fmt::format("  source            {} (device {})\n", TerminalSafe(r.source), r.device);
  out += fmt::format("  steps             {}\n", r.steps);
  out += fmt::format("  peak allocated    {}\n", FormatBytes(r.peak_allocated_bytes));
  out += fmt::format("  peak reserved     {}\n", FormatBytes(r.peak_reserved_bytes));
  out += fmt::format("  requests          {}: p50 {}, p90 {}, p99 {}, max {}\n", r.request_count,
                     FormatBytes(r.request_p50_bytes), FormatBytes(r.request_p90_bytes),
                     FormatBytes(r.request_p99_bytes), FormatBytes(r.request_max_bytes));
  out += fmt::format("  OOMs              {}\n", r.num_ooms);
  out += fmt::format("  growth            {} fragmentation ratio per 1000 steps\n",
                     FormatGrowth(r.fragmentation_growth_per_1000_steps));
  if (r.marks.empty()) {
    out += "  step marks        none (fewer than 10 steps, or no step markers)\n";
  } else {
    out += "  fragmentation ratio at step marks:\n";
    for (const analysis::FragmentationMark& m : r.marks) {
      out += fmt::format("    step {:>8}  {:.3f}\n", m.step, m.fragmentation_ratio);
    }
  }
  return out;
}

// Opens the history. `create`: for writers; readers of a missing file get NotFound.
Result<std::unique_ptr<HistoryStore>> OpenHistory(const HistoryFlags& flags, bool create) {
  Result<std::string> path = HistoryPath(flags.history);
  if (!path.ok()) return path.status();
  sinks::HistoryOptions options;
  options.create_if_missing = create;
  return HistoryStore::Open(*path, options);
}

// Analyzes and summarizes flags.input; labels fill in --run and --arch.
// The value of the first label `key` of `result`; empty when it has none.
std::string Label(const analysis::AnalysisResult& result, std::string_view key) {
  for (const auto& [k, value] : result.labels) {
    if (k == key) return value;
  }
  return {};
}

Result<RunSummary> Summarize(const HistoryFlags& flags) {
  analysis::AnalysisOptions options;
  if (flags.device >= 0) options.device = flags.device;
  options.keep_layout = false;
  Result<std::optional<std::uint64_t>> capacity = OptionalCapacity("--capacity", flags.capacity);
  if (!capacity.ok()) return capacity.status();
  Result<std::optional<std::uint64_t>> others =
      OptionalSize("--used-by-others", flags.used_by_others);
  if (!others.ok()) return others.status();
  FRAGSCOPE_RETURN_IF_ERROR(CheckUsedByOthers(*capacity, *others));
  // A request trace is replayed through the simulator first, as `check` does: on --capacity,
  // else the header's capacity, else an unlimited device.
  bool request_trace = false;
  bool header_capacity = false;  // every device of the header has a capacity
  Result<sources::InputKind> kind = sources::DetectInputKind(flags.input);
  if (!kind.ok()) return kind.status();
  if (*kind == sources::InputKind::kTrace) {
    Result<std::unique_ptr<TraceReader>> reader = TraceReader::Open(flags.input);
    if (!reader.ok()) return reader.status();
    const TraceHeader& header = (*reader)->header();
    request_trace = header.kind == TraceKind::kRequest;
    header_capacity = !header.devices.empty();
    for (const DeviceInfo& d : header.devices) header_capacity &= d.capacity_bytes.has_value();
  }
  analysis::AnalysisResult analyzed;
  if (request_trace) {
    pipeline::ReplayRequest request;
    request.path = flags.input;
    request.capacity = *capacity;
    request.used_by_others = *capacity ? *others : std::nullopt;
    request.options = options;
    if (!*capacity && !header_capacity) request.capacity = analysis::kUnlimitedCapacity;
    Result<pipeline::ReplayRun> run = pipeline::ReplayInput(request);
    if (!run.ok()) return run.status();
    analyzed = std::move(run->result);
  } else {
    Result<analysis::AnalysisResult> read = AnalyzeInput(flags.input, options);
    if (!read.ok()) return read.status();
    analyzed = std::move(*read);
  }
  Result<RunSummary> summary = analysis::SummarizeRun(analyzed, flags.device);
  if (!summary.ok()) return summary.status();
  summary->run = flags.run.empty() ? Label(analyzed, "run") : flags.run;
  summary->architecture = flags.arch.empty() ? Label(analyzed, "architecture") : flags.arch;
  summary->recorded_unix_s = static_cast<std::int64_t>(std::time(nullptr));
  return summary;
}

// The last `n` runs of `current`'s architecture, `current` itself left out.
Result<std::vector<RunSummary>> Baseline(HistoryStore& store, const RunSummary& current,
                                         std::size_t n) {
  Result<std::vector<RunSummary>> runs = store.LastRuns(current.architecture, n + 1);
  if (!runs.ok()) return runs.status();
  std::vector<RunSummary> out;
  for (RunSummary& r : *runs) {
    if (out.size() == n) break;
    if (!current.run.empty() && r.run == current.run) continue;
    out.push_back(std::move(r));
  }
  return out;
}

int RunRecord(const HistoryFlags& flags) {
  Result<RunSummary> summary = Summarize(flags);
  if (!summary.ok()) return BadInput(summary.status().message());
  if (summary->run.empty()) {
    return BadInput(fmt::format("{}: no run name: pass --run NAME (the trace has no \"run\" label)",
                                flags.input));
  }
  if (summary->architecture.empty()) {
    return BadInput(
        fmt::format("{}: no architecture: pass --arch LABEL (the trace has no \"architecture\" "
                    "label)",
                    flags.input));
  }
  Result<std::unique_ptr<HistoryStore>> store = OpenHistory(flags, /*create=*/true);
  if (!store.ok()) return BadInput(store.status().message());
  Result<std::vector<RunSummary>> baseline = Baseline(**store, *summary, flags.last);
  if (!baseline.ok()) return BadInput(baseline.status().message());
  Status recorded = (*store)->RecordRun(*summary, flags.replace);
  if (!recorded.ok()) {
    if (recorded.code() == StatusCode::kInvalidArgument) {
      return BadInput(recorded.message() + " (--replace overwrites it)");
    }
    return BadInput(recorded.message());
  }
  const BaselineComparison c = analysis::CompareWithBaseline(*summary, *baseline);
  if (flags.json) {
    nlohmann::json j = {{"history", (*store)->path()},
                        {"recorded", HistoryToJson(*summary)},
                        {"comparison", HistoryToJson(c)}};
    return WriteReport(j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n",
                       ReportForm::kJson);
  }
  std::string out = fmt::format("recorded run {} ({}) in {}\n", summary->run, summary->architecture,
                                (*store)->path());
  out += fmt::format(
      "  peak allocated {}, peak reserved {}, growth {} per 1000 steps, {} step "
      "marks\n",
      FormatBytes(summary->peak_allocated_bytes), FormatBytes(summary->peak_reserved_bytes),
      FormatGrowth(summary->fragmentation_growth_per_1000_steps), summary->marks.size());
  out += ComparisonText(c);
  return WriteReport(out, ReportForm::kText);
}

// `current` against the last `last` runs of its architecture in the history; a missing history
// file is "no baseline", a damaged one an error.
Result<BaselineComparison> CompareSummary(const RunSummary& current,
                                          const std::string& history_flag, std::size_t last) {
  HistoryFlags flags;
  flags.history = history_flag;
  std::vector<RunSummary> baseline;
  Result<std::unique_ptr<HistoryStore>> store = OpenHistory(flags, /*create=*/false);
  if (store.ok()) {
    Result<std::vector<RunSummary>> runs = Baseline(**store, current, last);
    if (!runs.ok()) return runs.status();
    baseline = std::move(*runs);
  } else if (store.status().code() != StatusCode::kNotFound) {
    return store.status();
  }
  BaselineComparison c = analysis::CompareWithBaseline(current, baseline);
  if (!store.ok()) {
    c.sentence =
        fmt::format("no baseline for {}: {}", current.architecture, store.status().message());
  }
  return c;
}

int RunCompare(const HistoryFlags& flags) {
  Result<RunSummary> summary = Summarize(flags);
  if (!summary.ok()) return BadInput(summary.status().message());
  if (summary->architecture.empty()) {
    return BadInput(
        fmt::format("{}: no architecture: pass --arch LABEL (the trace has no \"architecture\" "
                    "label)",
                    flags.input));
  }
  Result<BaselineComparison> c = CompareSummary(*summary, flags.history, flags.last);
  if (!c.ok()) return BadInput(c.status().message());
  if (flags.json) {
    nlohmann::json j = {{"current", HistoryToJson(*summary)}, {"comparison", HistoryToJson(*c)}};
    return WriteReport(j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n",
                       ReportForm::kJson);
  }
  return WriteReport(ComparisonText(*c), ReportForm::kText);
}

int RunList(const HistoryFlags& flags) {
  Result<std::unique_ptr<HistoryStore>> store = OpenHistory(flags, /*create=*/false);
  std::vector<RunSummary> runs;
  if (store.ok()) {
    sinks::RunFilter filter;
    filter.architecture = flags.arch;
    filter.limit = flags.limit;
    Result<std::vector<RunSummary>> listed = (*store)->ListRuns(filter);
    if (!listed.ok()) return BadInput(listed.status().message());
    runs = std::move(*listed);
  } else if (store.status().code() != StatusCode::kNotFound) {
    return BadInput(store.status().message());
  }
  if (flags.json) {
    nlohmann::json j = nlohmann::json::array();
    for (const RunSummary& r : runs) j.push_back(HistoryToJson(r));
    return WriteReport(j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n",
                       ReportForm::kJson);
  }
  if (!store.ok()) {
    return WriteReport(store.status().message() + " (nothing recorded yet)\n", ReportForm::kText);
  }
  if (runs.empty()) {
    return WriteReport(
        flags.arch.empty()
            ? fmt::format("no runs recorded in {}\n", (*store)->path())
            : fmt::format("no runs of {} recorded in {}\n", flags.arch, (*store)->path()),
        ReportForm::kText);
  }
  std::string out =
      fmt::format("{:<24} {:<16} {:<20} {:>7} {:>12} {:>12} {:>10} {:>5}\n", "RUN", "ARCH",
                  "RECORDED", "STEPS", "PEAK ALLOC", "PEAK RESV", "GROWTH/1K", "OOMS");
  for (const RunSummary& r : runs) {
    out +=
        fmt::format("{:<24} {:<16} {:<20} {:>7} {:>12} {:>12} {:>10} {:>5}\n", TerminalSafe(r.run),
                    TerminalSafe(r.architecture), FormatTime(r.recorded_unix_s), r.steps,
                    FormatBytes(r.peak_allocated_bytes), FormatBytes(r.peak_reserved_bytes),
                    FormatGrowth(r.fragmentation_growth_per_1000_steps), r.num_ooms);
  }
  return WriteReport(out, ReportForm::kText);
}

int RunShow(const HistoryFlags& flags) {
  Result<std::unique_ptr<HistoryStore>> store = OpenHistory(flags, /*create=*/false);
  if (!store.ok()) return BadInput(store.status().message());
  Result<std::optional<RunSummary>> run = (*store)->FindRun(flags.run);
  if (!run.ok()) return BadInput(run.status().message());
  if (!run->has_value()) {
    return BadInput(fmt::format("{}: no run named {}", (*store)->path(), flags.run));
  }
  if (flags.json)
    return WriteReport(
        HistoryToJson(**run).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n",
        ReportForm::kJson);
  return WriteReport(SummaryText(**run), ReportForm::kText);
}

int RunForget(const HistoryFlags& flags) {
  Result<std::unique_ptr<HistoryStore>> store = OpenHistory(flags, /*create=*/false);
  if (!store.ok()) return BadInput(store.status().message());
  Result<bool> deleted = (*store)->DeleteRun(flags.run);
  if (!deleted.ok()) return BadInput(deleted.status().message());
  if (!*deleted) return BadInput(fmt::format("{}: no run named {}", (*store)->path(), flags.run));
  return WriteReport(fmt::format("forgot run {} in {}\n", flags.run, (*store)->path()),
                     ReportForm::kText);
}

void AddHistoryOption(CLI::App& sub, HistoryFlags* flags) {
  sub.add_option("--history", flags->history,
                 "History database (default: $XDG_STATE_HOME/fragscope/history.sqlite, else "
                 "~/.local/state/fragscope/history.sqlite)")
      ->type_name("PATH");
}

void AddInputOptions(CLI::App& sub, HistoryFlags* flags) {
  AddMaxInputBytesOption(sub);
  sub.add_option("INPUT", flags->input,
                 "An allocator trace, a PyTorch memory snapshot, or a request trace (replayed "
                 "first: --capacity); plain, .gz or .zst")
      ->type_name("PATH")
      ->required();
  sub.add_option("--device", flags->device,
                 "Summarize this device (default: the one with the highest peak reserved)")
      ->type_name("N")
      ->check(IntegerAtLeast(0));
  sub.add_option("--last", flags->last, "Compare with the last N runs of the architecture")
      ->type_name("N")
      ->check(IntegerAtLeast(1))
      ->capture_default_str();
  sub.add_flag("--json", flags->json, "Print JSON instead of text");
  sub.add_option("--capacity", flags->capacity,
                 "A request trace is replayed on a device of this size first, as `check` does "
                 "(default: the header's, else unlimited)")
      ->type_name("SIZE")
      ->check(CapacitySize());
  sub.add_option("--used-by-others", flags->used_by_others,
                 "Device memory used outside PyTorch, for that replay")
      ->type_name("SIZE")
      ->check(ByteSize(0))
      ->needs("--capacity");
}

}  // namespace

Result<std::string> HistoryPath(const std::string& flag) {
  if (!flag.empty()) return flag;
  return sinks::DefaultHistoryPath();
}

Result<analysis::BaselineComparison> CompareWithHistory(const analysis::AnalysisResult& result,
                                                        std::int32_t device, const std::string& run,
                                                        const std::string& architecture,
                                                        const std::string& history_flag,
                                                        std::size_t last) {
  Result<RunSummary> summary = analysis::SummarizeRun(result, device);
  if (!summary.ok()) return summary.status();
  summary->run = run.empty() ? Label(result, "run") : run;
  summary->architecture = architecture;
  return CompareSummary(*summary, history_flag, last);
}

std::string KnownArchitecturesHint(const std::string& architecture,
                                   const std::string& history_flag) {
  HistoryFlags flags;
  flags.history = history_flag;
  Result<std::unique_ptr<HistoryStore>> store = OpenHistory(flags, /*create=*/false);
  if (!store.ok()) return "";
  Result<std::vector<RunSummary>> runs = (*store)->ListRuns();
  if (!runs.ok()) return "";
  std::vector<std::string> labels;
  for (const RunSummary& r : *runs) {
    if (!r.architecture.empty()) labels.push_back(r.architecture);
  }
  std::sort(labels.begin(), labels.end());
  labels.erase(std::unique(labels.begin(), labels.end()), labels.end());
  if (labels.empty()) return "; the history has no runs yet";
  std::string hint = "; labels with runs:";
  for (std::size_t i = 0; i < labels.size(); ++i) hint += (i ? ", " : " ") + labels[i];
  hint += DidYouMean(architecture, labels);
  return hint;
}

Command AddHistoryCommand(CLI::App& app) {
  auto flags = std::make_shared<HistoryFlags>();
  CLI::App* history = app.add_subcommand("history", std::string(kHistoryDescription));
  history->footer(std::string(kHistoryFooter));
  history->require_subcommand(1);

  CLI::App* record = history->add_subcommand("record", "Analyze a run and record its summary");
  record->footer(std::string(kRecordFooter));
  AddInputOptions(*record, flags.get());
  record->add_option("--run", flags->run, "Run name, unique in the history (default: label run)")
      ->type_name("NAME");
  record
      ->add_option("--arch", flags->arch,
                   "Model architecture label the run is grouped under (default: label "
                   "architecture)")
      ->type_name("LABEL");
  record->add_flag("--replace", flags->replace, "Replace a run recorded under the same name");
  AddHistoryOption(*record, flags.get());

  CLI::App* compare =
      history->add_subcommand("compare", "Compare a run with the last runs of its architecture");
  compare->footer(std::string(kCompareFooter));
  AddInputOptions(*compare, flags.get());
  compare->add_option("--arch", flags->arch, "Architecture label (default: label architecture)")
      ->type_name("LABEL");
  compare->add_option("--run", flags->run, "This run's name, left out of its own baseline")
      ->type_name("NAME");
  AddHistoryOption(*compare, flags.get());

  CLI::App* list = history->add_subcommand("list", "List recorded runs, newest first");
  list->footer(
      "Examples:\n  fragscope history list\n  fragscope history list --arch gpt-1.3b --limit 10"
      "\n  fragscope history list --json | jq '.[].run'");
  list->add_option("--arch", flags->arch, "Only runs of this architecture")->type_name("LABEL");
  list->add_option("--limit", flags->limit, "At most N runs")
      ->type_name("N")
      ->check(IntegerAtLeast(1));
  list->add_flag("--json", flags->json, "Print JSON instead of text");
  AddHistoryOption(*list, flags.get());

  CLI::App* show = history->add_subcommand("show", "Show one recorded run");
  show->footer(
      "Examples:\n  fragscope history show nightly-1120\n"
      "  fragscope history show nightly-1120 --json");
  show->add_option("RUN", flags->run, "Run name")->required();
  show->add_flag("--json", flags->json, "Print JSON instead of text");
  AddHistoryOption(*show, flags.get());

  CLI::App* forget = history->add_subcommand(
      "forget", "Delete a recorded run (and the agent samples stored under its name)");
  forget->footer("Example:\n  fragscope history forget nightly-1120");
  forget->add_option("RUN", flags->run, "Run name")->required();
  AddHistoryOption(*forget, flags.get());

  return Command{history, [flags, record, compare, list, show, forget] {
                   if (record->parsed()) return RunRecord(*flags);
                   if (compare->parsed()) return RunCompare(*flags);
                   if (list->parsed()) return RunList(*flags);
                   if (show->parsed()) return RunShow(*flags);
                   if (forget->parsed()) return RunForget(*flags);
                   return kExitBadInput;
                 }};
}

}  // namespace fragscope::cli
