// Fidelity of a re-simulation: how the simulator's final segments and peaks compare with what
// the real allocator did, for `fragscope replay snapshot.pickle` (docs/snapshots.md,
// "Re-simulation"). Segments are matched as multisets, whatever their addresses (they agree
// only where the simulator took the recorded ones): exactly (same size and the same blocks,
// sizes and states, in order) and by size only.
//
// Thread safety: pure functions.
#ifndef FRAGSCOPE_ANALYSIS_FIDELITY_H_
#define FRAGSCOPE_ANALYSIS_FIDELITY_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "model/caching_allocator_sim.h"

namespace fragscope::analysis {

struct DeviceFidelity {
  std::int32_t device = 0;
  /// The recorded history starts with no segments: the simulation saw every request. When it
  /// does not (recording began mid-run, or the ring buffer dropped the oldest events), the
  /// start state was rebuilt with requests (model/seed_requests.h) that the real run did not
  /// make.
  bool complete_history = false;
  std::uint64_t history_entries = 0;  // recorded events of this device (0: final state only)
  std::uint64_t real_segments = 0;
  std::uint64_t sim_segments = 0;
  std::uint64_t matched_segments = 0;  // same size and block layout
  std::uint64_t matched_by_size = 0;   // same size
  std::uint64_t real_reserved = 0;
  std::uint64_t sim_reserved = 0;
  std::uint64_t real_allocated = 0;
  std::uint64_t sim_allocated = 0;
  std::uint64_t real_peak_reserved = 0;
  std::uint64_t sim_peak_reserved = 0;
  /// With the simulator at the recorded segment addresses: how many the file recorded and how
  /// many the simulator took (model/recorded_addresses.h); unset with its own placement.
  std::optional<std::uint64_t> recorded_addresses;
  std::optional<std::uint64_t> addresses_taken;

  /// matched / max(real, sim); 1 when both have no segment.
  double segment_agreement() const;
  double size_agreement() const;
};

/// Compares final segments (of one device each). Fills the segment and reserved/allocated
/// fields; the caller fills device, complete_history and the peaks.
DeviceFidelity CompareSegments(const std::vector<model::SnapshotSegment>& real,
                               const std::vector<model::SnapshotSegment>& sim);

}  // namespace fragscope::analysis

#endif  // FRAGSCOPE_ANALYSIS_FIDELITY_H_
