#include "pipeline/replay.h"

#include <algorithm>
#include <memory>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "analysis/analyzer_thread.h"
#include "analysis/fidelity.h"
#include "common/units.h"
#include "model/request_replayer.h"
#include "pipeline/input.h"
#include "sources/snapshot/snapshot_requests.h"

namespace fragscope::pipeline {
namespace {

// The analysis diagnoses each simulated oom event from the memory state alone; an OOM the
// simulator raised because its modelled address space was full, with device memory free, would
// read as fragmentation. The device's oom events and the replayer's OOMs are the same failures
// in the same order (a request of 1 EiB or more fails before the allocator runs and has no
// event, so it is skipped); the ones at the model's limit get their own cause.
void MarkAddressSpaceOoms(const std::vector<model::ReplayOom>& ooms,
                          analysis::AnalysisResult* result) {
  for (analysis::DeviceReport& r : result->devices) {
    std::size_t i = 0;
    for (const model::ReplayOom& oom : ooms) {
      if (oom.device != r.device || oom.details.rounded == 0) continue;
      if (i == r.oom_diagnoses.size()) break;
      if (oom.details.address_space_full) {
        r.oom_diagnoses[i].cause = analysis::OomCause::kAddressSpace;
      }
      ++i;
    }
  }
}

// The simulator's allocation retries so far (memory_stats' num_alloc_retries).
std::optional<std::uint64_t> SimAllocRetries(const model::CachingAllocatorSim* sim) {
  if (sim == nullptr) return std::nullopt;
  return static_cast<std::uint64_t>(std::max<std::int64_t>(sim->stats().num_alloc_retries, 0));
}

// A replay of a snapshot asks for some of the start state's live blocks by their block size:
// their recorded request would round to a smaller block (an unsplit remainder kept with it),
// and the replay must carve the recorded layout. It then counts those blocks whole as
// requested, so its requested bytes (and internal waste) differ from the recorded run's. Says
// which figure is which and why, per device, when they differ.
void AddRequestedBytesNotes(const sources::SnapshotReader& snapshot,
                            const model::AllocatorRules& rules,
                            const analysis::AnalysisResult& recorded,
                            const analysis::AnalysisResult& replayed,
                            std::vector<std::string>* notes) {
  for (const analysis::DeviceReport& sim : replayed.devices) {
    const analysis::DeviceReport* real = nullptr;
    for (const analysis::DeviceReport& r : recorded.devices) {
      if (r.device == sim.device) real = &r;
    }
    if (real == nullptr) continue;
    if (sim.peak_live_requested.bytes == real->peak_live_requested.bytes &&
        sim.live_requested_bytes == real->live_requested_bytes) {
      continue;
    }
    std::uint64_t blocks = 0, extra = 0;
    for (const Event& e : snapshot.start_events(sim.device)) {
      if (e.action != Action::kBlock || e.block_size <= e.size) continue;
      if (rules.RoundSize(e.size) == e.block_size) continue;  // asked for as recorded
      ++blocks;
      extra += e.block_size - e.size;
    }
    std::string why =
        blocks > 0
            ? fmt::format(
                  "the replay asks for {} of the start state's live blocks by their block size "
                  "({} more than their recorded requests), because their requests would round "
                  "to smaller blocks (an unsplit remainder was kept with them) and the replay "
                  "must carve the recorded layout; it counts those blocks whole as requested",
                  blocks, FormatBytes(extra))
            : "the simulated allocator rounded some requests otherwise than the recorded run";
    notes->push_back(fmt::format(
        "device {}: requested bytes are the replay's, not the recorded run's: peak live "
        "requested {} replayed vs {} recorded, {} vs {} at the end. Why: {}. `fragscope "
        "analyze` of the snapshot gives the recorded requests (and internal waste)",
        sim.device, FormatBytes(sim.peak_live_requested.bytes),
        FormatBytes(real->peak_live_requested.bytes), FormatBytes(sim.live_requested_bytes),
        FormatBytes(real->live_requested_bytes), why));
  }
}

}  // namespace

Result<ReplayRun> ReplayInput(const ReplayRequest& request) {
  if (request.bfc) return ReplayBfcInput(request);
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
  // A capacity beyond the address space the simulator models is replayed as that large, with a
  // note (issue 30 item 5): a header may say 2^60 bytes, and no GPU comes near 32 TiB. The
  // unlimited capacity of a snapshot's devices without a recorded OOM is left as it is.
  {
    constexpr std::uint64_t kModelled = model::kModelledAddressSpaceBytes;
    const auto absurd = [](std::uint64_t bytes) {
      return bytes > kModelled && bytes != analysis::kUnlimitedCapacity;
    };
    std::vector<std::int32_t> clamped;
    std::uint64_t largest = 0;
    if (capacity && absurd(*capacity)) {
      largest = *capacity;
      capacity = kModelled;
    }
    for (DeviceInfo& d : header.devices) {
      if (capacity || !d.capacity_bytes || !absurd(*d.capacity_bytes)) continue;
      largest = std::max(largest, *d.capacity_bytes);
      d.capacity_bytes = kModelled;
      clamped.push_back(d.device);
    }
    if (largest != 0) {
      std::string which = clamped.empty() ? std::string("--capacity") : "device";
      if (clamped.size() > 1) which += "s";
      for (std::size_t i = 0; i < clamped.size() && i < 8; ++i) {
        which += fmt::format("{}{}", i == 0 ? " " : ", ", clamped[i]);
      }
      if (clamped.size() > 8) which += fmt::format(" and {} more", clamped.size() - 8);
      notes.push_back(fmt::format(
          "{}: a capacity of up to {} is more than the simulator models ({} of cudaMalloc'd "
          "segments); replayed as {}",
          which, FormatBytes(largest), FormatBytes(kModelled), FormatBytes(kModelled)));
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
  out_header.allocator_settings.clear();
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
    Result<std::unique_ptr<TraceWriter>> w =
        TraceWriter::Create(request.emit, out_header, request.emit_named_by_user);
    if (!w.ok()) return Status::InvalidArgument("--emit: " + w.status().message());
    writer = std::move(*w);
  }

  // Each simulated event is analyzed (and written with --emit): on this thread, or with two
  // threads on a second one while the simulation goes on (analysis/analyzer_thread.h).
  // `start`: the event rebuilds a snapshot's start state (not part of the run).
  auto analyze = [&](const Event& e, bool start) -> Status {
    if (Status s = start ? analyzer.ConsumeStartState(e) : analyzer.Consume(e); !s.ok()) {
      return Status::Internal("the simulator produced an event the model rejects: " + s.message());
    }
    if (writer) {
      if (Status s = writer->Write(e); !s.ok()) return s;
    }
    return request.tap ? request.tap(out_header, e, start) : Status::Ok();
  };
  const model::OomPolicy policy = request.continue_after_oom || snapshot != nullptr
                                      ? model::OomPolicy::kContinue
                                      : model::OomPolicy::kStop;
  Status sink_status;
  bool rebuilding = false;  // the requests being replayed rebuild a snapshot's start state
  std::unique_ptr<analysis::AnalyzerThread> analyzer_thread;
  std::unique_ptr<model::RequestReplayer> replayer_holder;
  if (AnalysisThreads(request.threads) >= 2) {
    analyzer_thread = std::make_unique<analysis::AnalyzerThread>(
        analyzer, [&](const Event& e, std::uint64_t start) { return analyze(e, start != 0); });
    replayer_holder =
        std::make_unique<model::RequestReplayer>(sim_options, policy, [&](const Event& e) {
          analyzer_thread->Send(e, SimAllocRetries(replayer_holder->sim(e.device)),
                                rebuilding ? 1 : 0);
        });
    analyzer.SetAllocRetrySource(
        [&](std::int32_t device) { return analyzer_thread->AllocRetries(device); });
  } else {
    replayer_holder =
        std::make_unique<model::RequestReplayer>(sim_options, policy, [&](const Event& e) {
          if (sink_status.ok()) sink_status = analyze(e, rebuilding);
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
    // The requests that rebuild a device's start state are not part of the run: the analysis
    // does not count them, and the simulator's peaks restart from the state they leave.
    std::set<std::int32_t> seeded;  // devices whose start state is being rebuilt
    bool any_seeded = false;
    Result<std::uint64_t> read = ReadSnapshotEvents(
        *snapshot,
        [&](const Event& e) {
          rebuilding = snapshot->last_was_start();
          if (rebuilding) {
            any_seeded = true;
            seeded.insert(e.device);
          } else if (!seeded.empty() && seeded.erase(e.device) > 0) {
            replayer.ResetPeakStats(e.device);
          }
          Status s = requests.Consume(e);
          rebuilding = false;
          return s;
        },
        &notes);
    if (!read.ok()) return Status::InvalidArgument(read.status().message());
    for (const std::int32_t device : seeded) replayer.ResetPeakStats(device);
    requests.AddNotes(&notes);
    if (any_seeded) notes.push_back(RebuiltPeaksNote());
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
    if (const std::uint64_t refused = sim->address_space_refusals(); refused > 0) {
      notes.push_back(fmt::format(
          "device {}: {} segment allocation{} found device memory free but no room in the "
          "simulator's modelled address space ({} of segments): the simulated OOM{} there "
          "{} that limit of the model, not a shortage or fragmentation of device memory",
          device, refused, refused == 1 ? "" : "s", FormatBytes(model::kModelledAddressSpaceBytes),
          refused == 1 ? "" : "s", refused == 1 ? "is" : "are"));
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
  MarkAddressSpaceOoms(replay.ooms, &result);
  if (snapshot != nullptr) {
    AddRequestedBytesNotes(*snapshot, config->Rules(), *real, result, &replay.notes);
  }
  return ReplayRun{std::move(replay), std::move(result)};
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

Result<RecordedSettings> ReadRecordedSettings(sources::SnapshotReader& snapshot,
                                              const std::string& path, model::ConfigVersion version,
                                              std::vector<std::string>* notes) {
  RecordedSettings out;
  out.conf = snapshot.RecordedConf(notes);
  Result<model::AllocatorConfig> parsed = model::ParseAllocatorConfig(out.conf, version);
  if (!parsed.ok()) {
    return Status::InvalidArgument(
        fmt::format("{}:1: allocator_settings: {}", path, parsed.status().message()));
  }
  out.config = *parsed;
  return out;
}

Result<analysis::AnalysisResult> AnalyzeRecordedRun(sources::SnapshotReader& snapshot,
                                                    const std::string& path,
                                                    std::vector<std::string>* notes) {
  analysis::AnalysisOptions options;
  options.keep_layout = false;
  TraceHeader header = snapshot.header();
  std::vector<std::string> capacity_notes;
  if (Status learnt = LearnCapacitiesFromOoms(snapshot, &header, &capacity_notes); !learnt.ok()) {
    return Status::InvalidArgument(fmt::format("{}: {}", path, learnt.message()));
  }
  Result<std::unique_ptr<analysis::TraceAnalyzer>> analyzer =
      analysis::TraceAnalyzer::Create(header, options);
  if (!analyzer.ok()) {
    return Status::InvalidArgument(fmt::format("{}: {}", path, analyzer.status().message()));
  }
  Result<std::uint64_t> read = AnalyzeSnapshotEvents(snapshot, **analyzer, notes);
  if (!read.ok()) return Status::InvalidArgument(read.status().message());
  snapshot.Rewind();
  analysis::AnalysisResult result = (*analyzer)->Finish(path);
  result.notes.insert(result.notes.end(), capacity_notes.begin(), capacity_notes.end());
  return result;
}

RecordedCapacities CapacitiesFromRecordedOoms(const analysis::AnalysisResult& real,
                                              const TraceHeader& header,
                                              std::string_view unknown_meaning,
                                              std::vector<std::string>* notes) {
  RecordedCapacities found;
  for (const DeviceInfo& d : header.devices) {
    const analysis::DeviceReport* report = nullptr;
    for (const analysis::DeviceReport& x : real.devices) {
      if (x.device == d.device) report = &x;
    }
    if (report == nullptr || report->oom_diagnoses.empty() ||
        !report->oom_diagnoses.front().device_free) {
      found.unknown.push_back(d.device);
      continue;
    }
    const analysis::OomDiagnosis& o = report->oom_diagnoses.front();
    const std::uint64_t bytes = o.reserved + *o.device_free;
    found.bytes[d.device] = bytes;
    notes->push_back(fmt::format(
        "device {}: capacity taken from its recorded OOM: reserved {} + driver free {} = {} "
        "(--capacity overrides)",
        d.device, FormatBytes(o.reserved), FormatBytes(*o.device_free), FormatBytes(bytes)));
  }
  std::sort(found.unknown.begin(), found.unknown.end());
  if (!found.unknown.empty()) {
    notes->push_back(fmt::format(
        "a snapshot does not record the device's capacity: devices without a recorded OOM {} "
        "(give --capacity to test a size)",
        unknown_meaning));
  }
  return found;
}

}  // namespace fragscope::pipeline
