#include "report_command.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "analysis/explain.h"
#include "analysis/layout_frames.h"
#include "analysis/trace_analyzer.h"
#include "analysis/tune.h"
#include "analyze_command.h"
#include "cli_util.h"
#include "common/safe_file.h"
#include "common/units.h"
#include "diff_command.h"
#include "model/alloc_conf.h"
#include "replay_command.h"
#include "sinks/html/html_report.h"
#include "sinks/report/diff_report.h"
#include "sources/snapshot/snapshot_requests.h"

namespace fragscope::cli {
namespace {

struct ReportCommandFlags {
  std::string path;
  std::string output = "report.html";
  bool output_named = false;  // -o was given (else `output` is the default name)
  std::int32_t device = -1;
  std::uint64_t every_events = 0;
  std::string stranded_threshold;
  double stranded_quantile = 0.5;
  std::string capacity;
  std::string used_by_others;
  std::optional<std::string> alloc_conf;
  std::string torch_version = "newest";
  bool forecast = false;
  analysis::ForecastOptions forecast_options;
  std::size_t max_frames = 64;
  std::uint64_t max_map_blocks = 400'000;
  std::string max_size = "64MiB";
  bool verify = true;
  bool tune = false;
  std::string compare;  // --compare B: empty for none
};

constexpr std::string_view kReportDescription =
    "Write one self-contained HTML page: verdict, timeline charts, memory map, OOM panel";

constexpr std::string_view kReportFooter =
    R"(Writes one HTML file (no network needed to view it: the data, script and style are
inside) that shows, per device:
  * the verdict in one sentence (fits, or out of memory at step N: fragmentation or shortage,
    with the figures) and the key numbers (peaks, worst fragmentation, smallest largest free
    block against the typical request, smallest max allocatable);
  * the timeline of reserved, allocated, requested, cached free, largest free block, max
    allocatable and the fragmentation ratio (the OOM risk levels with --forecast), zoomable
    (drag to zoom, double-click to reset), with the OOM events marked;
  * active memory by call site: the allocated bytes of the top 8 call sites and of the rest,
    stacked, at every sample, computed from every event;
  * the memory map at the moment you click on the timeline: one row per segment, blocks
    coloured allocated / pending free / free / stranded; hover a block for its address, size,
    requested size, stream and call site; click it for its whole stack (a snapshot's; the
    allocator's and dispatcher's frames folded) and when it was allocated and freed;
  * a search box: blocks whose stack names a function or file ("attention", "model.py") or of
    a size (">=64MiB") are highlighted in the map, and their total is charted over the kept
    moments;
  * every chart's x axis says what it counts: seconds when the input has times, steps when it
    has step markers, the event index otherwise;
  * the OOM panel: the failing request against the free blocks of its pool, and explain's
    verdict and ranked remedies (docs/explain.md);
  * the call sites whose live blocks strand the most free memory;
  * with --compare B: this input (A) and B side by side, as `fragscope diff A B` gives them
    (peaks, worst fragmentation, stranded bytes, first OOMs, the call sites whose memory
    changed most).

The map is kept at up to --max-frames moments spread over the run (and just before each OOM,
and at the end); a click shows the nearest kept moment at or before it. docs/report.md says how
the file is bounded.

FILE is anything `analyze` reads: an allocator trace, a PyTorch memory snapshot (pickle or
JSON), or a request trace, which is replayed through the simulator (as `fragscope replay`)
on --capacity bytes (or the header's capacity) under --alloc-conf (or the header's settings).
A snapshot with --capacity or --alloc-conf is replayed too: its requests under those
settings, on that device.

The page is written to a new temporary file next to OUT and renamed to OUT when complete. A
symbolic link at the default report.html is refused; a link named with -o is followed to its
existing file; a link to nothing is refused (docs/user-guide.md, "Files and links").

Examples:
  fragscope report snapshot.pickle -o report.html
  fragscope report requests.jsonl.gz --capacity 16GiB -o oom.html
  fragscope report requests.jsonl.gz --capacity 16GiB --alloc-conf expandable_segments:True
  fragscope report trace.jsonl.gz --forecast --device 1
  fragscope report huge.pickle --max-frames 16 --every 10000
  fragscope report after.pickle --compare before.pickle -o compare.html

Exit status: 0 when the report was written; 2 for bad input or usage, or when the report would
exceed --max-size (nothing is written; the message names the options that make it smaller),
or for a refused output link; 1 when the output file cannot be written.)";

// Inputs without step markers shorter than this are sampled every total/200 events.
constexpr std::uint64_t kShortInputEvents = 200'000;

// The explain verdict and remedies of a device's first OOM, from the figures the diagnosis has,
// on a device of `capacity` bytes.
analysis::OomExplanation ExplainFirstOom(const analysis::DeviceReport& d, std::uint64_t capacity) {
  const analysis::OomDiagnosis& o = d.oom_diagnoses.front();
  OomMessage m;
  m.backend = "CUDA";
  m.gpu = d.device;
  m.wording = OomWording::kCapacityOf;
  m.tried = o.rounded;
  m.total = capacity;
  m.free = o.device_free.value_or(capacity > o.reserved ? capacity - o.reserved : 0);
  m.allocated = o.allocated;
  m.unallocated = o.reserved > o.allocated ? o.reserved - o.allocated : 0;
  m.text =
      fmt::format("(from the diagnosis of the oom event at event {})", FormatCount(o.event_index));
  return analysis::ExplainOom(m);
}

// The request events of the input, read once for the replays of explain's remedies and tune,
// with the allocator settings they are replayed under (`conf`, else a snapshot's recorded
// settings, else PyTorch's defaults).
struct ReportRequests {
  std::vector<Event> events;
  std::map<std::int32_t, std::size_t> recorded_from;    // pipeline::RequestEvents::recorded_from
  std::optional<std::uint64_t> recorded_device_allocs;  // likewise
  std::string conf;
  std::map<std::int32_t, model::RecordedAddresses> addresses;  // a snapshot's
  std::vector<std::string> notes;
};
// Nothing (not an error) for an allocator trace: it records no requests to replay.
Result<std::optional<ReportRequests>> ReadRequests(const std::string& path,
                                                   const std::optional<std::string>& conf,
                                                   model::ConfigVersion version) {
  Result<OpenedInput> opened = OpenInput(path);
  if (!opened.ok()) return opened.status();
  ReportRequests out;
  out.conf = conf.value_or("");
  if (opened->snapshot != nullptr) {
    out.addresses = sources::RecordedSegmentAddresses(*opened->snapshot);
    if (!conf) {
      Result<RecordedSettings> recorded =
          ReadRecordedSettings(*opened->snapshot, path, version, &out.notes);
      if (!recorded.ok()) return recorded.status();
      out.conf = recorded->conf;
    }
  } else if (opened->reader->header().kind == TraceKind::kAllocator) {
    return std::optional<ReportRequests>();
  }
  Result<model::AllocatorConfig> config = model::ParseUserAllocatorConf(out.conf, version);
  if (!config.ok()) return config.status();
  out.conf = model::ToConfString(*config);  // canonical: VerifyRemedies reads it again
  Result<pipeline::RequestEvents> events =
      ReadRequestEvents(*opened, path, config->Rules(), &out.notes);
  if (!events.ok()) return events.status();
  out.events = std::move(events->events);
  out.recorded_from = std::move(events->recorded_from);
  out.recorded_device_allocs = events->recorded_device_allocs;
  return std::optional<ReportRequests>(std::move(out));
}

// Replays the requests under each of `e`'s remedies (explain's VerifyRemedies) on a device of
// `capacity` bytes.
Status VerifyFirstOom(const ReportCommandFlags& flags, const ReportRequests& requests,
                      std::uint64_t capacity, std::uint64_t used_by_others,
                      analysis::OomExplanation* e) {
  analysis::VerifyOptions options;
  options.version = TorchVersion(flags.torch_version);
  options.capacity_bytes = capacity;
  options.used_by_others_bytes = used_by_others;
  options.current_conf = requests.conf;
  options.addresses = requests.addresses;
  Result<analysis::Verification> verified = analysis::VerifyRemedies(requests.events, options, e);
  if (!verified.ok()) {
    return Status::InvalidArgument(fmt::format("{}: {}", flags.path, verified.status().message()));
  }
  for (const std::string& note : requests.notes) e->notes.push_back("replay: " + note);
  return Status::Ok();
}

int RunReport(const ReportCommandFlags& flags) {
  analysis::AnalysisOptions options;
  if (flags.device >= 0) options.device = flags.device;
  options.every_events = flags.every_events;
  options.stranded_quantile = flags.stranded_quantile;
  if (flags.forecast) {
    if (Status s = analysis::ValidateForecastOptions(flags.forecast_options); !s.ok()) {
      return BadInput("--forecast: " + s.message());
    }
    options.forecast = flags.forecast_options;
  }
  if (!flags.stranded_threshold.empty()) {
    Result<std::uint64_t> threshold = ParseSize(flags.stranded_threshold);
    if (!threshold.ok()) return BadInput("--stranded-threshold: " + threshold.status().message());
    options.stranded_threshold = *threshold;
  }
  Result<std::optional<std::uint64_t>> capacity = OptionalCapacity("--capacity", flags.capacity);
  if (!capacity.ok()) return BadInput(capacity.status().message());
  Result<std::optional<std::uint64_t>> others =
      OptionalSize("--used-by-others", flags.used_by_others);
  if (!others.ok()) return BadInput(others.status().message());
  if (Status fits = CheckUsedByOthers(*capacity, *others); !fits.ok())
    return BadInput(fits.message());
  Result<std::uint64_t> max_size = ParseSize(flags.max_size);
  if (!max_size.ok()) return BadInput("--max-size: " + max_size.status().message());

  analysis::LayoutFramesOptions frame_options;
  frame_options.max_frames = flags.max_frames;
  frame_options.max_blocks = flags.max_map_blocks;
  frame_options.device = options.device;
  frame_options.stranded_threshold = options.stranded_threshold;
  frame_options.stranded_quantile = options.stranded_quantile;

  // The layouts of the events an analysis accepts (of the input, or of its replay). The
  // recorder is made at the first event, with that trace's header (its allocator settings: the
  // rounding rules the analyzer's model uses too). Its budget (--max-map-blocks) ends the
  // analysis as soon as the maps it must keep outgrow it.
  std::vector<Frame> call_sites;
  std::vector<std::vector<std::uint32_t>> stacks;  // a snapshot's (Event::stack)
  std::vector<analysis::DeviceFrames> frames;
  std::unique_ptr<analysis::LayoutRecorder> recorder;
  Status recorder_status;  // a header whose settings the recorder refuses
  auto record = [&](const TraceHeader& header, const Event& e, bool start_state) -> Status {
    if (recorder == nullptr && recorder_status.ok()) {
      Result<std::unique_ptr<analysis::LayoutRecorder>> created =
          analysis::LayoutRecorder::Create(header, frame_options);
      if (!created.ok()) {
        recorder_status = created.status();
        return Status::Ok();
      }
      recorder = std::move(*created);
    }
    return recorder != nullptr ? recorder->Consume(e, start_state) : Status::Ok();
  };
  auto finish_recording = [&]() -> Status {
    if (!recorder_status.ok()) return recorder_status;
    frames.clear();
    if (recorder != nullptr) {
      Result<std::vector<analysis::DeviceFrames>> finished = recorder->Finish();
      if (!finished.ok()) return finished.status().WithPrefix(flags.path);
      frames = std::move(*finished);
    }
    recorder.reset();
    return Status::Ok();
  };
  // Analyzes an allocator trace or snapshot at `path` while recording its layouts.
  auto analyze_with_frames = [&](const std::string& path) -> Result<analysis::AnalysisResult> {
    recorder.reset();
    Result<analysis::AnalysisResult> analyzed =
        AnalyzeInput(path, options, TraceLimits{}, 1, record, &call_sites, &stacks);
    if (!analyzed.ok()) return analyzed.status();
    if (Status s = finish_recording(); !s.ok()) return s;
    return analyzed;
  };

  const bool replay_asked = capacity->has_value() || flags.alloc_conf.has_value();
  std::optional<analysis::AnalysisResult> result;
  std::optional<ReplayRun> run;
  if (!replay_asked) {
    Result<analysis::AnalysisResult> analyzed = analyze_with_frames(flags.path);
    if (!analyzed.ok()) return BadInput(analyzed.status().message());
    // A short input without step markers gets a few samples of 1,000 events: read it again
    // (it is short) with about 200 samples, so that its charts show how it went.
    if (analyzed->timeline_unit != "step" && flags.every_events == 0 &&
        analyzed->total_events < kShortInputEvents) {
      options.every_events = std::max<std::uint64_t>(1, analyzed->total_events / 200);
      analyzed = analyze_with_frames(flags.path);
      if (!analyzed.ok()) return BadInput(analyzed.status().message());
    }
    if (analyzed->kind != TraceKind::kRequest) result = std::move(*analyzed);
  }
  if (!result) {
    // A request trace (or a snapshot under other settings): replayed as `replay` does, with
    // the layouts recorded from the simulated events as they are analyzed (no file in between:
    // nothing another user could replace before it is read again).
    ReplayRequest request;
    request.path = flags.path;
    request.capacity = *capacity;
    request.used_by_others = *others;
    request.alloc_conf = flags.alloc_conf;
    request.version = TorchVersion(flags.torch_version);
    request.options = options;
    // `record` runs on the analysis thread (the only one that feeds it), done when this returns.
    request.tap = record;
    call_sites.clear();  // simulated events name no call site
    stacks.clear();
    recorder.reset();
    Result<ReplayRun> replayed = ReplayInput(request);
    if (!replayed.ok()) return BadInput(replayed.status().message());
    if (Status s = finish_recording(); !s.ok()) return BadInput(s.message());
    run = std::move(*replayed);
    result = std::move(run->result);
  }
  if (flags.device >= 0 && result->devices.empty()) {
    return BadInput(
        fmt::format("{}: device {} has no events (--device)", flags.path, flags.device));
  }

  sinks::HtmlReportInput input;
  input.result = &*result;
  if (run) input.replay = &run->replay;
  input.frames = std::move(frames);
  input.call_sites = std::move(call_sites);
  input.stacks = std::move(stacks);
  // The capacity of each device with an OOM: the replay's, the input's, else (a snapshot) the
  // one its recorded OOM shows (reserved + driver free, as `replay` takes it).
  std::map<std::int32_t, std::uint64_t> capacities, used_by_others;
  TraceHeader unknown;
  for (const analysis::DeviceReport& d : result->devices) {
    if (d.oom_diagnoses.empty()) continue;
    if (d.capacity_bytes) capacities[d.device] = *d.capacity_bytes;
    if (!d.capacity_bytes && !run)
      unknown.devices.push_back(DeviceInfo{d.device, d.name, std::nullopt, std::nullopt});
  }
  if (run) {
    for (const analysis::DeviceReplay& r : run->replay.devices) {
      capacities[r.device] = r.capacity_bytes;
      used_by_others[r.device] = r.used_by_others_bytes;
    }
  }
  if (!unknown.devices.empty()) {
    const RecordedCapacities found = CapacitiesFromRecordedOoms(
        *result, unknown, "get no remedies (give --capacity to replay the input)", &result->notes);
    capacities.insert(found.bytes.begin(), found.bytes.end());
  }
  // Explain's remedies are replayed too (as `explain --trace` does), and --tune ranks the
  // default grid of settings (as `tune` does), when the input records requests.
  std::optional<ReportRequests> requests;
  if (flags.tune || (flags.verify && !capacities.empty())) {
    std::optional<std::string> conf = flags.alloc_conf;
    if (run && !run->replay.devices.empty()) conf = run->replay.devices.front().alloc_conf;
    Result<std::optional<ReportRequests>> read =
        ReadRequests(flags.path, conf, TorchVersion(flags.torch_version));
    if (!read.ok()) return BadInput(read.status().message());
    requests = std::move(*read);
  }
  for (const analysis::DeviceReport& d : result->devices) {
    const auto device_capacity = capacities.find(d.device);
    if (d.oom_diagnoses.empty() || device_capacity == capacities.end()) continue;
    // An OOM at the simulator's own address-space limit has no remedy to try: no setting of
    // PyTorch's would change a limit of the model (the verdict says what it is).
    if (d.oom_diagnoses.front().cause == analysis::OomCause::kAddressSpace) continue;
    analysis::OomExplanation e = ExplainFirstOom(d, device_capacity->second);
    if (requests && flags.verify) {
      const auto outside = used_by_others.find(d.device);
      if (Status s = VerifyFirstOom(flags, *requests, device_capacity->second,
                                    outside == used_by_others.end() ? 0 : outside->second, &e);
          !s.ok()) {
        return BadInput(s.message());
      }
    }
    input.explanations.emplace(d.device, std::move(e));
  }
  std::vector<analysis::TuneOutcome> tuned;
  if (flags.tune) {
    if (!requests || !run) {
      return BadInput(fmt::format(
          "{}: --tune replays the input's requests: give --capacity SIZE (a request trace or "
          "snapshot) so that the report is of a replay",
          flags.path));
    }
    const analysis::DeviceReplay& first = run->replay.devices.front();
    analysis::TuneOptions tune;
    tune.capacity_bytes = first.capacity_bytes;
    tune.used_by_others_bytes = first.used_by_others_bytes;
    tune.version = TorchVersion(flags.torch_version);
    tune.addresses = requests->addresses;
    tune.recorded_from = requests->recorded_from;
    tune.recorded_device_allocs = requests->recorded_device_allocs;
    for (const analysis::DeviceReplay& r : run->replay.devices) {
      tune.device_capacity_bytes[r.device] = r.capacity_bytes;
    }
    Result<std::vector<analysis::TuneOutcome>> ranked = analysis::Tune(requests->events, tune);
    if (!ranked.ok()) return BadInput(fmt::format("{}: {}", flags.path, ranked.status().message()));
    tuned = std::move(*ranked);
    input.tune = &tuned;
    input.tune_cannot_rank = analysis::TuneCannotRank(tuned, tune);
  }
  // --compare B: this input (A) and B side by side, as `diff` gives them, replayed when this
  // report is (the same capacity and settings for A; B under its own settings).
  if (!flags.compare.empty()) {
    RunSpec a;
    a.path = flags.path;
    a.alloc_conf = flags.alloc_conf;
    a.capacity = *capacity;
    a.used_by_others = *others;
    a.version = TorchVersion(flags.torch_version);
    RunSpec b = a;
    b.path = flags.compare;
    b.alloc_conf.reset();
    Result<std::vector<analysis::RunFigures>> runs = ReadRuns({a, b});
    if (!runs.ok()) return BadInput("--compare: " + runs.status().message());
    input.compare_json = sinks::RenderDiffJson(
        analysis::CompareRuns(std::move((*runs)[0]), std::move((*runs)[1])), -1);
  }
  input.command = "fragscope report " + flags.path;
  const std::string html = sinks::RenderHtml(input);
  if (html.size() > *max_size) {
    return BadInput(fmt::format(
        "{}: the report would be {} (over --max-size {}); nothing was written. Make it smaller "
        "with --max-frames N (memory maps kept, now {}), --max-map-blocks N (blocks of all maps, "
        "now {}), --device N (one device), --every N (coarser timeline), or raise --max-size",
        flags.path, FormatBytes(html.size()), FormatBytes(*max_size), flags.max_frames,
        flags.max_map_blocks));
  }
  // Written whole to a new temporary file, then renamed: never a half-written report, and never
  // through a link at the default name (common/safe_file.h).
  if (Status written = WriteFileSafely(
          flags.output, html,
          flags.output_named ? OutputOrigin::kNamedByUser : OutputOrigin::kChosenByTool);
      !written.ok()) {
    return OutputFailure(written);
  }
  PrintSafe(stderr, fmt::format("fragscope: wrote {} ({}): {}\n", flags.output,
                                FormatBytes(html.size()), sinks::ReportVerdict(*result)));
  return kExitOk;
}

}  // namespace

Command AddReportCommand(CLI::App& app) {
  auto flags = std::make_shared<ReportCommandFlags>();
  CLI::App* sub = app.add_subcommand("report", std::string(kReportDescription));
  sub->footer(std::string(kReportFooter));
  AddMaxInputBytesOption(*sub);
  sub->add_option("FILE", flags->path,
                  "An allocator or request trace (JSON Lines) or a PyTorch memory snapshot "
                  "(pickle or JSON); plain, .gz or .zst")
      ->type_name("PATH")
      ->required();
  sub->add_option("-o,--output", flags->output, "The HTML file to write")
      ->type_name("OUT")
      ->capture_default_str();
  sub->add_option("--device", flags->device, "Report only this device index")
      ->type_name("N")
      ->check(IntegerAtLeast(0));
  sub->add_option("--every", flags->every_events,
                  "One timeline sample per N events instead of per step")
      ->type_name("N")
      ->check(IntegerAtLeast(1));
  sub->add_option("--stranded-threshold", flags->stranded_threshold,
                  "Fixed stranding threshold for both pools, e.g. 2MiB")
      ->type_name("SIZE")
      ->check(ByteSize(0));
  sub->add_option("--stranded-quantile", flags->stranded_quantile,
                  "Else: this quantile of recent request sizes, per pool")
      ->type_name("Q")
      ->transform(Fraction())
      ->capture_default_str();
  sub->add_option("--capacity", flags->capacity,
                  "Replay on a device of this size (request traces: default the header's)")
      ->type_name("SIZE")
      ->check(CapacitySize());
  sub->add_option("--used-by-others", flags->used_by_others,
                  "Device memory used outside PyTorch, for the replay")
      ->type_name("SIZE")
      ->check(ByteSize(0));
  sub->add_option("--alloc-conf", flags->alloc_conf,
                  "PYTORCH_CUDA_ALLOC_CONF to replay under (default: the input's settings)")
      ->type_name("STR");
  AddTorchVersionOption(*sub, &flags->torch_version);
  AddForecastOptions(*sub, &flags->forecast, &flags->forecast_options);
  sub->add_flag("!--no-verify", flags->verify,
                "Replayed inputs: do not replay each remedy of an OOM (explain's check)");
  sub->add_flag("--tune", flags->tune,
                "Replayed inputs: rank tune's default grid of allocator settings on the device");
  sub->add_option("--max-frames", flags->max_frames,
                  "Moments of the run whose memory map is kept (plus each OOM and the end)")
      ->type_name("N")
      ->check(IntegerAtLeast(2))
      ->capture_default_str();
  sub->add_option("--max-map-blocks", flags->max_map_blocks,
                  "Blocks of all kept maps together; fewer moments are kept beyond it")
      ->type_name("N")
      ->check(IntegerAtLeast(1))
      ->capture_default_str();
  sub->add_option("--max-size", flags->max_size,
                  "Refuse to write a report larger than this (nothing is written)")
      ->type_name("SIZE")
      ->check(ByteSize(1))
      ->capture_default_str();
  sub->add_option("--compare", flags->compare,
                  "Also compare this input (A) with B, as `fragscope diff A B` does")
      ->type_name("B");
  CLI::Option* output_option = sub->get_option("--output");
  return Command{sub, [flags, output_option] {
                   flags->output_named = output_option->count() > 0;
                   return RunReport(*flags);
                 }};
}

}  // namespace fragscope::cli
