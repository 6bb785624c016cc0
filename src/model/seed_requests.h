// SeedRequests: requests that make the caching allocator (PyTorch's, or the simulator) build a
// given memory layout: the state a snapshot's history starts from when recording began
// mid-run. Replaying a snapshot's requests from an empty device would otherwise lose the
// cached free segments and gaps that existed before its first recorded event.
//
// For each segment of the start state, in address order (docs/snapshots.md, "Re-simulation"):
//   large pool: alloc of the whole segment size then its free, which leaves one cached block
//     of exactly that size (the segment), then allocs of its pieces in address order: live
//     blocks with their ids (the block address), free gaps as fillers. Best fit carves each
//     piece from the front of the segment's remaining tail, the only free block there is.
//   small pool: the pieces directly (a 2 MiB segment appears with the first); gaps over 1 MiB
//     as several fillers of at most 1 MiB.
//   expandable (a mapped range, with expandable_segments on): its pieces in address order, as
//     for the large pool but without the whole-segment request: the range is mapped page by
//     page as the pieces are carved from its front, and the last filler reaches its end. A
//     large range's free gap of 1 MiB or less (expandable mode splits off any remainder of
//     512 B, but no large-pool request is that small) is carved together with the live block
//     before it as one placeholder; once the range is built, the placeholders are freed from
//     the highest down, each followed by its live block's request, which leaves the gap.
// Then every filler is freed, which reopens the gaps. A pending-free block is freed right
// after. What this cannot build exactly falls back to allocs of the live blocks in address
// order: pieces whose rounding would not give back their size (with
// roundup_power2_divisions) or that a max_split_size_mb would keep from being carved or make
// oversize, and mapped ranges when expandable_segments is off or another range has the same
// stream and pool (the simulator keeps one reservation per pair).
//
// Thread safety: pure function.
#ifndef FRAGSCOPE_MODEL_SEED_REQUESTS_H_
#define FRAGSCOPE_MODEL_SEED_REQUESTS_H_

#include <cstdint>
#include <span>
#include <vector>

#include "fragscope/event.h"
#include "model/allocator_rules.h"

namespace fragscope::model {

/// Filler ids count up from here (far from real addresses and from RequestExtractor's ids).
inline constexpr std::uint64_t kSeedIdBase = std::uint64_t{1} << 63;

struct SeedResult {
  std::vector<Event> requests;
  std::uint64_t exact_segments = 0;     // built piece by piece
  std::uint64_t fallback_segments = 0;  // their live blocks requested in address order
};

/// `start`: one device's start state as SnapshotReader yields it (segment_alloc/segment_map,
/// then block events, a pending block followed by its free_requested).
SeedResult SeedRequests(std::span<const Event> start, const AllocatorRules& rules);

}  // namespace fragscope::model

#endif  // FRAGSCOPE_MODEL_SEED_REQUESTS_H_
