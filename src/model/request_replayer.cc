#include "model/request_replayer.h"

#include <algorithm>

#include <fmt/format.h>

#include "model/memory_model.h"

namespace fragscope::model {

RequestReplayer::RequestReplayer(std::function<SimOptions(std::int32_t)> sim_for_device,
                                 OomPolicy policy, std::function<void(const Event&)> sink)
    : sim_for_device_(std::move(sim_for_device)), policy_(policy), sink_(std::move(sink)) {}

RequestReplayer::~RequestReplayer() = default;

RequestReplayer::Device& RequestReplayer::NewDevice(std::int32_t device) {
  const auto index = static_cast<std::size_t>(device);
  if (index >= devices_.size()) devices_.resize(index + 1);
  auto d = std::make_unique<Device>();
  SimOptions options = sim_for_device_(device);
  options.device = device;
  d->sim = std::make_unique<CachingAllocatorSim>(options);
  if (sink_) d->sim->SetEventSink([this](const Event& e) { sink_(e); });
  devices_[index] = std::move(d);
  return *devices_[index];
}

std::vector<std::pair<std::int32_t, const CachingAllocatorSim*>> RequestReplayer::devices() const {
  std::vector<std::pair<std::int32_t, const CachingAllocatorSim*>> out;
  for (std::size_t i = 0; i < devices_.size(); ++i) {
    if (devices_[i]) out.emplace_back(static_cast<std::int32_t>(i), devices_[i]->sim.get());
  }
  return out;
}

Status RequestReplayer::Consume(const Event& e) {
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
  Device& d = DeviceFor(e.device);
  CachingAllocatorSim& sim = *d.sim;
  switch (e.action) {
    case Action::kAlloc: {
      if (e.size == 0) return Status::Corruption("alloc of 0 bytes");
      if (e.addr == ~std::uint64_t{0}) {
        return Status::Corruption("alloc of id 18446744073709551615 (reserved)");
      }
      if (d.block_of_id.Find(e.addr) != AddressIndex::kNotFound) {
        return Status::Corruption(fmt::format(
            "alloc of id {} which is still live (ids must be unique among live allocations)",
            e.addr));
      }
      if (d.failed_ids.size() != 0) d.failed_ids.Erase(e.addr);
      Result<CachingAllocatorSim::Allocation> block = sim.MallocBlock(e.size, e.stream);
      if (block.ok()) {
        d.block_of_id.Insert(e.addr, block->handle);
        return Status::Ok();
      }
      if (block.status().code() != StatusCode::kOutOfMemory) return block.status();
      ReplayOom oom;
      oom.event_index = index;
      oom.step = step_;
      oom.device = e.device;
      if (sim.last_oom()) oom.details = *sim.last_oom();
      ooms_.push_back(oom);
      if (policy_ == OomPolicy::kStop) return block.status();
      d.failed_ids.Insert(e.addr, e.size);
      return Status::Ok();
    }
    case Action::kFreeRequested:
    case Action::kFreeCompleted: {
      const std::uint32_t handle = d.block_of_id.Find(e.addr);
      if (handle == AddressIndex::kNotFound) {
        // A lone free_completed after free_requested, or the free of an alloc that failed.
        if (d.failed_ids.size() != 0 && d.failed_ids.Erase(e.addr)) return Status::Ok();
        if (e.action == Action::kFreeCompleted) return Status::Ok();
        return Status::Corruption(fmt::format(
            "free_requested of id {} which is not live (never allocated, or freed twice)", e.addr));
      }
      d.block_of_id.Erase(e.addr);
      sim.FreeBlock(handle);
      return Status::Ok();
    }
    case Action::kRecordStream: {
      const std::uint32_t handle = d.block_of_id.Find(e.addr);
      if (handle == AddressIndex::kNotFound) {
        if (d.failed_ids.Contains(e.addr)) return Status::Ok();
        return Status::Corruption(fmt::format("record_stream of id {} which is not live", e.addr));
      }
      sim.RecordStreamOnBlock(handle, e.stream);
      return Status::Ok();
    }
    case Action::kStreamSync:
      sim.StreamSync(e.has_stream ? std::optional<std::uint64_t>(e.stream) : std::nullopt);
      return Status::Ok();
    case Action::kEmptyCache:
      sim.EmptyCache();
      return Status::Ok();
    case Action::kSetMemoryFraction:
      return sim.SetMemoryFraction(e.fraction);
    case Action::kSetAllocatorSettings:
      return sim.SetAllocatorSettings(e.conf);
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

void RequestReplayer::ReadAhead(const Event& e, int stage) const {
  const auto index = static_cast<std::size_t>(e.device);
  if (index >= devices_.size() || devices_[index] == nullptr) return;
  const Device& d = *devices_[index];
  if (stage == 0) {
    d.block_of_id.Prefetch(e.addr);
    return;
  }
  if (e.action != Action::kFreeRequested && e.action != Action::kFreeCompleted) return;
  const std::uint32_t handle = d.block_of_id.Find(e.addr);
  if (handle != AddressIndex::kNotFound) d.sim->PrefetchBlock(handle, stage == 2);
}

void RequestReplayer::Prefetch(const Event& event) const {
  const auto index = static_cast<std::size_t>(event.device);
  if (index >= devices_.size() || devices_[index] == nullptr) return;
  if (devices_[index]->block_of_id.size() >= kReadAheadMinLive) ReadAhead(event, 0);
}

Status RequestReplayer::ConsumeAll(std::span<const Event> events) {
  // Three stages, each a few events before the event needs it: the id's slot, then (the slot is
  // cached by then) the freed block's record, then (the record is cached) its neighbours.
  // Whether to read ahead is decided every kChunk events from the live ids.
  constexpr std::size_t kAhead[3] = {16, 8, 4};
  constexpr std::size_t kChunk = 1024;
  const std::size_t n = events.size();
  for (std::size_t begin = 0; begin < n; begin += kChunk) {
    const std::size_t end = std::min(n, begin + kChunk);
    bool read_ahead = false;
    for (const auto& d : devices_) {
      if (d != nullptr && d->block_of_id.size() >= kReadAheadMinLive) read_ahead = true;
    }
    for (std::size_t i = begin; i < end; ++i) {
      if (read_ahead) {
        for (int stage = 0; stage < 3; ++stage) {
          const std::size_t ahead = i + kAhead[stage];
          if (ahead < n) ReadAhead(events[ahead], stage);
        }
      }
      FRAGSCOPE_RETURN_IF_ERROR(Consume(events[i]));
    }
  }
  return Status::Ok();
}

}  // namespace fragscope::model
