// Event: the one currency of the pipeline (sources -> model -> analysis -> sinks).
//
// Actions follow PyTorch's caching-allocator trace vocabulary, so an entry of a real memory
// snapshot maps 1:1 onto an Event; fragscope adds `step` markers and the control events that
// replays need (record_stream, stream_sync, empty_cache, set_memory_fraction,
// set_allocator_settings). docs/formats.md defines every field.
//
// Thread safety: plain value type.
#ifndef FRAGSCOPE_EVENT_H_
#define FRAGSCOPE_EVENT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace fragscope {

enum class Action : std::uint8_t {
  kAlloc,                 // a block is handed to a tensor; size = requested bytes
  kFreeRequested,         // the program freed the tensor (block may wait on other streams)
  kFreeCompleted,         // the block returned to the allocator's free pool
  kSegmentAlloc,          // cudaMalloc of a new segment; size = segment bytes
  kSegmentFree,           // cudaFree of a whole segment
  kSegmentMap,            // expandable segment grew: pages mapped at [addr, addr+size)
  kSegmentUnmap,          // expandable segment shrank: pages unmapped at [addr, addr+size)
  kOom,                   // an allocation failed; size = requested bytes
  kSnapshot,              // a snapshot was taken (marker)
  kStep,                  // training-step marker: the events of step `step` follow
  kRecordStream,          // control: block `addr` is used on stream `stream`
  kStreamSync,            // control: work queued on `stream` (all streams if none) completed
  kEmptyCache,            // control: torch.cuda.empty_cache()
  kSetMemoryFraction,     // control: set_per_process_memory_fraction(`fraction`)
  kSetAllocatorSettings,  // control: _set_allocator_settings(`conf`)
  kBlock,                 // state at the start: a live block of `block_size` bytes at `addr`
};
inline constexpr int kNumActions = 16;

/// The trace-format name of an action ("alloc", "segment_map", ...).
std::string_view ActionName(Action action);
/// Parses a trace-format action name; nullopt when unknown.
std::optional<Action> ParseActionName(std::string_view name);

/// Which of PyTorch's two default free-block pools a segment belongs to.
enum class Pool : std::uint8_t { kUnknown, kSmall, kLarge };
std::string_view PoolName(Pool pool);

/// One trace event. Fields an action does not use stay at their defaults.
struct Event {
  Action action = Action::kAlloc;
  std::int32_t device = 0;
  std::uint64_t stream = 0;
  /// Block or segment address; in a request trace, the program's id of the allocation.
  std::uint64_t addr = 0;
  /// Requested bytes (alloc, free_*, oom) or segment/range bytes (segment_*).
  std::uint64_t size = 0;
  /// alloc, optional: the allocator's block size (rounded); 0 = derive it from `size` with
  /// the allocator's rounding and split rules. block: required.
  std::uint64_t block_size = 0;
  /// Microseconds (since the epoch or since the start of the capture); -1 = unknown.
  std::int64_t time_us = -1;
  /// step: the step number.
  std::int64_t step = 0;
  /// oom: free bytes the driver reported, if known.
  std::optional<std::uint64_t> device_free;
  /// segment_alloc / segment_map: the pool, when the producer knows it.
  Pool pool = Pool::kUnknown;
  /// set_memory_fraction.
  double fraction = 0.0;
  /// stream_sync: false means "all streams".
  bool has_stream = false;
  /// Call-site id (a frame defined in the trace), -1 = none.
  std::int32_t frame = -1;
  /// alloc / block of a snapshot: the allocation's whole stack, an index into the snapshot's
  /// stack table (sources::Snapshot::stacks, whose frame indexes are the reader's frames()
  /// ids); -1 = none. Traces do not carry it (their events name a call site only).
  std::int32_t stack = -1;
  /// set_allocator_settings: the PYTORCH_CUDA_ALLOC_CONF-style string.
  std::string conf;
};

}  // namespace fragscope

#endif  // FRAGSCOPE_EVENT_H_
