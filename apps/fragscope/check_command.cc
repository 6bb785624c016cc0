#include "check_command.h"

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "analysis/check.h"
#include "analyze_command.h"
#include "cli_util.h"
#include "common/units.h"
#include "fragscope/risk.h"
#include "fragscope/trace.h"
#include "history_command.h"
#include "replay_command.h"
#include "sinks/report/check_report.h"
#include "sources/snapshot/snapshot_reader.h"

namespace fragscope::cli {
namespace {

struct CheckFlags {
  std::string path;
  std::string baseline;  // architecture label; empty: no baseline check
  std::string run;       // this run's name (default: the trace's "run" label)
  std::string history;
  std::size_t last = 5;
  bool allow_new_baseline = false;
  bool allow_missing = false;
  bool fail_at_given = false;  // --fail-at on the command line (not only its default)
  std::string max_peak_reserved;
  std::optional<double> max_fragmentation;
  std::string capacity;
  std::string used_by_others;
  std::optional<std::string> alloc_conf;
  std::string torch_version = "newest";
  double max_growth_ratio = 1.5;
  double max_peak_increase = 0.10;
  std::string fail_at = "critical";
  std::optional<double> max_oom_risk;
  std::uint64_t forecast_every = 50;
  std::int32_t device = -1;
  bool json = false;
  std::string color = "auto";
};

constexpr std::string_view kCheckDescription =
    "Gate a run's memory behaviour in CI: exit 1 on a regression or a predicted OOM";

constexpr std::string_view kCheckFooter =
    R"(Analyzes INPUT and runs a list of checks on every device, each pass, FAIL or skipped:

  oom             the run must not run out of memory. A request trace is replayed through
                  the simulator on a device of --capacity bytes (default: the header's, else
                  unlimited); an allocator trace or snapshot must have no oom event.
  capacity        --capacity: an allocator trace or snapshot must fit (peak reserved +
                  --used-by-others <= capacity).
  peak_reserved   --max-peak-reserved: the peak of reserved memory.
  fragmentation   --max-fragmentation: the worst fragmentation ratio (cached free / reserved)
                  at the end of any step.
  forecast        the forecaster (docs/forecast.md) must not reach --fail-at (default
                  critical: an OOM predicted for the coming steps); with --max-oom-risk P,
                  nor P(OOM within 100 steps) reach P at any sample.
  baseline        --baseline LABEL: compared with the last --last runs of that architecture
                  in the history (docs/history.md), the run must not fragment more than
                  --max-growth-ratio times as fast, nor grow its peak allocated memory by
                  more than --max-peak-increase. No earlier runs of LABEL (a typo, or
                  the wrong --history) fail the check, naming the labels the history
                  knows; --allow-new-baseline lets a label's first run pass.

A check you asked for whose input is missing fails rather than pass unseen: --fail-at or
--max-oom-risk on a run too short for a forecast (or without the capacity an OOM risk needs),
--max-fragmentation on a device that never reserved memory. --allow-missing skips them instead.
(The default --fail-at critical alone does not fail a short run.)

Exit status: 0 when every check passes (or is skipped), 1 when one fails, 2 for bad input or
usage. Output fits one screen; --json gives the same as schema fragscope.check
(docs/json-schema.md). A CI job typically records the run afterwards when it passes:
`fragscope history record INPUT --arch LABEL`.

Examples:
  fragscope check run.jsonl.gz --max-peak-reserved 38GiB --max-fragmentation 0.3
  fragscope check requests.jsonl.gz --capacity 40GiB
  fragscope check snapshot.pickle --baseline gpt-1.3b --history ci-history.sqlite
  fragscope check run.jsonl.gz --baseline gpt-1.3b --allow-new-baseline   # its first run
  fragscope check run.jsonl.gz --baseline gpt-1.3b --json | jq .verdict)";

int RunCheck(const CheckFlags& flags) {
  analysis::CheckLimits limits;
  Result<std::optional<std::uint64_t>> peak =
      OptionalSize("--max-peak-reserved", flags.max_peak_reserved);
  if (!peak.ok()) return BadInput(peak.status().message());
  Result<std::optional<std::uint64_t>> capacity = OptionalCapacity("--capacity", flags.capacity);
  if (!capacity.ok()) return BadInput(capacity.status().message());
  Result<std::optional<std::uint64_t>> others =
      OptionalSize("--used-by-others", flags.used_by_others);
  if (!others.ok()) return BadInput(others.status().message());
  if (Status fits = CheckUsedByOthers(*capacity, *others); !fits.ok())
    return BadInput(fits.message());
  limits.max_peak_reserved = *peak;
  limits.capacity = *capacity;
  limits.used_by_others = others->value_or(0);
  limits.max_fragmentation = flags.max_fragmentation;
  limits.max_growth_ratio = flags.max_growth_ratio;
  limits.max_peak_increase = flags.max_peak_increase;
  limits.allow_new_baseline = flags.allow_new_baseline;
  limits.allow_missing = flags.allow_missing;
  limits.forecast_asked = flags.fail_at_given || flags.max_oom_risk.has_value();
  limits.fail_at_level =
      flags.fail_at == "never" ? RiskLevel::kUnknown : ParseRiskLevel(flags.fail_at).value();

  analysis::AnalysisOptions options;
  if (flags.device >= 0) options.device = flags.device;
  options.keep_layout = false;
  limits.max_oom_risk = flags.max_oom_risk;
  if (limits.fail_at_level != RiskLevel::kUnknown || limits.max_oom_risk) {
    analysis::ForecastOptions forecast;
    forecast.every = flags.forecast_every;
    options.forecast = forecast;
  }

  // A request trace is replayed; anything else (allocator trace, snapshot) is analyzed.
  Result<sources::InputKind> kind = sources::DetectInputKind(flags.path);
  if (!kind.ok()) return BadInput(kind.status().message());
  bool replayed = false;
  bool header_capacity = false;  // every device of the header has a capacity
  if (*kind == sources::InputKind::kTrace) {
    Result<std::unique_ptr<TraceReader>> reader = TraceReader::Open(flags.path);
    if (!reader.ok()) return BadInput(reader.status().message());
    const TraceHeader& header = (*reader)->header();
    replayed = header.kind == TraceKind::kRequest;
    header_capacity = !header.devices.empty();
    for (const DeviceInfo& d : header.devices) header_capacity &= d.capacity_bytes.has_value();
  }
  analysis::CheckResult check;
  check.source = flags.path;
  check.mode = replayed ? "request trace replayed through the simulator" : "analyzed";
  analysis::AnalysisResult result;
  std::string oom_message;
  if (replayed) {
    ReplayRequest request;
    request.path = flags.path;
    request.capacity = limits.capacity;
    request.used_by_others = limits.capacity ? std::optional(limits.used_by_others) : std::nullopt;
    request.alloc_conf = flags.alloc_conf;
    request.version = TorchVersion(flags.torch_version);
    request.options = options;
    if (!limits.capacity && !header_capacity) {
      request.capacity = analysis::kUnlimitedCapacity;
      check.notes.push_back(
          "no --capacity and no capacity in the header: replayed on an unlimited device (only "
          "the limits you gave can fail)");
    }
    Result<ReplayRun> run = ReplayInput(request);
    if (!run.ok()) return BadInput(run.status().message());
    for (const analysis::DeviceReplay& d : run->replay.devices) {
      if (d.capacity_bytes == analysis::kUnlimitedCapacity) continue;
      check.notes.push_back(fmt::format(
          "device {}: replayed on a device of {}{}", d.device, FormatBytes(d.capacity_bytes),
          d.used_by_others_bytes > 0
              ? fmt::format(" with {} used by others", FormatBytes(d.used_by_others_bytes))
              : std::string()));
    }
    result = std::move(run->result);
    if (!run->replay.ooms.empty()) oom_message = run->replay.ooms.front().details.message;
    for (const std::string& n : run->replay.notes) check.notes.push_back(n);
  } else {
    if (flags.alloc_conf) {
      check.notes.push_back("--alloc-conf applies to replays of request traces; ignored");
    }
    Result<analysis::AnalysisResult> analyzed = AnalyzeInput(flags.path, options);
    if (!analyzed.ok()) return BadInput(analyzed.status().message());
    result = std::move(*analyzed);
  }
  if (flags.device >= 0 && result.devices.empty()) {
    return BadInput(
        fmt::format("{}: device {} has no events (--device)", flags.path, flags.device));
  }
  if (result.devices.empty()) check.notes.push_back("the input has no device events");

  for (const analysis::DeviceReport& d : result.devices) {
    analysis::CheckDeviceInput in;
    in.report = &d;
    in.replayed = replayed;
    in.replay_oom_message = oom_message;
    in.has_steps = result.steps > 0;
    if (!flags.baseline.empty()) {
      Result<analysis::BaselineComparison> c = CompareWithHistory(
          result, d.device, flags.run, flags.baseline, flags.history, flags.last);
      if (!c.ok()) return BadInput(c.status().message());
      if (!c->has_baseline) c->sentence += KnownArchitecturesHint(flags.baseline, flags.history);
      in.baseline = std::move(*c);
    }
    std::vector<analysis::CheckItem> items = analysis::CheckDevice(in, limits);
    check.items.insert(check.items.end(), items.begin(), items.end());
  }
  for (const std::string& n : result.notes) check.notes.push_back(n);

  const bool color = !flags.json && UseColor(flags.color);
  const std::string out =
      flags.json ? sinks::RenderCheckJson(check) : sinks::RenderCheckText(check, color);
  const int written = WriteReport(out, flags.json ? ReportForm::kJson : TextForm(color));
  if (written != kExitOk) return written;
  return check.passed() ? kExitOk : kExitFailure;
}

}  // namespace

Command AddCheckCommand(CLI::App& app) {
  auto flags = std::make_shared<CheckFlags>();
  CLI::App* sub = app.add_subcommand("check", std::string(kCheckDescription));
  sub->footer(std::string(kCheckFooter));
  AddMaxInputBytesOption(*sub);
  sub->add_option("INPUT", flags->path,
                  "A request or allocator trace, or a PyTorch memory snapshot; plain, .gz or .zst")
      ->type_name("PATH")
      ->required();
  sub->add_option("--baseline", flags->baseline,
                  "Compare with the last runs of this architecture label in the history")
      ->type_name("LABEL");
  sub->add_flag("--allow-new-baseline", flags->allow_new_baseline,
                "A first run of the --baseline label: pass its check without earlier runs "
                "(without this flag, no earlier runs fail the check)")
      ->needs("--baseline");
  sub->add_flag("--allow-missing", flags->allow_missing,
                "Skip, rather than fail, a check whose input is missing (a forecast asked for "
                "on too few steps, a fragmentation limit on a device that never reserved memory)");
  sub->add_option("--last", flags->last, "How many earlier runs form the baseline")
      ->type_name("N")
      ->check(IntegerAtLeast(1))
      ->capture_default_str();
  sub->add_option("--run", flags->run,
                  "This run's name, left out of its own baseline (default: label run)")
      ->type_name("NAME");
  sub->add_option("--history", flags->history,
                  "History database (default: $XDG_STATE_HOME/fragscope/history.sqlite)")
      ->type_name("PATH");
  sub->add_option("--max-peak-reserved", flags->max_peak_reserved,
                  "Fail when reserved memory peaks above this")
      ->type_name("SIZE")
      ->check(ByteSize(0));
  sub->add_option("--max-fragmentation", flags->max_fragmentation,
                  "Fail when the fragmentation ratio at a step's end exceeds this")
      ->type_name("R")
      ->transform(Fraction());
  sub->add_option("--capacity", flags->capacity,
                  "Device memory: replay request traces on it; other inputs must fit in it")
      ->type_name("SIZE")
      ->check(CapacitySize());
  sub->add_option("--used-by-others", flags->used_by_others,
                  "Device memory used outside PyTorch (CUDA context, NCCL, other processes)")
      ->type_name("SIZE")
      ->check(ByteSize(0));
  sub->add_option("--alloc-conf", flags->alloc_conf,
                  "PYTORCH_CUDA_ALLOC_CONF for the replay of a request trace")
      ->type_name("STR");
  AddTorchVersionOption(*sub, &flags->torch_version);
  sub->add_option("--max-growth-ratio", flags->max_growth_ratio,
                  "Baseline: fail when fragmenting more than this many times as fast")
      ->type_name("X")
      ->check(CLI::Range(1.0, 1e9))
      ->capture_default_str();
  sub->add_option("--max-peak-increase", flags->max_peak_increase,
                  "Baseline: fail when peak allocated grows by more than this fraction")
      ->type_name("F")
      ->check(CLI::Range(0.0, 1e9))
      ->capture_default_str();
  sub->add_option("--fail-at", flags->fail_at, "Forecast level that fails the check")
      ->check(CLI::IsMember({"watch", "warning", "critical", "never"}))
      ->capture_default_str();
  sub->add_option("--max-oom-risk", flags->max_oom_risk,
                  "Fail the forecast when P(OOM within 100 steps) reaches P at any sample "
                  "(docs/forecast.md, \"OOM risk\")")
      ->type_name("P")
      ->transform(Fraction());
  sub->add_option("--forecast-every", flags->forecast_every,
                  "Steps per forecaster sample (as a live agent would sample)")
      ->type_name("N")
      ->check(IntegerAtLeast(1))
      ->capture_default_str();
  sub->add_option("--device", flags->device, "Check only this device index")
      ->type_name("N")
      ->check(IntegerAtLeast(0));
  sub->add_flag("--json", flags->json, "Print JSON (schema fragscope.check)");
  sub->add_option("--color", flags->color, "auto, always or never")
      ->check(CLI::IsMember({"auto", "always", "never"}))
      ->capture_default_str();
  return Command{sub, [flags, sub] {
                   flags->fail_at_given = sub->get_option("--fail-at")->count() > 0;
                   return RunCheck(*flags);
                 }};
}

}  // namespace fragscope::cli
