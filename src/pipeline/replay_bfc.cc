// ReplayBfcInput: `fragscope replay --allocator bfc`, a request trace through the BFC model.
#include <fmt/format.h>

#include "common/units.h"
#include "model/bfc_request_replayer.h"
#include "pipeline/input.h"
#include "pipeline/replay.h"

namespace fragscope::pipeline {
namespace {

// The BFC regions as memory_snapshot() segments: a region is a segment, a chunk a block.
std::vector<model::SnapshotSegment> RegionsAsSegments(const model::BfcAllocatorSim& sim,
                                                      std::int32_t device) {
  std::vector<model::SnapshotSegment> out;
  for (const model::BfcRegion& r : sim.Regions()) {
    model::SnapshotSegment s;
    s.device = device;
    s.address = r.address;
    s.total_size = r.size;
    s.segment_type = "large";
    for (const model::BfcChunk& c : r.chunks) {
      model::SnapshotBlock b;
      b.address = c.address;
      b.size = c.size;
      b.requested_size = c.requested_size;
      b.state = c.in_use ? "active_allocated" : "inactive";
      if (c.in_use) {
        s.allocated_size += c.size;
        s.active_size += c.size;
        s.requested_size += c.requested_size;
      }
      s.blocks.push_back(std::move(b));
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

Result<ReplayRun> ReplayBfcInput(const ReplayRequest& request) {
  const std::string& path = request.path;
  if (request.alloc_conf) {
    return Status::InvalidArgument(
        "--alloc-conf sets PyTorch's allocator; the BFC allocator takes --bfc-conf");
  }
  if (request.recorded_addresses.value_or(false)) {
    return Status::InvalidArgument("--addresses recorded needs a PyTorch snapshot replay");
  }
  Result<OpenedInput> opened = OpenInput(path);
  if (!opened.ok()) return Status::InvalidArgument(opened.status().message());
  if (opened->snapshot != nullptr) {
    return Status::InvalidArgument(fmt::format(
        "{}: --allocator bfc replays a request trace; a PyTorch snapshot's requests are made "
        "with `fragscope convert {} -o requests.jsonl --to requests`",
        path, path));
  }
  TraceReader& reader = *opened->reader;
  TraceHeader header = reader.header();
  if (header.kind == TraceKind::kAllocator) {
    return Status::InvalidArgument(fmt::format(
        "{}: this is an allocator trace (header kind \"allocator\"); replay takes a request "
        "trace (`fragscope convert {} -o requests.jsonl --to requests` makes one)",
        path, path));
  }
  const model::BfcSettings settings = *request.bfc;
  auto device_for = [&](std::int32_t device) {
    model::BfcDevice d;
    const DeviceInfo* info = header.FindDevice(device);
    d.capacity_bytes =
        request.capacity.value_or(info && info->capacity_bytes ? *info->capacity_bytes : 0);
    d.used_by_others_bytes =
        request.used_by_others.value_or(info ? info->used_by_others_bytes.value_or(0) : 0);
    return d;
  };
  if (!settings.memory_limit) {
    bool sized = request.capacity.has_value();
    for (const DeviceInfo& d : header.devices) sized = sized || d.capacity_bytes.has_value();
    if (!sized) {
      return Status::InvalidArgument(fmt::format(
          "{}: the BFC allocator needs a limit: give --capacity SIZE (the limit is then "
          "memory_fraction of it) or --bfc-conf memory_limit:SIZE",
          path));
    }
  }

  // The analysis sees a device as large as the allocator's limit: it is all the BFC can use.
  TraceHeader out_header = header;
  out_header.kind = TraceKind::kAllocator;
  out_header.producer = "fragscope replay --allocator bfc of " + path;
  out_header.allocator_settings.clear();
  if (out_header.devices.empty()) out_header.devices.push_back(DeviceInfo{0, "bfc", {}, {}});
  for (DeviceInfo& d : out_header.devices) {
    const model::BfcAllocatorSim probe(settings, device_for(d.device), d.device);
    d.capacity_bytes = probe.memory_limit();
    d.used_by_others_bytes = 0;
  }
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
  Status sink_status;
  auto sink = [&](const Event& e) {
    if (!sink_status.ok()) return;
    if (Status s = analyzer.Consume(e); !s.ok()) {
      sink_status =
          Status::Internal("the BFC model produced an event the analysis rejects: " + s.message());
      return;
    }
    if (writer) sink_status = writer->Write(e);
    if (sink_status.ok() && request.tap) sink_status = request.tap(out_header, e, false);
  };
  const model::OomPolicy policy =
      request.continue_after_oom ? model::OomPolicy::kContinue : model::OomPolicy::kStop;
  model::BfcRequestReplayer replayer(settings, device_for, policy, sink);
  Status consumer_status;
  Result<std::uint64_t> read = ReadAllEvents(
      reader,
      [&](const Event& e) {
        Status s = replayer.Consume(e);
        return s.ok() ? sink_status : s;
      },
      &consumer_status);
  const bool stopped_at_oom = !read.ok() && consumer_status.code() == StatusCode::kOutOfMemory;
  if (!read.ok() && !stopped_at_oom) return Status::InvalidArgument(read.status().message());
  if (!sink_status.ok()) {
    return Status::InvalidArgument(fmt::format("{}: {}", path, sink_status.message()));
  }
  if (writer) {
    if (Status s = writer->Close(); !s.ok())
      return Status::InvalidArgument("--emit: " + s.message());
  }

  analysis::ReplayResult replay;
  replay.trace = path;
  replay.allocator = "bfc";
  replay.policy = policy;
  replay.stopped_at_oom = stopped_at_oom;
  replay.request_events = replayer.events();
  for (const model::BfcReplayOom& o : replayer.ooms()) {
    model::ReplayOom r;
    r.event_index = o.event_index;
    r.step = o.step;
    r.device = o.device;
    r.details.requested = o.details.requested;
    r.details.rounded = o.details.rounded;
    r.details.reported = o.details.rounded;
    r.details.device_total = o.details.limit;
    r.details.device_free = o.details.limit - o.details.pool_bytes;
    r.details.allocated = o.details.in_use;
    r.details.reserved = o.details.pool_bytes;
    r.details.limit = o.details.limit;
    r.details.message = o.details.message;
    replay.ooms.push_back(std::move(r));
  }
  for (const auto& [device, sim] : replayer.devices()) {
    analysis::DeviceReplay d;
    d.device = device;
    const model::BfcDevice info = device_for(device);
    d.capacity_bytes = info.capacity_bytes;  // 0: not given (the limit was)
    d.used_by_others_bytes = info.used_by_others_bytes;
    d.alloc_conf = model::ToBfcConfString(settings);
    d.memory_stats = sim->stats().Flatten(sim->largest_free_chunk());
    d.segments = RegionsAsSegments(*sim, device);
    replay.devices.push_back(std::move(d));
  }
  for (const auto& [action, count] : replayer.skipped_controls()) {
    replay.notes.push_back(fmt::format(
        "{} {} event{} skipped: a PyTorch control with no counterpart in the BFC allocator",
        FormatCount(count), action, count == 1 ? "" : "s"));
  }
  replay.notes.push_back(fmt::format(
      "BFC allocator model ({}): the analysis below sees each device as large as the "
      "allocator's limit; its max-allocatable figures follow PyTorch's rules, the chunk map "
      "and OOMs above follow the BFC's (docs/simulator.md)",
      model::BfcVersionName(settings.version)));
  analysis::AnalysisResult result = analyzer.Finish(path);
  return ReplayRun{std::move(replay), std::move(result)};
}

}  // namespace fragscope::pipeline
