#include "analyze_command.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <string_view>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "analysis/trace_analyzer.h"
#include "cli_util.h"
#include "common/units.h"
#include "fragscope/trace.h"
#include "history_command.h"
#include "sinks/report/json_report.h"
#include "sinks/report/text_report.h"

namespace fragscope::cli {
namespace {

struct AnalyzeFlags {
  std::string path;
  ReportFlags report;
  std::int32_t device = -1;        // -1: every device
  std::string stranded_threshold;  // a size ("2MiB"); empty: use the quantile
  double stranded_quantile = 0.5;
  std::size_t map_rows = 32;
  std::string map_scale = "shared";
  std::string max_line_bytes;  // a size; empty: the reader's default
  std::string capacity;        // a size; empty: the trace header's
  bool forecast = false;
  analysis::ForecastOptions forecast_options;
  std::string baseline;  // architecture label; empty: no baseline comparison
  std::string history;   // history database; empty: the default path
  std::size_t last = 5;  // earlier runs that form the baseline (as `check --last`)
  unsigned threads = 0;  // AnalysisThreads
};

constexpr std::string_view kAnalyzeDescription =
    "Report peaks, fragmentation, a timeline and a memory map of a trace or snapshot";

constexpr std::string_view kAnalyzeFooter =
    R"(Reports, per device: the peaks of reserved and allocated memory and when they happened
(event index, step, time), the worst fragmentation, the smallest largest-free-block, the final
state per pool (small and large), a timeline (one row per training step, or per --every N
events) and a map of the final memory layout.

What the numbers mean (docs/metrics.md has every formula):
  reserved                memory held from the driver (cudaMalloc'd segments)
  allocated               bytes of blocks handed to tensors (after rounding)
  requested               bytes the program asked for
  cached free             reserved - allocated: cached by the allocator, not in use
  fragmentation ratio     cached free / reserved
  largest free block      the biggest request the cache can serve without a new segment
  external fragmentation  1 - largest free block / cached free: how scattered the free bytes are
  internal waste          allocated - requested: rounding and split waste
  stranded                free bytes in blocks smaller than recent requests: unusable gaps
  max allocatable         the largest single request that would succeed now, by the
                          allocator's own rules (cached blocks, then a new segment if the
                          device capacity is known)
  memory map              one row per segment: # allocated  + pending free  . free
                          ! stranded

For every oom event the report says why it failed (fragmentation or real shortage, how much
was free but unusable), and it lists the call sites whose live blocks strand free gaps (when
the input records stacks).

FILE may be a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot(), pickle or JSON):
it is read safely (no code in it runs), its history is replayed from the state at its start
(rebuilt from the final segments) and reported like a trace (docs/snapshots.md).

A request trace (only the program's allocs and frees, no segments) gets live requested bytes,
request-size statistics and per-step peaks; allocator-level numbers need a replay through the
simulator (`fragscope replay`).

Examples:
  fragscope analyze snapshot.pickle
  fragscope analyze trace.jsonl.gz
  fragscope analyze trace.jsonl.gz --json | jq .devices[0].peak_reserved
  fragscope analyze trace.jsonl.gz --every 1000 --no-map
  fragscope analyze trace.jsonl --device 1 --stranded-threshold 2MiB
  fragscope analyze trace.jsonl.gz --forecast --no-map
  fragscope analyze trace.jsonl.gz --forecast --forecast-every 1 --json | jq .devices[0].forecast
  fragscope analyze trace.jsonl.gz --forecast --baseline gpt-1.3b --history ci-history.sqlite

--forecast runs the OOM forecaster over each device's per-step timeline, as a live agent
sampling every --forecast-every steps would see it, and prints the risk timeline (level
changes: ok, watch, warning, critical, with the estimated steps to OOM and the reason) and the
first warning and critical steps. It needs the device capacity (--capacity SIZE, else the
trace header's capacity_bytes, which `fragscope replay --capacity` writes) for steps-to-OOM and
the OOM risk; without step
markers it counts timeline windows as steps and says so. docs/forecast.md explains every
signal and threshold.

--baseline ARCH (with --forecast) adds to each device's forecast how the run compares with the
last --last runs (default 5) of that architecture in the history (--history PATH, default as
for `fragscope history`), as `check --baseline` does: "fragmenting 2.3× faster than the last 5
runs of ARCH".
The trace's "run" label keeps a recorded run out of its own baseline. It needs an allocator
trace or snapshot with step markers (docs/history.md); a damaged history is refused.

Exit status: 0 on success; 2 for bad input (the message names file:line, or the snapshot's
byte offset or field) or bad usage.
JSON schema: docs/json-schema.md. Guide: docs/user-guide.md.)";

int RunAnalyze(const AnalyzeFlags& flags) {
  // Options first, so a typo fails before a long read.
  analysis::AnalysisOptions options;
  if (flags.device >= 0) options.device = flags.device;
  ApplyReportFlags(flags.report, &options);
  options.stranded_quantile = flags.stranded_quantile;
  if (flags.forecast) {
    if (Status s = analysis::ValidateForecastOptions(flags.forecast_options); !s.ok()) {
      return BadInput("--forecast: " + s.message());
    }
    options.forecast = flags.forecast_options;
  }
  Result<std::optional<std::uint64_t>> capacity = OptionalCapacity("--capacity", flags.capacity);
  if (!capacity.ok()) return BadInput(capacity.status().message());
  options.capacity_bytes = *capacity;
  // Sizes were validated while parsing; parse errors here would be a bug, reported all the same.
  if (!flags.stranded_threshold.empty()) {
    Result<std::uint64_t> threshold = ParseSize(flags.stranded_threshold);
    if (!threshold.ok()) return BadInput("--stranded-threshold: " + threshold.status().message());
    options.stranded_threshold = *threshold;
  }
  TraceLimits limits;
  if (!flags.max_line_bytes.empty()) {
    Result<std::uint64_t> max_line = ParseSize(flags.max_line_bytes);
    if (!max_line.ok()) return BadInput("--max-line-bytes: " + max_line.status().message());
    limits.max_line_bytes = static_cast<std::size_t>(
        std::min<std::uint64_t>(*max_line, std::numeric_limits<std::size_t>::max()));
  }

  Result<analysis::AnalysisResult> analyzed =
      AnalyzeInput(flags.path, options, limits, flags.threads);
  if (!analyzed.ok()) return BadInput(analyzed.status().message());
  analysis::AnalysisResult& result = *analyzed;
  if (flags.device >= 0 && result.devices.empty()) {
    return BadInput(
        fmt::format("{}: device {} has no events (--device)", flags.path, flags.device));
  }
  if (!flags.baseline.empty()) {
    for (analysis::DeviceReport& d : result.devices) {
      if (!d.forecast) continue;
      Result<analysis::BaselineComparison> c = CompareWithHistory(
          result, d.device, /*run=*/"", flags.baseline, flags.history, flags.last);
      if (!c.ok()) return BadInput("--baseline: " + c.status().message());
      d.forecast->baseline = analysis::ForecastBaseline{c->architecture, c->runs, c->has_baseline,
                                                        c->growth_ratio, c->sentence};
    }
  }
  if (flags.report.json) {
    sinks::JsonOptions json;
    json.include_layout = !flags.report.no_map;
    return WriteReport(sinks::RenderJson(result, json), ReportForm::kJson);
  }
  sinks::TextOptions text = TextOptionsFor(flags.report);
  text.map.max_rows = flags.map_rows;
  text.map.scale =
      flags.map_scale == "segment" ? sinks::MapScale::kPerSegment : sinks::MapScale::kShared;
  return WriteReport(sinks::RenderText(result, text), TextForm(text.color));
}

}  // namespace

Command AddAnalyzeCommand(CLI::App& app) {
  auto flags = std::make_shared<AnalyzeFlags>();
  CLI::App* sub = app.add_subcommand("analyze", std::string(kAnalyzeDescription));
  sub->footer(std::string(kAnalyzeFooter));
  AddMaxInputBytesOption(*sub);
  sub->add_option("FILE", flags->path,
                  "A fragscope trace (JSON Lines) or a PyTorch memory snapshot (pickle or JSON); "
                  "plain, .gz or .zst")
      ->type_name("PATH")
      ->required();
  AddReportOptions(*sub, &flags->report);
  sub->add_option("--device", flags->device, "Report only this device index")
      ->type_name("N")
      ->check(IntegerAtLeast(0));
  sub->add_option("--capacity", flags->capacity,
                  "Every device's memory, in place of the trace header's (e.g. 80GiB): max "
                  "allocatable and --forecast's steps-to-OOM and OOM risk are taken against it")
      ->type_name("SIZE")
      ->check(CapacitySize());
  sub->add_option("--stranded-threshold", flags->stranded_threshold,
                  "Fixed stranding threshold for both pools, e.g. 2MiB")
      ->type_name("SIZE")
      ->check(ByteSize(0));
  sub->add_option("--stranded-quantile", flags->stranded_quantile,
                  "Else: this quantile of recent request sizes, per pool")
      ->type_name("Q")
      ->transform(Fraction())
      ->capture_default_str();
  sub->add_option("--map-rows", flags->map_rows, "Segments drawn in the memory map")
      ->type_name("N")
      ->check(IntegerAtLeast(1))
      ->capture_default_str();
  sub->add_option("--map-scale", flags->map_scale,
                  "shared: one scale for all rows; segment: each row fills the width")
      ->check(CLI::IsMember({"shared", "segment"}))
      ->capture_default_str();
  sub->add_option("--max-line-bytes", flags->max_line_bytes,
                  "Longest trace line accepted (default 16MiB)")
      ->type_name("SIZE")
      ->check(ByteSize(1));
  sub->add_option("--threads", flags->threads,
                  "2: parse a trace on one thread and analyze it on a second (same report, "
                  "sooner); 1: one thread; 0: 2 if the machine has 2+ hardware threads")
      ->type_name("N")
      ->default_val(0);
  AddForecastOptions(*sub, &flags->forecast, &flags->forecast_options);
  sub->add_option("--baseline", flags->baseline,
                  "Compare with the last runs (--last) of this architecture label in the history")
      ->type_name("ARCH");
  sub->add_option("--history", flags->history,
                  "History database for --baseline (default: "
                  "$XDG_STATE_HOME/fragscope/history.sqlite)")
      ->type_name("PATH")
      ->needs("--baseline");
  sub->add_option("--last", flags->last, "How many earlier runs form the --baseline")
      ->type_name("N")
      ->check(IntegerAtLeast(1))
      ->capture_default_str()
      ->needs("--baseline");
  sub->get_option("--baseline")->needs("--forecast");
  return Command{sub, [flags] { return RunAnalyze(*flags); }};
}

}  // namespace fragscope::cli
