#include "testing/reference_allocator.h"

#include <algorithm>

namespace fragscope::testing {

namespace {
constexpr std::uint64_t kMiB = 1 << 20;

std::uint64_t Round(std::uint64_t n) { return n < 512 ? 512 : (n + 511) / 512 * 512; }
std::uint64_t SegmentSize(std::uint64_t s) {
  if (s <= kMiB) return 2 * kMiB;
  if (s < 10 * kMiB) return 20 * kMiB;
  return (s + 2 * kMiB - 1) / (2 * kMiB) * (2 * kMiB);
}
Event Make(Action action, std::uint64_t addr, std::uint64_t size) {
  Event e;
  e.action = action;
  e.addr = addr;
  e.size = size;
  return e;
}
}  // namespace

std::uint64_t ReferenceAllocator::Malloc(std::uint64_t request, std::vector<Event>* out) {
  const std::uint64_t size = Round(request);
  const bool small = size <= kMiB;
  // Best fit: smallest free block of the pool that fits, lowest address among equals.
  RefSegment* best_seg = nullptr;
  std::size_t best = 0;
  for (RefSegment& seg : segments_) {
    if (seg.small != small) continue;
    for (std::size_t i = 0; i < seg.blocks.size(); ++i) {
      const RefBlock& b = seg.blocks[i];
      if (b.allocated || b.size < size) continue;
      if (best_seg == nullptr || b.size < best_seg->blocks[best].size ||
          (b.size == best_seg->blocks[best].size && b.addr < best_seg->blocks[best].addr)) {
        best_seg = &seg;
        best = i;
      }
    }
  }
  if (best_seg == nullptr) {
    const std::uint64_t seg_size = SegmentSize(size);
    if (reserved() + seg_size > capacity_) {
      EmptyCache(out);  // PyTorch frees every wholly free cached segment and retries
      if (reserved() + seg_size > capacity_) return 0;
    }
    // Lowest 2 MiB-aligned address from the base where the segment fits.
    std::uint64_t addr = kBaseAddress;
    for (const RefSegment& s : segments_) {
      if (addr + seg_size <= s.addr) break;
      const std::uint64_t end = s.blocks.back().addr + s.blocks.back().size;
      addr = std::max(addr, (end + 2 * kMiB - 1) / (2 * kMiB) * (2 * kMiB));
    }
    RefSegment seg;
    seg.addr = addr;
    seg.small = small;
    seg.blocks.push_back(RefBlock{seg.addr, seg_size, 0, false});
    out->push_back(Make(Action::kSegmentAlloc, seg.addr, seg_size));
    auto pos = std::lower_bound(segments_.begin(), segments_.end(), seg.addr,
                                [](const RefSegment& s, std::uint64_t a) { return s.addr < a; });
    best_seg = &*segments_.insert(pos, std::move(seg));
    best = 0;
  }
  RefBlock& b = best_seg->blocks[best];
  const std::uint64_t rest = b.size - size;
  const bool split = small ? rest >= 512 : rest > kMiB;
  if (split) {
    RefBlock tail{b.addr + size, rest, 0, false};
    b.size = size;
    best_seg->blocks.insert(best_seg->blocks.begin() + static_cast<long>(best) + 1, tail);
  }
  RefBlock& chosen = best_seg->blocks[best];
  chosen.allocated = true;
  chosen.requested = request;
  out->push_back(Make(Action::kAlloc, chosen.addr, request));
  return chosen.addr;
}

void ReferenceAllocator::Free(std::uint64_t addr, std::vector<Event>* out) {
  for (RefSegment& seg : segments_) {
    for (std::size_t i = 0; i < seg.blocks.size(); ++i) {
      if (seg.blocks[i].addr != addr) continue;
      out->push_back(Make(Action::kFreeRequested, addr, seg.blocks[i].requested));
      out->push_back(Make(Action::kFreeCompleted, addr, seg.blocks[i].requested));
      seg.blocks[i].allocated = false;
      seg.blocks[i].requested = 0;
      if (i + 1 < seg.blocks.size() && !seg.blocks[i + 1].allocated) {
        seg.blocks[i].size += seg.blocks[i + 1].size;
        seg.blocks.erase(seg.blocks.begin() + static_cast<long>(i) + 1);
      }
      if (i > 0 && !seg.blocks[i - 1].allocated) {
        seg.blocks[i - 1].size += seg.blocks[i].size;
        seg.blocks.erase(seg.blocks.begin() + static_cast<long>(i));
      }
      return;
    }
  }
}

std::uint64_t ReferenceAllocator::reserved() const {
  std::uint64_t total = 0;
  for (const RefSegment& s : segments_) {
    for (const RefBlock& b : s.blocks) total += b.size;
  }
  return total;
}

void ReferenceAllocator::EmptyCache(std::vector<Event>* out) {
  std::vector<RefSegment> kept;
  for (RefSegment& seg : segments_) {
    if (seg.blocks.size() == 1 && !seg.blocks[0].allocated) {
      out->push_back(Make(Action::kSegmentFree, seg.addr, seg.blocks[0].size));
    } else {
      kept.push_back(std::move(seg));
    }
  }
  segments_ = std::move(kept);
}

}  // namespace fragscope::testing
