// TuneBfc: `fragscope tune --allocator bfc`: replays one request trace under several settings
// of the BFC allocator (TensorFlow / JAX: allow_growth or preallocation, the memory fraction,
// garbage collection) and ranks them: runs without an OOM first, then the lowest peak pool
// (device memory the allocator held), then the fewest keys set, then the order given; settings
// that run out of memory rank by how far they got.
//
// Thread safety: a pure function over its arguments.
#ifndef FRAGSCOPE_ANALYSIS_TUNE_BFC_H_
#define FRAGSCOPE_ANALYSIS_TUNE_BFC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "fragscope/event.h"
#include "fragscope/status.h"
#include "model/bfc_allocator_sim.h"

namespace fragscope::analysis {

struct BfcTuneOutcome {
  std::string conf;  // as given ("" = the defaults: growth, fraction 1, no GC)
  bool oom = false;
  std::uint64_t oom_event = 0;  // request event index of the first OOM
  std::int64_t oom_step = -1;
  std::uint64_t limit_bytes = 0;        // device 0's (or the first device's) limit
  std::uint64_t peak_pool_bytes = 0;    // all devices, up to the first OOM
  std::uint64_t peak_in_use_bytes = 0;  // all devices
  std::uint64_t regions = 0;            // regions held at the end
  std::uint64_t regions_freed = 0;      // by garbage collection
};

/// The default grid (16 settings): allow_growth true/false × memory_fraction 1/0.95/0.9/0.75 ×
/// garbage_collection false/true; the first entry is "" (the defaults).
std::vector<std::string> DefaultBfcTuneGrid();

/// Replays `events` (a request trace) under each setting on devices of `capacity_bytes` (0: the
/// settings must give memory_limit). Errors: a setting that does not parse (kInvalidArgument
/// naming it), a trace the replayer rejects.
Result<std::vector<BfcTuneOutcome>> TuneBfc(const std::vector<Event>& events,
                                            std::uint64_t capacity_bytes,
                                            std::uint64_t used_by_others_bytes,
                                            std::vector<std::string> settings);

}  // namespace fragscope::analysis

#endif  // FRAGSCOPE_ANALYSIS_TUNE_BFC_H_
