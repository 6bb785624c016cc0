// Private helpers of CachingAllocatorSim (src/model/caching_allocator_sim.cc); not a public API.
//
//   NodeRecycler  a memory resource that recycles the fixed-size nodes of the simulator's ordered
//                 sets, so that inserting into and erasing from a free set does not touch the
//                 heap once the set has reached its high-water mark.
//   GranuleSpace  the simulated driver's cudaMalloc address space: whole 2 MiB granules from a
//                 fixed base, placed at the lowest address where the run fits (first fit). A
//                 segment tree over granules answers "lowest free run of k granules" in O(log n).
//   RangeSpace    first fit over a small sorted list of free ranges; used for the rare virtual
//                 address reservations of expandable segments.
//
// Thread safety: none.
#ifndef FRAGSCOPE_MODEL_SIM_INTERNAL_H_
#define FRAGSCOPE_MODEL_SIM_INTERNAL_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory_resource>
#include <vector>

#include "fragscope/status.h"

namespace fragscope::model::internal {

/// Recycles nodes by size class (up to four distinct sizes, enough for two std::set node
/// types); other sizes go to the default resource. Memory is returned only at destruction.
class NodeRecycler final : public std::pmr::memory_resource {
 public:
  NodeRecycler() = default;
  NodeRecycler(const NodeRecycler&) = delete;
  NodeRecycler& operator=(const NodeRecycler&) = delete;
  ~NodeRecycler() override;

 private:
  static constexpr std::size_t kAlign = alignof(std::max_align_t);
  static constexpr std::size_t kMaxNodeBytes = 256;
  static constexpr std::size_t kChunkBytes = 64 * 1024;
  struct FreeNode {
    FreeNode* next;
  };
  struct SizeClass {
    std::size_t bytes = 0;  // 0 = slot unused
    FreeNode* head = nullptr;
  };

  void* do_allocate(std::size_t bytes, std::size_t alignment) override;
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment) override;
  bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override {
    return this == &other;
  }

  std::array<SizeClass, 4> classes_{};
  std::vector<void*> chunks_;
  char* cursor_ = nullptr;
  std::size_t left_ = 0;
};

/// The cudaMalloc address space. REQUIRES: every size is a positive multiple of `granule`.
/// A sparse segment tree over the granules: a node is split only where a range boundary falls
/// inside it, so memory follows the ranges handed out (about 2 x 20 bytes per tree level for
/// each), never the span: a device of 2^60 bytes served in 4 TiB pieces takes kilobytes, not
/// the 512 MiB a dense tree over 32 TiB did (issue 30 item 5). Spans are capped at
/// kMaxGranules granules (32 TiB of 2 MiB granules).
class GranuleSpace {
 public:
  static constexpr std::uint32_t kMaxGranules = std::uint32_t{1} << 24;

  GranuleSpace(std::uint64_t base, std::uint64_t granule);

  /// Marks the lowest free run of `bytes` used and returns its address; 0 when the run would
  /// end beyond kMaxGranules (the caller treats that as the driver being out of memory).
  std::uint64_t Allocate(std::uint64_t bytes);
  /// Marks [addr, addr + bytes) free. REQUIRES: exactly a range Allocate returned.
  void Free(std::uint64_t addr, std::uint64_t bytes);
  std::uint64_t base() const { return base_; }
  /// Live ranges: address -> bytes.
  const std::map<std::uint64_t, std::uint64_t>& used() const { return used_; }
  /// Verifies that the tree agrees with used(). O(n).
  Status Check() const;

 private:
  struct Node {
    std::uint32_t pref = 0;  // free granules at the start of the node's range
    std::uint32_t suf = 0;   // free granules at its end
    std::uint32_t best = 0;  // longest free run inside it
    std::uint8_t tag = 0;    // pending assignment for the children: 0 none, 1 free, 2 used
    std::uint32_t left = 0;  // index of the left child (the right one follows); 0 = none yet
  };
  static constexpr std::uint8_t kFree = 1;
  static constexpr std::uint8_t kUsed = 2;

  void Rebuild(std::uint32_t leaves);
  void ApplyTag(std::size_t node, std::uint32_t len, std::uint8_t tag);
  void Push(std::size_t node, std::uint32_t len);
  void Pull(std::size_t node, std::uint32_t len);
  void Assign(std::size_t node, std::uint32_t lo, std::uint32_t len, std::uint32_t l,
              std::uint32_t r, std::uint8_t tag);
  std::uint32_t FindFirst(std::size_t node, std::uint32_t lo, std::uint32_t len, std::uint32_t k);
  std::uint32_t CountFree(std::size_t node, std::uint32_t lo, std::uint32_t len, std::uint32_t l,
                          std::uint32_t r) const;

  std::uint64_t base_;
  std::uint64_t granule_;
  std::uint32_t leaves_ = 0;
  std::vector<Node> tree_;  // root at 1; a node without children (left 0) is uniform
  std::map<std::uint64_t, std::uint64_t> used_;
};

/// First fit over free ranges of a fixed window [base, base + span).
class RangeSpace {
 public:
  RangeSpace(std::uint64_t base, std::uint64_t span);
  /// Lowest address where `bytes` fit, or 0 when the window is exhausted.
  std::uint64_t Allocate(std::uint64_t bytes);
  void Free(std::uint64_t addr, std::uint64_t bytes);

 private:
  std::map<std::uint64_t, std::uint64_t> free_;  // address -> bytes, coalesced
};

}  // namespace fragscope::model::internal

#endif  // FRAGSCOPE_MODEL_SIM_INTERNAL_H_
