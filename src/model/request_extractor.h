// RequestExtractor: the program's side of an allocator trace, as a request trace. A real
// snapshot's history says what the allocator did; replaying it under other settings needs only
// what the program asked for: its allocs and frees (docs/formats.md, "Request traces").
//
//   alloc, block (live at the start)  -> alloc (id = the block's address, size = requested)
//   free_requested                    -> free_requested of that id
//   free_completed                    -> nothing (the simulator decides when a free completes),
//                                        or free_requested when none came first (a trace
//                                        recorded with skip_actions)
//   oom                               -> alloc of the size that failed, with a fresh id that is
//                                        never freed (the program got an exception; whether it
//                                        would have fitted under other settings is the point)
//   segment_free                      -> empty_cache, for the first of a run of them, when
//                                        infer_empty_cache is set (a snapshot does not record
//                                        empty_cache() calls; a run of segment frees is one,
//                                        or the allocator's own release before a retry)
//   segment_*, snapshot               -> nothing
//   step and control events           -> passed through
//
// Thread safety: none.
#ifndef FRAGSCOPE_MODEL_REQUEST_EXTRACTOR_H_
#define FRAGSCOPE_MODEL_REQUEST_EXTRACTOR_H_

#include <cstdint>
#include <unordered_set>
#include <vector>

#include "fragscope/event.h"

namespace fragscope::model {

class RequestExtractor {
 public:
  /// Ids given to failed allocations count down from here (far from real addresses).
  static constexpr std::uint64_t kOomIdBase = ~std::uint64_t{0} - 1;

  explicit RequestExtractor(bool infer_empty_cache = false)
      : infer_empty_cache_(infer_empty_cache) {}

  /// Turns one allocator event into at most one request event; returns false when the event
  /// has no request counterpart.
  bool Convert(const Event& in, Event* out);

  /// empty_cache events inferred so far.
  std::uint64_t inferred_empty_caches() const { return inferred_empty_caches_; }

 private:
  // Per device: ids whose free_requested was passed on and whose free_completed is awaited.
  std::vector<std::unordered_set<std::uint64_t>> awaiting_;
  std::uint64_t next_oom_id_ = kOomIdBase;
  bool infer_empty_cache_ = false;
  bool last_was_segment_free_ = false;
  std::uint64_t inferred_empty_caches_ = 0;
};

}  // namespace fragscope::model

#endif  // FRAGSCOPE_MODEL_REQUEST_EXTRACTOR_H_
