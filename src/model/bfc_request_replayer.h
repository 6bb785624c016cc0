// BfcRequestReplayer: drives one BfcAllocatorSim per device with a *request* trace, as
// RequestReplayer does for the caching-allocator simulator, and hands on the allocator events
// the simulator produces. Same request-trace semantics (docs/formats.md): `alloc` ids are the
// program's, `free_requested` (or a lone `free_completed`) frees one, `step` and `snapshot`
// markers pass through, `oom` and segment events are refused. PyTorch's replay controls have
// no BFC counterpart and are skipped, each counted (skipped_controls) so the report can say so:
// record_stream and stream_sync (TensorFlow's allocator does not delay frees by stream),
// empty_cache, set_memory_fraction and set_allocator_settings.
//
// Thread safety: none.
#ifndef FRAGSCOPE_MODEL_BFC_REQUEST_REPLAYER_H_
#define FRAGSCOPE_MODEL_BFC_REQUEST_REPLAYER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "fragscope/event.h"
#include "fragscope/status.h"
#include "model/bfc_allocator_sim.h"
#include "model/request_replayer.h"

namespace fragscope::model {

struct BfcReplayOom {
  std::uint64_t event_index = 0;  // index of the request event that failed
  std::int64_t step = -1;
  std::int32_t device = 0;
  BfcOom details;
};

class BfcRequestReplayer {
 public:
  /// `device_for(d)` gives device d's size (called at its first event); every device runs
  /// `settings`. `sink` receives allocator events (may be empty).
  BfcRequestReplayer(BfcSettings settings, std::function<BfcDevice(std::int32_t)> device_for,
                     OomPolicy policy, std::function<void(const Event&)> sink);
  ~BfcRequestReplayer();

  /// Replays one request event. Errors: kCorruption for an inconsistent trace, kOutOfMemory
  /// with TensorFlow's message under OomPolicy::kStop.
  Status Consume(const Event& event);

  const std::vector<BfcReplayOom>& ooms() const { return ooms_; }
  /// Devices seen so far, in index order.
  std::vector<std::pair<std::int32_t, const BfcAllocatorSim*>> devices() const;
  std::uint64_t events() const { return events_; }
  /// PyTorch controls skipped, by action name.
  const std::map<std::string, std::uint64_t>& skipped_controls() const { return skipped_; }

 private:
  struct Device {
    std::unique_ptr<BfcAllocatorSim> sim;
    std::unordered_map<std::uint64_t, std::uint64_t> chunk_of_id;  // live id -> chunk address
    std::unordered_set<std::uint64_t> failed_ids;                  // kContinue
  };
  BfcSettings settings_;
  std::function<BfcDevice(std::int32_t)> device_for_;
  OomPolicy policy_;
  std::function<void(const Event&)> sink_;
  std::map<std::int32_t, Device> devices_;
  std::vector<BfcReplayOom> ooms_;
  std::map<std::string, std::uint64_t> skipped_;
  std::uint64_t events_ = 0;
  std::int64_t step_ = -1;
};

}  // namespace fragscope::model

#endif  // FRAGSCOPE_MODEL_BFC_REQUEST_REPLAYER_H_
