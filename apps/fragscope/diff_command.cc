#include "diff_command.h"

#include <cstdio>
#include <map>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "analysis/diagnosis.h"
#include "cli_util.h"
#include "common/units.h"
#include "replay_command.h"
#include "sinks/report/diff_report.h"

namespace fragscope::cli {
namespace {

struct DiffFlags {
  std::vector<std::string> paths;
  std::optional<std::string> alloc_conf;    // B's (one input: B is the input under it)
  std::optional<std::string> alloc_conf_a;  // A's
  std::string capacity;
  std::string used_by_others;
  std::string torch_version = "newest";
  std::string format = "text";
  bool json = false;  // --json: the same as --format json, as the other commands write it
  std::size_t top = 10;
};

constexpr std::string_view kDiffDescription =
    "Compare two runs (or one trace under two settings), or find the rank that differs";

constexpr std::string_view kDiffFooter =
    R"(Two inputs, A and B: per device, the peaks (reserved, allocated, requested), the worst
fragmentation ratio, the bytes stranded at the end, the OOMs (where, and which request) and the
call sites whose memory changed most (peak live requested bytes), A against B. Each figure is
the one `analyze` prints (docs/metrics.md, "Comparing runs").

A and B are PyTorch memory snapshots, allocator traces or request traces, both of one kind. A
request trace is replayed through the simulator (as `fragscope replay`) on --capacity bytes (or
its header's capacity). A snapshot given --capacity or --alloc-conf is replayed too: its
requests, under those settings.

One input with --alloc-conf: the same input under two settings, A under --alloc-conf-a (default
the input's own settings), B under --alloc-conf; both are replayed.

Three or more inputs: the per-rank dumps of one job (in rank order). Each rank's figures are
set against the median of the other ranks'; a rank differs when a figure lies at least 3.5
robust deviations away (more requested, more fragmented, ...), or when it has a call site of
1 MiB or more that no other rank has (or lacks one every other rank has).

Examples:
  fragscope diff before.pickle after.pickle
  fragscope diff requests.jsonl.gz --capacity 16GiB --alloc-conf expandable_segments:True
  fragscope diff a.jsonl b.jsonl --capacity 16GiB --format json
  fragscope diff rank0.pickle rank1.pickle rank2.pickle rank3.pickle

Exit status: 0 when the comparison was printed, whatever it found; 2 for bad input or usage (one
input without --alloc-conf, inputs of different kinds, an unreadable input); 1 when the output
cannot be written.)";

// ---------------------------------------------------------------------------------------------
// Reading one run
// ---------------------------------------------------------------------------------------------

// An input analyzed as it is, with its call sites' memory.
struct AnalyzedInput {
  analysis::AnalysisResult result;
  std::vector<analysis::SiteMemory> sites;
  std::map<std::int32_t, std::string> oom_sites;  // device -> its first OOM's call site
  std::string kind;                               // "snapshot", "allocator trace", ...
};

std::string KindOf(const analysis::AnalysisResult& r) {
  if (r.kind == TraceKind::kRequest) return "request trace";
  if (r.producer.rfind("PyTorch memory snapshot", 0) == 0) return "snapshot";
  return "allocator trace";
}

// "a snapshot", "an allocator trace".
std::string WithArticle(const std::string& kind) {
  return (kind.front() == 'a' ? "an " : "a ") + kind;
}

Result<AnalyzedInput> AnalyzeForDiff(const std::string& path) {
  analysis::SiteMemoryTracker tracker;
  auto tap = [&tracker](const TraceHeader&, const Event& e, bool) {
    tracker.Consume(e);
    return Status::Ok();
  };
  std::vector<Frame> call_sites;
  analysis::AnalysisOptions options;
  Result<analysis::AnalysisResult> analyzed =
      AnalyzeInput(path, options, TraceLimits{}, 1, tap, &call_sites);
  if (!analyzed.ok()) return analyzed.status();
  AnalyzedInput out;
  out.result = std::move(*analyzed);
  out.kind = KindOf(out.result);
  out.sites = tracker.Sites(call_sites);
  for (const analysis::DeviceReport& d : out.result.devices) {
    analysis::SiteStranding named;
    named.frame = tracker.FirstOomFrame(d.device);
    if (named.frame < 0) continue;
    analysis::NameSite(call_sites, &named);
    out.oom_sites[d.device] = named.site;
  }
  return out;
}

bool Replayed(const RunSpec& spec, const AnalyzedInput& input) {
  return input.kind == "request trace" || spec.alloc_conf || spec.capacity || spec.force_replay;
}

Result<analysis::RunFigures> FiguresFor(const RunSpec& spec, AnalyzedInput input) {
  if (!Replayed(spec, input)) {
    analysis::RunFigures run = analysis::FiguresOf(input.result, input.sites, input.oom_sites);
    run.kind = input.kind;
    run.how = "as recorded";
    return run;
  }
  if (input.kind == "allocator trace") {
    return Status::InvalidArgument(fmt::format(
        "{}: an allocator trace records what the allocator did, not the requests to replay "
        "under --alloc-conf or --capacity; give a request trace or a snapshot",
        spec.path));
  }
  ReplayRequest request;
  request.path = spec.path;
  request.capacity = spec.capacity;
  request.used_by_others = spec.used_by_others;
  request.alloc_conf = spec.alloc_conf;
  request.version = spec.version;
  request.threads = 1;
  Result<ReplayRun> replayed = ReplayInput(request);
  if (!replayed.ok()) return replayed.status();
  // The sites' memory is the input's (requested bytes do not depend on the settings); the
  // simulated events name no call site, so a replayed OOM's request has none either.
  analysis::RunFigures run = analysis::FiguresOf(replayed->result, input.sites, {});
  analysis::UseReplayOoms(replayed->replay.ooms, &run);
  run.kind = input.kind;
  run.notes.insert(run.notes.end(), replayed->replay.notes.begin(), replayed->replay.notes.end());
  if (!replayed->replay.devices.empty()) {
    const analysis::DeviceReplay& first = replayed->replay.devices.front();
    run.alloc_conf = first.alloc_conf;
    run.how = fmt::format(
        "replayed on {} under {}",
        first.capacity_bytes >= analysis::kUnlimitedCapacity ? std::string("an unlimited device")
                                                             : FormatBytes(first.capacity_bytes),
        first.alloc_conf.empty() ? std::string("the default settings") : first.alloc_conf);
  } else {
    run.how = "replayed (no device had an event)";
  }
  return run;
}

// ---------------------------------------------------------------------------------------------
// The command
// ---------------------------------------------------------------------------------------------

int RunDiff(const DiffFlags& flags) {
  const std::size_t n = flags.paths.size();
  if (n == 1 && !flags.alloc_conf) {
    return BadInput(fmt::format(
        "diff: one input given ({}): give two inputs to compare, three or more per-rank dumps, "
        "or one input with --alloc-conf SETTINGS (B: the same input under those settings)",
        flags.paths.front()));
  }
  if (n >= 3 && (flags.alloc_conf || flags.alloc_conf_a)) {
    return BadInput(fmt::format(
        "diff: --alloc-conf and --alloc-conf-a are for two runs (A and B); {} inputs are "
        "compared rank against rank as they were recorded",
        n));
  }
  Result<std::optional<std::uint64_t>> capacity = OptionalCapacity("--capacity", flags.capacity);
  if (!capacity.ok()) return BadInput(capacity.status().message());
  Result<std::optional<std::uint64_t>> others =
      OptionalSize("--used-by-others", flags.used_by_others);
  if (!others.ok()) return BadInput(others.status().message());
  if (Status fits = CheckUsedByOthers(*capacity, *others); !fits.ok()) {
    return BadInput(fits.message());
  }

  // The runs: A and B (one input: itself twice), or the ranks.
  std::vector<RunSpec> specs;
  for (const std::string& path : flags.paths) {
    RunSpec spec;
    spec.path = path;
    spec.capacity = *capacity;
    spec.used_by_others = *others;
    spec.version = TorchVersion(flags.torch_version);
    specs.push_back(std::move(spec));
  }
  if (n == 1) {
    specs.push_back(specs.front());
    specs[0].force_replay = specs[1].force_replay = true;
  }
  if (specs.size() == 2) {
    specs[0].alloc_conf = flags.alloc_conf_a;
    specs[1].alloc_conf = flags.alloc_conf;
  }
  Result<std::vector<analysis::RunFigures>> read = ReadRuns(specs);
  if (!read.ok()) return BadInput(read.status().message());
  std::vector<analysis::RunFigures> runs = std::move(*read);

  const bool json = flags.json || flags.format == "json";
  std::string report;
  if (runs.size() == 2) {
    const analysis::RunDiff diff =
        analysis::CompareRuns(std::move(runs[0]), std::move(runs[1]), flags.top);
    report = json ? sinks::RenderDiffJson(diff) : sinks::RenderDiffText(diff);
  } else {
    const analysis::RankComparison ranks = analysis::CompareRanks(std::move(runs));
    report = json ? sinks::RenderRanksJson(ranks) : sinks::RenderRanksText(ranks);
  }
  return WriteReport(report, json ? ReportForm::kJson : ReportForm::kText);
}

}  // namespace

Result<std::vector<analysis::RunFigures>> ReadRuns(const std::vector<RunSpec>& specs) {
  auto name = [&](std::size_t i) {
    return specs.size() == 2 ? std::string(i == 0 ? "A" : "B") : fmt::format("rank {}", i);
  };
  // Every input is read before any is replayed, so that a mismatch of kinds is told first. An
  // input named twice in a row (one input under two settings) is read once.
  std::vector<AnalyzedInput> inputs;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    if (i > 0 && specs[i].path == specs[i - 1].path) {
      inputs.push_back(inputs.back());
      continue;
    }
    Result<AnalyzedInput> read = AnalyzeForDiff(specs[i].path);
    if (!read.ok()) return read.status().WithPrefix(name(i));
    if (!inputs.empty() && read->kind != inputs.front().kind) {
      return Status::InvalidArgument(fmt::format(
          "diff: {} ({}) is {} but {} ({}) is {}: compare inputs of one kind (two "
          "snapshots, two allocator traces or two request traces; `fragscope convert` turns a "
          "snapshot into a trace)",
          name(0), specs[0].path, WithArticle(inputs.front().kind), name(i), specs[i].path,
          WithArticle(read->kind)));
    }
    inputs.push_back(std::move(*read));
  }
  std::vector<analysis::RunFigures> runs;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    Result<analysis::RunFigures> run = FiguresFor(specs[i], std::move(inputs[i]));
    if (!run.ok()) return run.status().WithPrefix(name(i));
    runs.push_back(std::move(*run));
  }
  return runs;
}

Command AddDiffCommand(CLI::App& app) {
  auto flags = std::make_shared<DiffFlags>();
  CLI::App* sub = app.add_subcommand("diff", std::string(kDiffDescription));
  sub->footer(std::string(kDiffFooter));
  AddMaxInputBytesOption(*sub);
  sub->add_option("FILES", flags->paths,
                  "A and B, or one input with --alloc-conf, or the per-rank dumps of one job: "
                  "PyTorch memory snapshots or traces (plain, .gz or .zst)")
      ->type_name("PATH")
      ->required();
  sub->add_option("--alloc-conf", flags->alloc_conf,
                  "PYTORCH_CUDA_ALLOC_CONF to replay B under (one input: B is it under these)")
      ->type_name("STR");
  sub->add_option("--alloc-conf-a", flags->alloc_conf_a,
                  "PYTORCH_CUDA_ALLOC_CONF to replay A under (default: its own settings)")
      ->type_name("STR");
  sub->add_option("--capacity", flags->capacity,
                  "Replay on a device of this size (request traces: default the header's)")
      ->type_name("SIZE")
      ->check(CapacitySize());
  sub->add_option("--used-by-others", flags->used_by_others,
                  "Device memory used outside PyTorch, for the replays")
      ->type_name("SIZE")
      ->check(ByteSize(0));
  AddTorchVersionOption(*sub, &flags->torch_version);
  sub->add_option("--format", flags->format, "text, or json (schema fragscope.diff)")
      ->type_name("FORMAT")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  sub->add_flag("--json", flags->json, "The same as --format json");
  sub->add_option("--top", flags->top, "Call sites listed per device (those that changed most)")
      ->type_name("N")
      ->check(IntegerAtLeast(1))
      ->capture_default_str();
  return Command{sub, [flags] { return RunDiff(*flags); }};
}

}  // namespace fragscope::cli
