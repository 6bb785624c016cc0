#include "model/bfc_request_replayer.h"

#include <fmt/format.h>

#include "model/memory_model.h"

namespace fragscope::model {

BfcRequestReplayer::BfcRequestReplayer(BfcSettings settings,
                                       std::function<BfcDevice(std::int32_t)> device_for,
                                       OomPolicy policy, std::function<void(const Event&)> sink)
    : settings_(settings),
      device_for_(std::move(device_for)),
      policy_(policy),
      sink_(std::move(sink)) {}

BfcRequestReplayer::~BfcRequestReplayer() = default;

std::vector<std::pair<std::int32_t, const BfcAllocatorSim*>> BfcRequestReplayer::devices() const {
  std::vector<std::pair<std::int32_t, const BfcAllocatorSim*>> out;
  for (const auto& [index, d] : devices_) out.emplace_back(index, d.sim.get());
  return out;
}

Status BfcRequestReplayer::Consume(const Event& e) {
  const std::uint64_t index = events_++;
  if (e.action == Action::kStep || e.action == Action::kSnapshot) {
    if (e.action == Action::kStep) step_ = e.step;
    if (sink_) sink_(e);
    return Status::Ok();
  }
  if (e.device < 0 || e.device >= MemoryModel::kMaxDevices) {
    return Status::Corruption(
        fmt::format("device {} is outside [0, {})", e.device, MemoryModel::kMaxDevices));
  }
  auto [it, fresh] = devices_.try_emplace(e.device);
  Device& d = it->second;
  if (fresh) {
    d.sim = std::make_unique<BfcAllocatorSim>(settings_, device_for_(e.device), e.device);
    if (sink_) d.sim->SetEventSink([this](const Event& x) { sink_(x); });
  }
  switch (e.action) {
    case Action::kAlloc: {
      if (e.size == 0) return Status::Corruption("alloc of 0 bytes");
      if (d.chunk_of_id.count(e.addr) != 0) {
        return Status::Corruption(fmt::format(
            "alloc of id {} which is still live (ids must be unique among live allocations)",
            e.addr));
      }
      d.failed_ids.erase(e.addr);
      Result<std::uint64_t> chunk = d.sim->Malloc(e.size);
      if (chunk.ok()) {
        d.chunk_of_id.emplace(e.addr, *chunk);
        return Status::Ok();
      }
      BfcReplayOom oom;
      oom.event_index = index;
      oom.step = step_;
      oom.device = e.device;
      if (d.sim->last_oom()) oom.details = *d.sim->last_oom();
      ooms_.push_back(oom);
      if (policy_ == OomPolicy::kStop) return chunk.status();
      d.failed_ids.insert(e.addr);
      return Status::Ok();
    }
    case Action::kFreeRequested:
    case Action::kFreeCompleted: {
      const auto live = d.chunk_of_id.find(e.addr);
      if (live == d.chunk_of_id.end()) {
        if (d.failed_ids.erase(e.addr) > 0) return Status::Ok();
        if (e.action == Action::kFreeCompleted) return Status::Ok();
        return Status::Corruption(fmt::format(
            "free_requested of id {} which is not live (never allocated, or freed twice)", e.addr));
      }
      const std::uint64_t chunk = live->second;
      d.chunk_of_id.erase(live);
      return d.sim->Free(chunk);
    }
    case Action::kRecordStream:
    case Action::kStreamSync:
    case Action::kEmptyCache:
    case Action::kSetMemoryFraction:
    case Action::kSetAllocatorSettings:
      ++skipped_[std::string(ActionName(e.action))];
      return Status::Ok();
    case Action::kSegmentAlloc:
    case Action::kSegmentFree:
    case Action::kSegmentMap:
    case Action::kSegmentUnmap:
    case Action::kOom:
    case Action::kBlock:
      return Status::Corruption(fmt::format(
          "{} in a request trace: replay takes what the program asked for (alloc, frees and "
          "controls), not allocator outcomes; use `fragscope analyze` for allocator traces",
          ActionName(e.action)));
    default:
      return Status::Ok();
  }
}

}  // namespace fragscope::model
