// DeviceMemory: the address-space model of one GPU as PyTorch's caching allocator sees it.
//
// A *segment* is one driver allocation (cudaMalloc) or one contiguous mapped range of an
// expandable segment; *blocks* tile each segment. A block is allocated (a live tensor),
// pending-free (freed by the program, waiting on other streams: PyTorch's active_pending_free)
// or free (cached). Applying an event is O(log n); the counters and free-size indexes that the
// fragmentation metrics read are kept current on every event.
//
// Invariants (CheckInvariants() verifies all of them):
//   * segments never overlap; every segment has size > 0;
//   * blocks tile their segment: block[0].addr == seg.addr, block[i+1].addr == block[i].end,
//     Σ block.size == seg.size, every block.size > 0;
//   * no two neighbouring blocks are both free (frees merge, as PyTorch's free_block does);
//   * every block start is in the address index, and nothing else is;
//   * per pool: reserved == Σ segment sizes, allocated == Σ allocated block sizes,
//     active == allocated + Σ pending block sizes, free index == the free blocks,
//     releasable == Σ sizes of segments that are one free block.
//
// Thread safety: none; one thread applies events and reads.
#ifndef FRAGSCOPE_MODEL_DEVICE_MEMORY_H_
#define FRAGSCOPE_MODEL_DEVICE_MEMORY_H_

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "fragscope/event.h"
#include "fragscope/status.h"
#include "model/address_index.h"
#include "model/allocator_rules.h"
#include "model/free_size_index.h"

namespace fragscope::model {

using BlockId = std::uint32_t;
using SegmentId = std::uint32_t;
inline constexpr std::uint32_t kNone = 0xffffffffu;

enum class BlockState : std::uint8_t { kFree, kAllocated, kPendingFree };
std::string_view BlockStateName(BlockState state);

struct Block {
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
  std::uint64_t requested = 0;  // meaningful while allocated or pending
  BlockId prev = kNone;         // neighbour at lower address in the same segment
  BlockId next = kNone;         // neighbour at higher address in the same segment
  SegmentId segment = kNone;
  BlockState state = BlockState::kFree;
  Pool pool = Pool::kLarge;  // the segment's pool, kept here to spare a lookup
  std::int32_t frame = -1;   // call site of the allocation, -1 = unknown

  std::uint64_t end() const { return addr + size; }
};

struct Segment {
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
  std::uint64_t stream = 0;
  Pool pool = Pool::kLarge;
  bool expandable = false;
  BlockId first = kNone;
  BlockId last = kNone;
  std::uint32_t num_blocks = 0;
  std::uint32_t live_blocks = 0;  // allocated or pending-free; 0 <=> one free block

  std::uint64_t end() const { return addr + size; }
};

/// Counters of one pool (small or large). All in bytes except the *_count fields.
struct PoolCounters {
  std::uint64_t reserved = 0;
  std::uint64_t allocated = 0;   // Σ size of allocated blocks
  std::uint64_t active = 0;      // allocated + pending-free
  std::uint64_t requested = 0;   // Σ requested bytes of allocated blocks
  std::uint64_t releasable = 0;  // Σ size of segments that are one free block
  std::uint64_t segment_count = 0;
  std::uint64_t allocated_count = 0;
  std::uint64_t pending_count = 0;
  FreeSizeIndex free;
};

struct OomRecord {
  std::uint64_t requested = 0;
  std::optional<std::uint64_t> device_free;
};

class DeviceMemory {
 public:
  explicit DeviceMemory(std::int32_t device, AllocatorRules rules = {});
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  /// Applies one allocator event. A violation (a free of an unknown address, overlapping
  /// segments, an alloc that does not fit its block, ...) returns kCorruption with a message
  /// that names the address and what was expected, and leaves the model unchanged. Control
  /// events (record_stream, stream_sync, ...) and markers do not change the layout.
  Status Apply(const Event& event);

  /// Optional hint: an event at `addr` will be applied soon (see AddressIndex::Prefetch).
  void Prefetch(std::uint64_t addr) const { block_index_.Prefetch(addr); }

  /// Verifies every invariant in the file comment. O(n); for tests and debug builds.
  Status CheckInvariants() const;

  std::int32_t device() const { return device_; }
  const AllocatorRules& rules() const { return rules_; }
  /// REQUIRES: pool is kSmall or kLarge.
  const PoolCounters& pool(Pool pool) const { return pools_[PoolIndex(pool)]; }
  std::uint64_t reserved() const { return pools_[0].reserved + pools_[1].reserved; }
  std::uint64_t allocated() const { return pools_[0].allocated + pools_[1].allocated; }
  std::uint64_t num_ooms() const { return num_ooms_; }
  const std::optional<OomRecord>& last_oom() const { return last_oom_; }
  std::size_t segment_count() const { return segments_by_addr_.size(); }

  /// Visits segments in address order: fn(const Segment&).
  template <typename Fn>
  void ForEachSegment(Fn&& fn) const {
    for (const auto& [addr, id] : segments_by_addr_) fn(segments_[id]);
  }
  /// Visits the blocks of `segment` in address order: fn(const Block&).
  template <typename Fn>
  void ForEachBlock(const Segment& segment, Fn&& fn) const {
    for (BlockId b = segment.first; b != kNone; b = blocks_[b].next) fn(blocks_[b]);
  }

 private:
  static std::size_t PoolIndex(Pool pool) { return pool == Pool::kSmall ? 0 : 1; }
  PoolCounters& counters(const Segment& s) { return pools_[PoolIndex(s.pool)]; }
  PoolCounters& counters(const Block& b) { return pools_[PoolIndex(b.pool)]; }

  Status SegmentAlloc(const Event& e);
  Status SegmentFree(const Event& e);
  Status SegmentMap(const Event& e);
  Status SegmentUnmap(const Event& e);
  Status Alloc(const Event& e);
  Status PlaceBlock(const Event& e);
  Status FreeRequested(const Event& e);
  Status FreeCompleted(const Event& e);

  /// The block starting at addr, or AddressIndex::kNotFound. Remembers the last hit: PyTorch
  /// records free_completed right after free_requested of the same block.
  BlockId FindBlock(std::uint64_t addr);
  BlockId NewBlock(const Block& block);
  void DeleteBlock(BlockId id);
  SegmentId NewSegment(const Segment& segment);
  void DeleteSegment(SegmentId id);
  /// Makes block `id` free: merges with free neighbours, indexes the result.
  void InsertFree(BlockId id);
  void RemoveFree(BlockId id);
  /// Whether [addr, addr+size) overlaps an existing segment; on overflow too.
  Status CheckNoOverlap(std::uint64_t addr, std::uint64_t size) const;
  /// The segment containing addr, or kNone.
  SegmentId SegmentContaining(std::uint64_t addr) const;
  /// Describes what lies at `addr` (for error messages; may walk a segment).
  std::string DescribeAddress(std::uint64_t addr) const;
  /// Subtracts (leaving) or adds (entering) the segment's releasable contribution.
  void UpdateReleasable(const Segment& s, bool entering);

  std::int32_t device_;
  AllocatorRules rules_;
  std::array<PoolCounters, 2> pools_;
  std::vector<Block> blocks_;
  std::vector<BlockId> free_block_ids_;
  std::vector<Segment> segments_;
  std::vector<SegmentId> free_segment_ids_;
  std::map<std::uint64_t, SegmentId> segments_by_addr_;
  AddressIndex block_index_;  // block start address -> block id
  // FindBlock's memo. A block id keeps its start address until DeleteBlock, which clears it.
  std::uint64_t last_found_addr_ = 0;
  BlockId last_found_ = kNone;
  std::uint64_t num_ooms_ = 0;
  std::optional<OomRecord> last_oom_;
};

}  // namespace fragscope::model

#endif  // FRAGSCOPE_MODEL_DEVICE_MEMORY_H_
