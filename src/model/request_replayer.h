// RequestReplayer: drives one CachingAllocatorSim per device with a *request* trace (what the
// program asked for) and hands on the *allocator* events the simulator produces, so the rest
// of the pipeline analyzes a simulated run exactly as a recorded one. This is the "sim" box of
// docs/architecture.md: request trace -> allocator trace.
//
// Request-trace semantics (docs/formats.md): `alloc` addr is a program-chosen id, unique among
// live allocations; `free_requested` (or a lone `free_completed`) frees it; `record_stream`,
// `stream_sync`, `empty_cache`, `set_memory_fraction` and `set_allocator_settings` are replay
// controls; `step` and `snapshot` markers pass through; `oom` and segment events are refused
// (a request trace records requests, not outcomes).
//
// Thread safety: none.
#ifndef FRAGSCOPE_MODEL_REQUEST_REPLAYER_H_
#define FRAGSCOPE_MODEL_REQUEST_REPLAYER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "fragscope/event.h"
#include "fragscope/status.h"
#include "model/address_index.h"
#include "model/caching_allocator_sim.h"
#include "model/u64_map.h"

namespace fragscope::model {

/// What happens after a simulated out-of-memory error.
enum class OomPolicy : std::uint8_t {
  kStop,      // the job dies, as with an uncaught torch.OutOfMemoryError (default)
  kContinue,  // the program catches it and goes on: the failed tensor never exists, and a
              // later free of its id is ignored
};

struct ReplayOom {
  std::uint64_t event_index = 0;  // index of the request event that failed
  std::int64_t step = -1;         // step in progress (-1: before the first marker)
  std::int32_t device = 0;
  OomDetails details;  // includes PyTorch's message text
};

class RequestReplayer {
 public:
  /// `sim_for_device(d)` gives the options of device d's simulator (capacity, config, ...);
  /// it is called when a device's first event arrives. `sink` receives allocator events; an
  /// empty one spares the simulators from building them (tune needs only the outcome).
  RequestReplayer(std::function<SimOptions(std::int32_t device)> sim_for_device, OomPolicy policy,
                  std::function<void(const Event&)> sink);
  ~RequestReplayer();

  /// Replays one request event. Errors: kCorruption for an inconsistent trace (free of an id
  /// that is not live, duplicate id, segment events), kInvalidArgument for a bad control value
  /// (fraction, allocator settings), kOutOfMemory with PyTorch's message under kStop.
  Status Consume(const Event& event);

  /// Consume on each event in order; stops at the first error and returns it (events() then
  /// counts the failed event too, as after Consume). Reads ahead (see ReadAhead below).
  Status ConsumeAll(std::span<const Event> events);

  /// Optional hint from a caller that streams events: `event` will be consumed a few events
  /// from now. Loads its id's slot into the cache when the id table has outgrown it.
  void Prefetch(const Event& event) const;

  const std::vector<ReplayOom>& ooms() const { return ooms_; }
  /// Devices seen so far, in index order, with their simulators.
  std::vector<std::pair<std::int32_t, const CachingAllocatorSim*>> devices() const;
  /// The simulator of `device`, or nullptr before its first event.
  const CachingAllocatorSim* sim(std::int32_t device) const {
    const auto index = static_cast<std::size_t>(device);
    return device >= 0 && index < devices_.size() && devices_[index] ? devices_[index]->sim.get()
                                                                     : nullptr;
  }
  std::uint64_t events() const { return events_; }
  /// As torch.cuda.reset_peak_memory_stats(device): the device's peaks become its current
  /// values (a replay's peaks then count from here). Nothing before the device's first event.
  void ResetPeakStats(std::int32_t device) {
    const auto index = static_cast<std::size_t>(device);
    if (device >= 0 && index < devices_.size() && devices_[index]) {
      devices_[index]->sim->ResetPeakStats();
    }
  }

 private:
  struct Device {
    std::unique_ptr<CachingAllocatorSim> sim;
    AddressIndex block_of_id;  // live id -> the simulator's block handle
    U64Map failed_ids;         // ids whose alloc hit an OOM (kContinue)
  };
  Device& DeviceFor(std::int32_t device) {
    const auto index = static_cast<std::size_t>(device);
    if (index < devices_.size() && devices_[index] != nullptr) [[likely]]
      return *devices_[index];
    return NewDevice(device);
  }
  Device& NewDevice(std::int32_t device);  // DeviceFor's first call for `device`
  // ConsumeAll's read-ahead for an event a few places later: stage 0 prefetches its id's slot,
  // stage 1 the record of the block a free will release, stage 2 that block's neighbours. Only
  // while a device has at least kReadAheadMinLive live ids: smaller tables stay in the caches,
  // where the extra lookups cost more than they hide (the bundled trace replays ~10% slower
  // with them, the 100 k-live synthetic one ~20% faster; docs/benchmarks.md).
  static constexpr std::size_t kReadAheadMinLive = std::size_t{1} << 14;
  void ReadAhead(const Event& e, int stage) const;

  std::function<SimOptions(std::int32_t)> sim_for_device_;
  OomPolicy policy_;
  std::function<void(const Event&)> sink_;
  std::vector<std::unique_ptr<Device>> devices_;
  std::vector<ReplayOom> ooms_;
  std::uint64_t events_ = 0;
  std::int64_t step_ = -1;
};

}  // namespace fragscope::model

#endif  // FRAGSCOPE_MODEL_REQUEST_REPLAYER_H_
