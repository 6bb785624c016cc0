#include "sources/snapshot/snapshot_requests.h"

#include <algorithm>

#include <fmt/format.h>

#include "model/seed_requests.h"

namespace fragscope::sources {

Status SnapshotRequests::Consume(const Event& e) {
  if (reader_.last_was_start()) {
    if (std::find(seeded_.begin(), seeded_.end(), e.device) != seeded_.end()) {
      return Status::Ok();
    }
    seeded_.push_back(e.device);
    const model::SeedResult seed = model::SeedRequests(reader_.start_events(e.device), rules_);
    exact_segments_ += seed.exact_segments;
    fallback_segments_ += seed.fallback_segments;
    for (const Event& request : seed.requests) FRAGSCOPE_RETURN_IF_ERROR(emit_(request));
    return Status::Ok();
  }
  if (e.action == Action::kOom &&
      std::find(drop_ooms_.begin(), drop_ooms_.end(), e.device) != drop_ooms_.end()) {
    return Status::Ok();
  }
  Event request;
  if (!extractor_.Convert(e, &request)) return Status::Ok();
  return emit_(request);
}

void SnapshotRequests::AddNotes(std::vector<std::string>* notes) const {
  if (exact_segments_ + fallback_segments_ > 0) {
    notes->push_back(fmt::format(
        "the state before the first recorded event was rebuilt with requests: {} segments "
        "exactly, {} only as their live blocks in address order (docs/snapshots.md)",
        exact_segments_, fallback_segments_));
  }
  if (extractor_.inferred_empty_caches() > 0) {
    notes->push_back(fmt::format(
        "{} runs of segment frees in the recorded history were replayed as empty_cache() (a "
        "snapshot does not record those calls)",
        extractor_.inferred_empty_caches()));
  }
}

std::map<std::int32_t, model::RecordedAddresses> RecordedSegmentAddresses(
    const SnapshotReader& reader) {
  std::map<std::int32_t, model::RecordedAddresses> out;
  for (const DeviceInfo& d : reader.header().devices) {
    model::RecordedAddresses& plan = out[d.device];
    for (const Event& e : reader.start_events(d.device)) {
      if (e.action == Action::kSegmentAlloc) plan.Add(e.size, e.addr);
    }
    const auto& traces = reader.snapshot().device_traces;
    if (d.device >= 0 && static_cast<std::size_t>(d.device) < traces.size()) {
      for (const SnapshotTraceEntry& t : traces[static_cast<std::size_t>(d.device)]) {
        if (t.action == Action::kSegmentAlloc) plan.Add(t.size, t.addr);
      }
    }
    if (plan.recorded() == 0) out.erase(d.device);
  }
  return out;
}

}  // namespace fragscope::sources
