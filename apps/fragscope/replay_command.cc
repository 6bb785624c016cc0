#include "replay_command.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "analysis/analyzer_thread.h"
#include "analysis/replay_result.h"
#include "analysis/trace_analyzer.h"
#include "cli_util.h"
#include "common/units.h"
#include "fragscope/trace.h"
#include "model/alloc_conf.h"
#include "model/request_extractor.h"
#include "model/request_replayer.h"
#include "sinks/report/replay_report.h"
#include "snapshot_replay.h"

namespace fragscope::cli {
namespace {

struct ReplayFlags {
  std::string path;
  std::string capacity;                   // size; empty: from the trace header
  std::string used_by_others;             // size; empty: from the trace header, else 0
  std::optional<std::string> alloc_conf;  // unset: the header's allocator_settings
  std::string torch_version = "newest";
  bool continue_after_oom = false;
  std::string emit;
  std::string addresses;  // empty: recorded for a snapshot
  unsigned threads = 0;
  ReportFlags report;
  bool forecast = false;
  analysis::ForecastOptions forecast_options;
};

constexpr std::string_view kDescription =
    "Replay a request trace through the caching-allocator simulator on a virtual GPU";

constexpr std::string_view kFooter =
    R"(Replays what the program asked for (a request trace: allocs and frees of tensors, plus
replay controls such as record_stream, empty_cache, set_memory_fraction) through a model of
PyTorch's CUDA caching allocator (docs/simulator.md) on a GPU of --capacity bytes, and reports:
whether it runs out of memory and where (request event, step) with the exact message PyTorch
would print; the simulator's memory_stats(); then the same analysis as `fragscope analyze` of
the allocator trace the simulation produced (peaks, fragmentation per step, memory map).

After an out-of-memory error the replay stops, as an uncaught torch.OutOfMemoryError ends a
job. With --continue-after-oom it goes on as if the program caught the error: the failed
tensor never exists and its later free is ignored.

TRACE may be a PyTorch memory snapshot: its recorded requests are replayed under the
allocator settings it recorded (--alloc-conf overrides) on an unlimited device (--capacity to
test a size), and the report compares the simulation with what the real allocator did: final
segments matched by layout and by size, reserved memory at the end and at its peak
(docs/snapshots.md). Its segments go where the real driver put them, as the file recorded, so
that free blocks of equal size in different segments are chosen in the recorded order; with
--addresses simulated the simulator places them by its own rule (docs/simulator.md).

--forecast runs the OOM forecaster (docs/forecast.md) over the simulated run's steps, as a
live agent would have: on a capacity that runs out of memory, it shows how many steps ahead
the warning would have come.

Sizes accept units: 80GiB, 40GB (decimal), 512MiB, 21.94GiB, "11.03 GiB", or plain bytes.
--alloc-conf takes any string PyTorch accepts, and a pasted PYTORCH_CUDA_ALLOC_CONF=... line.

Examples:
  fragscope replay trace.jsonl.gz --capacity 40GiB
  fragscope replay trace.jsonl.gz --capacity 16GiB --alloc-conf expandable_segments:True
  fragscope replay trace.jsonl.gz --capacity 24GiB --used-by-others 600MiB --json | jq .oom
  fragscope replay trace.jsonl.gz --capacity 24GiB --emit simulated.jsonl.zst
  fragscope replay trace.jsonl.gz --capacity 16GiB --forecast
  fragscope replay snapshot.pickle
  fragscope replay snapshot.pickle --json | jq .fidelity
  fragscope replay snapshot.pickle --capacity 40GiB --alloc-conf expandable_segments:True

Exit status: 0 if the trace fits, 1 if it runs out of memory, 2 for bad input or usage.)";

// The simulator's allocation retries so far (memory_stats' num_alloc_retries).
std::optional<std::uint64_t> SimAllocRetries(const model::CachingAllocatorSim* sim) {
  if (sim == nullptr) return std::nullopt;
  return static_cast<std::uint64_t>(std::max<std::int64_t>(sim->stats().num_alloc_retries, 0));
}

}  // namespace

Result<ReplayRun> ReplayInput(const ReplayRequest& request) {
  std::optional<std::uint64_t> capacity = request.capacity;
  const std::optional<std::uint64_t>& used_by_others = request.used_by_others;
  const model::ConfigVersion version = request.version;
  const std::string& path = request.path;

  Result<OpenedInput> opened = OpenInput(path);
  if (!opened.ok()) return Status::InvalidArgument(opened.status().message());
  TraceReader& reader = *opened->reader;
  sources::SnapshotReader* snapshot = opened->snapshot;
  TraceHeader header = reader.header();
  std::vector<std::string> notes;
  if (snapshot == nullptr && header.kind == TraceKind::kAllocator) {
    return Status::InvalidArgument(
        fmt::format("{}: this is an allocator trace (header kind \"allocator\"); "
                    "replay takes a request trace (`fragscope convert {} -o requests.jsonl --to "
                    "requests` makes one) or a snapshot. `fragscope analyze` reads allocator "
                    "traces",
                    path, path));
  }
  std::optional<std::string> conf_text = request.alloc_conf;  // unset: the header's settings
  // A snapshot: its requests are replayed under the settings it recorded (unless told), after
  // a first pass over the recorded run for its peaks and OOMs.
  std::optional<analysis::AnalysisResult> real;
  std::vector<std::int32_t> unlimited_devices;
  std::map<std::int32_t, model::RecordedAddresses> address_plans;  // --addresses recorded
  Result<bool> use_recorded =
      UseRecordedAddresses(request.recorded_addresses, snapshot != nullptr, path);
  if (!use_recorded.ok()) return use_recorded.status();
  const bool recorded_addresses = *use_recorded;
  if (snapshot != nullptr) {
    header.kind = TraceKind::kRequest;
    header.allocator_settings.clear();
    if (!request.alloc_conf) conf_text = snapshot->RecordedConf(&notes);
    Result<analysis::AnalysisResult> analyzed = AnalyzeRecordedRun(*snapshot, path, &notes);
    if (!analyzed.ok()) return analyzed.status();
    real = std::move(*analyzed);
    if (recorded_addresses) address_plans = sources::RecordedSegmentAddresses(*snapshot);
    if (!capacity) {
      const RecordedCapacities found =
          CapacitiesFromRecordedOoms(*real, header, "are replayed with unlimited memory", &notes);
      for (DeviceInfo& d : header.devices) {
        const auto known = found.bytes.find(d.device);
        d.capacity_bytes =
            known == found.bytes.end() ? analysis::kUnlimitedCapacity : known->second;
      }
      unlimited_devices = found.unknown;
      if (header.devices.empty()) capacity = analysis::kUnlimitedCapacity;  // an empty snapshot
    }
  }
  Result<model::AllocatorConfig> config =
      conf_text ? model::ParseUserAllocatorConf(*conf_text, version)
                : model::ParseAllocatorSettings(header.allocator_settings, version);
  if (!config.ok()) {
    return Status::InvalidArgument((request.alloc_conf
                                        ? std::string("--alloc-conf: ")
                                        : fmt::format("{}:1: allocator_settings: ", path)) +
                                   config.status().message());
  }
  // Every device needs a capacity: the flag, or the header's.
  for (const DeviceInfo& d : header.devices) {
    if (!capacity && !d.capacity_bytes) {
      return Status::InvalidArgument(
          fmt::format("{}: device {} has no capacity_bytes in the header; give "
                      "--capacity SIZE",
                      path, d.device));
    }
  }
  auto sim_options = [&](std::int32_t device) {
    model::SimOptions o;
    o.config = *config;
    o.version = version;
    const DeviceInfo* info = header.FindDevice(device);
    o.driver.capacity_bytes =
        capacity.value_or(info && info->capacity_bytes ? *info->capacity_bytes : 0);
    o.driver.used_by_others_bytes =
        used_by_others.value_or(info ? info->used_by_others_bytes.value_or(0) : 0);
    if (const auto plan = address_plans.find(device); plan != address_plans.end()) {
      plan->second.Attach(&o.driver);
    }
    return o;
  };
  if (!capacity && header.devices.empty()) {
    return Status::InvalidArgument(
        fmt::format("{}: the header names no device capacity; give --capacity SIZE", path));
  }

  // The simulated allocator trace: analyzed, and written with --emit.
  TraceHeader out_header = header;
  out_header.kind = TraceKind::kAllocator;
  out_header.producer = "fragscope replay of " + path;
  for (DeviceInfo& d : out_header.devices) {
    const model::SimOptions o = sim_options(d.device);
    // An unlimited device has no size to report: the analysis reads it as unknown (its max
    // allocatable is then the largest cached block, not a petabyte).
    d.capacity_bytes = o.driver.capacity_bytes >= analysis::kUnlimitedCapacity
                           ? std::nullopt
                           : std::optional<std::uint64_t>(o.driver.capacity_bytes);
    d.used_by_others_bytes = o.driver.used_by_others_bytes;
  }
  if (out_header.devices.empty()) {
    out_header.devices.push_back(DeviceInfo{0, "virtual-gpu", *capacity, used_by_others});
  }
  out_header.allocator_settings = model::ToSettingPairs(*config);

  Result<std::unique_ptr<analysis::TraceAnalyzer>> created =
      analysis::TraceAnalyzer::Create(out_header, request.options);
  if (!created.ok()) return Status::InvalidArgument(created.status().message());
  analysis::TraceAnalyzer& analyzer = **created;

  std::unique_ptr<TraceWriter> writer;
  if (!request.emit.empty()) {
    Result<std::unique_ptr<TraceWriter>> w = TraceWriter::Create(request.emit, out_header);
    if (!w.ok()) return Status::InvalidArgument("--emit: " + w.status().message());
    writer = std::move(*w);
  }

  // Each simulated event is analyzed (and written with --emit): on this thread, or with two
  // threads on a second one while the simulation goes on (analysis/analyzer_thread.h).
  auto analyze = [&](const Event& e) -> Status {
    if (Status s = analyzer.Consume(e); !s.ok()) {
      return Status::Internal("the simulator produced an event the model rejects: " + s.message());
    }
    return writer ? writer->Write(e) : Status::Ok();
  };
  const model::OomPolicy policy = request.continue_after_oom || snapshot != nullptr
                                      ? model::OomPolicy::kContinue
                                      : model::OomPolicy::kStop;
  Status sink_status;
  std::unique_ptr<analysis::AnalyzerThread> analyzer_thread;
  std::unique_ptr<model::RequestReplayer> replayer_holder;
  if (AnalysisThreads(request.threads) >= 2) {
    analyzer_thread = std::make_unique<analysis::AnalyzerThread>(
        analyzer, [&](const Event& e, std::uint64_t) { return analyze(e); });
    replayer_holder =
        std::make_unique<model::RequestReplayer>(sim_options, policy, [&](const Event& e) {
          analyzer_thread->Send(e, SimAllocRetries(replayer_holder->sim(e.device)));
        });
    analyzer.SetAllocRetrySource(
        [&](std::int32_t device) { return analyzer_thread->AllocRetries(device); });
  } else {
    replayer_holder =
        std::make_unique<model::RequestReplayer>(sim_options, policy, [&](const Event& e) {
          if (sink_status.ok()) sink_status = analyze(e);
        });
    // The timeline's allocation retries come from the simulator's own counter.
    analyzer.SetAllocRetrySource(
        [&](std::int32_t device) { return SimAllocRetries(replayer_holder->sim(device)); });
  }
  model::RequestReplayer& replayer = *replayer_holder;

  auto consume_request = [&](const Event& e) {
    Status s = replayer.Consume(e);
    if (s.ok() && analyzer_thread && analyzer_thread->failed())
      sink_status = analyzer_thread->Finish();
    if (s.ok() && !sink_status.ok()) return sink_status;
    return s;
  };
  Status consumer_status;
  bool stopped_at_oom = false;
  if (snapshot == nullptr) {
    Result<std::uint64_t> read = ReadAllEvents(reader, consume_request, &consumer_status,
                                               [&](const Event& e) { replayer.Prefetch(e); });
    stopped_at_oom = !read.ok() && consumer_status.code() == StatusCode::kOutOfMemory;
    if (!read.ok() && !stopped_at_oom) return Status::InvalidArgument(read.status().message());
  } else {
    // The recorded program went on after its OOMs (it wrote the snapshot), so the replay
    // does too; the OOM request of a device replayed with unlimited memory is left out.
    sources::SnapshotRequests requests(*snapshot, config->Rules(), [&](const Event& e) -> Status {
      Status s = consume_request(e);
      return s.code() == StatusCode::kOutOfMemory ? Status::Ok() : s;
    });
    requests.DropOoms(unlimited_devices);  // the failed request, on a device without a size
    Result<std::uint64_t> read = ReadSnapshotEvents(
        *snapshot, [&](const Event& e) { return requests.Consume(e); }, &notes);
    if (!read.ok()) return Status::InvalidArgument(read.status().message());
    requests.AddNotes(&notes);
  }
  // Everything simulated is analyzed before the analyzer or the writer is read or closed. A
  // failure there (an --emit write error, say) ends the replay even where the snapshot path
  // above went on past its events.
  if (analyzer_thread && sink_status.ok()) sink_status = analyzer_thread->Finish();
  if (!sink_status.ok()) {
    return Status::InvalidArgument(fmt::format("{}: {}", path, sink_status.message()));
  }
  if (writer) {
    if (Status s = writer->Close(); !s.ok())
      return Status::InvalidArgument("--emit: " + s.message());
  }

  analysis::ReplayResult replay;
  replay.trace = path;
  replay.policy = policy;
  replay.stopped_at_oom = stopped_at_oom;
  replay.request_events = replayer.events();
  replay.ooms = replayer.ooms();
  for (const auto& [device, sim] : replayer.devices()) {
    analysis::DeviceReplay d;
    d.device = device;
    const model::SimOptions o = sim_options(device);
    d.capacity_bytes = o.driver.capacity_bytes;
    d.used_by_others_bytes = o.driver.used_by_others_bytes;
    d.alloc_conf = model::ToConfString(sim->config());
    d.memory_stats = sim->stats().Flatten();
    d.segments = sim->MemorySnapshot();
    if (const auto plan = address_plans.find(device); plan != address_plans.end()) {
      notes.push_back(fmt::format(
          "device {}: recorded segment addresses taken: {} of {}; refused (overlapping a "
          "segment still held, or reaching the simulator's own address range): {}; any other "
          "segment was placed by the simulator",
          device, sim->pinned_segments(), plan->second.recorded(), sim->unpinned_segments()));
    }
    replay.devices.push_back(std::move(d));
  }
  replay.notes = std::move(notes);
  if (snapshot != nullptr) {
    for (const analysis::DeviceReplay& d : replay.devices) {
      analysis::DeviceFidelity f =
          analysis::CompareSegments(snapshot->FinalSegments(d.device), d.segments);
      f.device = d.device;
      f.complete_history = snapshot->CompleteHistory(d.device);
      if (recorded_addresses) {
        const auto plan = address_plans.find(d.device);
        f.recorded_addresses = plan == address_plans.end() ? 0 : plan->second.recorded();
        f.addresses_taken = replayer.sim(d.device)->pinned_segments();
      }
      const auto& traces = snapshot->snapshot().device_traces;
      if (static_cast<std::size_t>(d.device) < traces.size()) {
        f.history_entries = traces[static_cast<std::size_t>(d.device)].size();
      }
      const auto peak = d.memory_stats.find("reserved_bytes.all.peak");
      f.sim_peak_reserved =
          peak == d.memory_stats.end() ? 0 : static_cast<std::uint64_t>(peak->second);
      for (const analysis::DeviceReport& r : real->devices) {
        if (r.device == d.device) f.real_peak_reserved = r.peak_reserved.bytes;
      }
      replay.fidelity.push_back(f);
    }
  }
  analysis::AnalysisResult result = analyzer.Finish(path);
  return ReplayRun{std::move(replay), std::move(result)};
}

namespace {

int RunReplay(const ReplayFlags& flags) {
  ReplayRequest request;
  request.path = flags.path;
  Result<std::optional<std::uint64_t>> capacity = OptionalCapacity("--capacity", flags.capacity);
  if (!capacity.ok()) return BadInput(capacity.status().message());
  Result<std::optional<std::uint64_t>> others =
      OptionalSize("--used-by-others", flags.used_by_others);
  if (!others.ok()) return BadInput(others.status().message());
  request.capacity = *capacity;
  request.used_by_others = *others;
  request.alloc_conf = flags.alloc_conf;
  request.version = TorchVersion(flags.torch_version);
  request.continue_after_oom = flags.continue_after_oom;
  request.emit = flags.emit;
  request.recorded_addresses = RecordedAddressesFlag(flags.addresses);
  request.threads = flags.threads;
  ApplyReportFlags(flags.report, &request.options);
  if (flags.forecast) {
    if (Status s = analysis::ValidateForecastOptions(flags.forecast_options); !s.ok()) {
      return BadInput("--forecast: " + s.message());
    }
    request.options.forecast = flags.forecast_options;
  }

  Result<ReplayRun> run = ReplayInput(request);
  if (!run.ok()) return BadInput(run.status().message());
  std::string out;
  if (flags.report.json) {
    sinks::JsonOptions json;
    json.include_layout = !flags.report.no_map;
    out = sinks::RenderReplayJson(run->replay, run->result, json);
  } else {
    out = sinks::RenderReplayText(run->replay, run->result, TextOptionsFor(flags.report));
  }
  const int written = WriteReport(out);
  if (written != kExitOk) return written;
  return run->replay.ooms.empty() ? kExitOk : kExitFailure;
}

}  // namespace

Command AddReplayCommand(CLI::App& app) {
  auto flags = std::make_shared<ReplayFlags>();
  CLI::App* sub = app.add_subcommand("replay", std::string(kDescription));
  sub->footer(std::string(kFooter));
  sub->add_option("TRACE", flags->path,
                  "A request trace (JSON Lines) or a PyTorch memory snapshot; plain, .gz or .zst")
      ->type_name("PATH")
      ->required();
  sub->add_option("--capacity", flags->capacity,
                  "Device memory of the virtual GPU (required unless the header gives it)")
      ->type_name("SIZE")
      ->check(CapacitySize());
  sub->add_option("--used-by-others", flags->used_by_others,
                  "Device memory used outside PyTorch: CUDA context, NCCL, other processes")
      ->type_name("SIZE")
      ->check(ByteSize(0));
  sub->add_option("--alloc-conf", flags->alloc_conf,
                  "PYTORCH_CUDA_ALLOC_CONF to simulate (default: the trace header's settings)")
      ->type_name("STR");
  AddTorchVersionOption(*sub, &flags->torch_version);
  sub->add_flag("--continue-after-oom", flags->continue_after_oom,
                "Go on after an OOM as if the program caught it");
  sub->add_option("--emit", flags->emit,
                  "Also write the simulated allocator trace (.jsonl, .jsonl.gz, .jsonl.zst)")
      ->type_name("OUT");
  AddAddressesOption(*sub, &flags->addresses);
  sub->add_option("--threads", flags->threads,
                  "2: analyze the simulated events on a second thread while simulating (same "
                  "report, sooner); 1: one thread; 0: 2 if the machine has 2+ hardware threads")
      ->type_name("N")
      ->default_val(0);
  AddReportOptions(*sub, &flags->report);
  AddForecastOptions(*sub, &flags->forecast, &flags->forecast_options);
  return Command{sub, [flags] { return RunReplay(*flags); }};
}

}  // namespace fragscope::cli
