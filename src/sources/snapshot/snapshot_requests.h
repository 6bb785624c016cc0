// SnapshotRequests: a snapshot's events, as SnapshotReader yields them, turned into the request
// events a simulator replays (`fragscope replay`, `explain --snapshot`, `convert --to requests`):
// each device's rebuilt start state as model::SeedRequests (built exactly where it can be), then
// model::RequestExtractor over the recorded history. docs/snapshots.md, "Re-simulation".
//
// RecordedSegmentAddresses: the addresses the real driver gave each device's segments, for a
// simulator that places its segments there (model/recorded_addresses.h).
//
// Thread safety: none.
#ifndef FRAGSCOPE_SOURCES_SNAPSHOT_SNAPSHOT_REQUESTS_H_
#define FRAGSCOPE_SOURCES_SNAPSHOT_SNAPSHOT_REQUESTS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "fragscope/event.h"
#include "fragscope/status.h"
#include "model/allocator_rules.h"
#include "model/recorded_addresses.h"
#include "model/request_extractor.h"
#include "sources/snapshot/snapshot_reader.h"

namespace fragscope::sources {

class SnapshotRequests {
 public:
  /// `rules` are those of the allocator the requests will meet; `emit` receives each request.
  SnapshotRequests(SnapshotReader& reader, model::AllocatorRules rules,
                   std::function<Status(const Event&)> emit)
      : reader_(reader), rules_(rules), emit_(std::move(emit)), extractor_(true) {}
  /// Call with each event just read from `reader`.
  Status Consume(const Event& e);
  /// The oom events of these devices are left out (instead of becoming the failed request).
  void DropOoms(std::vector<std::int32_t> devices) { drop_ooms_ = std::move(devices); }
  /// What was assumed, for the report's notes.
  void AddNotes(std::vector<std::string>* notes) const;

 private:
  SnapshotReader& reader_;
  model::AllocatorRules rules_;
  std::function<Status(const Event&)> emit_;
  model::RequestExtractor extractor_;
  std::vector<std::int32_t> seeded_;
  std::vector<std::int32_t> drop_ooms_;
  std::uint64_t exact_segments_ = 0;
  std::uint64_t fallback_segments_ = 0;
};

/// Per device with segments: its start state's cudaMalloc'd segments in address order, then the
/// segment_alloc entries of its history in order, as SnapshotReader yields them.
std::map<std::int32_t, model::RecordedAddresses> RecordedSegmentAddresses(
    const SnapshotReader& reader);

}  // namespace fragscope::sources

#endif  // FRAGSCOPE_SOURCES_SNAPSHOT_SNAPSHOT_REQUESTS_H_
