#include "model/sim_internal.h"

#include <algorithm>
#include <iterator>
#include <new>

#include <fmt/format.h>

namespace fragscope::model::internal {

// ---------------------------------------------------------------------------------------------
// NodeRecycler

NodeRecycler::~NodeRecycler() {
  for (void* chunk : chunks_) ::operator delete(chunk);
}

void* NodeRecycler::do_allocate(std::size_t bytes, std::size_t alignment) {
  if (alignment > kAlign || bytes > kMaxNodeBytes || bytes == 0) {
    return std::pmr::new_delete_resource()->allocate(bytes, alignment);
  }
  bytes = (bytes + kAlign - 1) / kAlign * kAlign;
  SizeClass* cls = nullptr;
  for (SizeClass& c : classes_) {
    if (c.bytes == bytes) {
      cls = &c;
      break;
    }
    if (c.bytes == 0) {  // claim the first unused slot for this size, for good
      c.bytes = bytes;
      cls = &c;
      break;
    }
  }
  if (cls == nullptr) return std::pmr::new_delete_resource()->allocate(bytes, alignment);
  if (cls->head != nullptr) {
    FreeNode* node = cls->head;
    cls->head = node->next;
    return node;
  }
  if (left_ < bytes) {
    cursor_ = static_cast<char*>(::operator new(kChunkBytes));
    chunks_.push_back(cursor_);
    left_ = kChunkBytes;
  }
  void* p = cursor_;
  cursor_ += bytes;
  left_ -= bytes;
  return p;
}

void NodeRecycler::do_deallocate(void* p, std::size_t bytes, std::size_t alignment) {
  if (alignment > kAlign || bytes > kMaxNodeBytes || bytes == 0) {
    std::pmr::new_delete_resource()->deallocate(p, bytes, alignment);
    return;
  }
  bytes = (bytes + kAlign - 1) / kAlign * kAlign;
  for (SizeClass& c : classes_) {
    if (c.bytes == bytes) {
      FreeNode* node = static_cast<FreeNode*>(p);
      node->next = c.head;
      c.head = node;
      return;
    }
  }
  // No class was claimed for this size when it was allocated: it came from the default resource.
  std::pmr::new_delete_resource()->deallocate(p, bytes, alignment);
}

// ---------------------------------------------------------------------------------------------
// GranuleSpace

GranuleSpace::GranuleSpace(std::uint64_t base, std::uint64_t granule)
    : base_(base), granule_(granule) {
  Rebuild(1024);
}

void GranuleSpace::ApplyTag(std::size_t node, std::uint32_t len, std::uint8_t tag) {
  Node& n = tree_[node];
  const std::uint32_t v = tag == kFree ? len : 0;
  n.pref = n.suf = n.best = v;
  n.tag = tag;
}

void GranuleSpace::Push(std::size_t node, std::uint32_t len) {
  const std::uint8_t tag = tree_[node].tag;
  if (tag == 0) return;
  if (tree_[node].left == 0) {  // uniform so far: its children are made now (the tree is sparse)
    tree_[node].left = static_cast<std::uint32_t>(tree_.size());
    tree_.resize(tree_.size() + 2);
  }
  const std::size_t left = tree_[node].left;
  ApplyTag(left, len / 2, tag);
  ApplyTag(left + 1, len / 2, tag);
  tree_[node].tag = 0;
}

void GranuleSpace::Pull(std::size_t node, std::uint32_t len) {
  const std::uint32_t half = len / 2;
  const std::size_t left = tree_[node].left;
  const Node& l = tree_[left];
  const Node& r = tree_[left + 1];
  Node& n = tree_[node];
  n.pref = l.pref == half ? half + r.pref : l.pref;
  n.suf = r.suf == half ? half + l.suf : r.suf;
  n.best = std::max({l.best, r.best, l.suf + r.pref});
}

void GranuleSpace::Assign(std::size_t node, std::uint32_t lo, std::uint32_t len, std::uint32_t l,
                          std::uint32_t r, std::uint8_t tag) {
  if (r <= lo || lo + len <= l) return;
  if (l <= lo && lo + len <= r) {
    ApplyTag(node, len, tag);
    return;
  }
  Push(node, len);
  const std::size_t left = tree_[node].left;
  Assign(left, lo, len / 2, l, r, tag);
  Assign(left + 1, lo + len / 2, len / 2, l, r, tag);
  Pull(node, len);
}

std::uint32_t GranuleSpace::FindFirst(std::size_t node, std::uint32_t lo, std::uint32_t len,
                                      std::uint32_t k) {
  // REQUIRES: tree_[node].best >= k. The leftmost run lies in the left child if that has one;
  // else it starts in the left child's free suffix if that reaches far enough; else it is right.
  if (len == 1) return lo;
  // A uniform node (all free: best >= k) holds the run at its start; no need to split it.
  if (tree_[node].best == len) return lo;
  Push(node, len);
  const std::uint32_t half = len / 2;
  const std::size_t left = tree_[node].left;
  const Node& l = tree_[left];
  const Node& r = tree_[left + 1];
  if (l.best >= k) return FindFirst(left, lo, half, k);
  if (l.suf + r.pref >= k) return lo + half - l.suf;
  return FindFirst(left + 1, lo + half, half, k);
}

std::uint32_t GranuleSpace::CountFree(std::size_t node, std::uint32_t lo, std::uint32_t len,
                                      std::uint32_t l, std::uint32_t r) const {
  if (r <= lo || lo + len <= l) return 0;
  const Node& n = tree_[node];
  // Leaves and nodes with a pending tag are uniform, so best is 0 (all used) or len (all free);
  // only mixed nodes, whose children are current, need the descent.
  if (n.best == 0) return 0;
  if (n.best == len) return std::min(r, lo + len) - std::max(l, lo);
  return CountFree(n.left, lo, len / 2, l, r) + CountFree(n.left + 1, lo + len / 2, len / 2, l, r);
}

void GranuleSpace::Rebuild(std::uint32_t leaves) {
  leaves_ = leaves;
  tree_.assign(2, Node{});  // [0] unused (0 is "no children"), [1] the root
  tree_.shrink_to_fit();
  ApplyTag(1, leaves_, kFree);
  for (const auto& [addr, bytes] : used_) {
    const auto l = static_cast<std::uint32_t>((addr - base_) / granule_);
    const auto n = static_cast<std::uint32_t>(bytes / granule_);
    Assign(1, 0, leaves_, l, l + n, kUsed);
  }
}

std::uint64_t GranuleSpace::Allocate(std::uint64_t bytes) {
  if (bytes / granule_ > kMaxGranules) return 0;
  const auto k = static_cast<std::uint32_t>(bytes / granule_);
  // The space beyond the tree is free; doubling the tree until the run fits finds the lowest
  // address in the unbounded space.
  while (tree_[1].best < k) {
    if (leaves_ >= kMaxGranules) return 0;
    Rebuild(leaves_ * 2);
  }
  const std::uint32_t start = FindFirst(1, 0, leaves_, k);
  Assign(1, 0, leaves_, start, start + k, kUsed);
  const std::uint64_t addr = base_ + std::uint64_t{start} * granule_;
  used_.emplace(addr, bytes);
  return addr;
}

void GranuleSpace::Free(std::uint64_t addr, std::uint64_t bytes) {
  const auto l = static_cast<std::uint32_t>((addr - base_) / granule_);
  const auto n = static_cast<std::uint32_t>(bytes / granule_);
  Assign(1, 0, leaves_, l, l + n, kFree);
  used_.erase(addr);
}

Status GranuleSpace::Check() const {
  std::uint64_t prev_end = base_;
  std::uint64_t used_granules = 0;
  for (const auto& [addr, bytes] : used_) {
    if (addr < prev_end || (addr - base_) % granule_ != 0 || bytes % granule_ != 0 || bytes == 0) {
      return Status::Internal(fmt::format("address space: bad live range {:#x} + {}", addr, bytes));
    }
    const auto l = static_cast<std::uint32_t>((addr - base_) / granule_);
    const auto n = static_cast<std::uint32_t>(bytes / granule_);
    if (std::uint64_t{l} + n > leaves_ || CountFree(1, 0, leaves_, l, l + n) != 0) {
      return Status::Internal(
          fmt::format("address space: live range {:#x} + {} is not marked used", addr, bytes));
    }
    used_granules += n;
    prev_end = addr + bytes;
  }
  if (CountFree(1, 0, leaves_, 0, leaves_) + used_granules != leaves_) {
    return Status::Internal("address space: the tree marks ranges used that are not live");
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// RangeSpace

RangeSpace::RangeSpace(std::uint64_t base, std::uint64_t span) { free_.emplace(base, span); }

std::uint64_t RangeSpace::Allocate(std::uint64_t bytes) {
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < bytes) continue;
    const std::uint64_t addr = it->first;
    const std::uint64_t rest = it->second - bytes;
    free_.erase(it);
    if (rest > 0) free_.emplace(addr + bytes, rest);
    return addr;
  }
  return 0;
}

void RangeSpace::Free(std::uint64_t addr, std::uint64_t bytes) {
  auto next = free_.lower_bound(addr);
  if (next != free_.end() && next->first == addr + bytes) {
    bytes += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == addr) {
      prev->second += bytes;
      return;
    }
  }
  free_.emplace(addr, bytes);
}

}  // namespace fragscope::model::internal
