#include "model/device_memory.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/units.h"

namespace fragscope::model {

std::string_view BlockStateName(BlockState state) {
  switch (state) {
    case BlockState::kFree:
      return "free";
    case BlockState::kAllocated:
      return "allocated";
    case BlockState::kPendingFree:
      return "pending_free";
  }
  return "?";
}

DeviceMemory::DeviceMemory(std::int32_t device, AllocatorRules rules)
    : device_(device), rules_(rules) {}

// ---------------------------------------------------------------------------------------------
// Storage

BlockId DeviceMemory::NewBlock(const Block& block) {
  BlockId id;
  if (!free_block_ids_.empty()) {
    id = free_block_ids_.back();
    free_block_ids_.pop_back();
    blocks_[id] = block;
  } else {
    id = static_cast<BlockId>(blocks_.size());
    blocks_.push_back(block);
  }
  block_index_.Insert(block.addr, id);
  return id;
}

BlockId DeviceMemory::FindBlock(std::uint64_t addr) {
  if (addr == last_found_addr_ && last_found_ != kNone) return last_found_;
  const BlockId id = block_index_.Find(addr);
  if (id != AddressIndex::kNotFound) {
    last_found_addr_ = addr;
    last_found_ = id;
  }
  return id;
}

void DeviceMemory::DeleteBlock(BlockId id) {
  if (id == last_found_) last_found_ = kNone;
  block_index_.Erase(blocks_[id].addr);
  blocks_[id].segment = kNone;
  free_block_ids_.push_back(id);
}

SegmentId DeviceMemory::NewSegment(const Segment& segment) {
  SegmentId id;
  if (!free_segment_ids_.empty()) {
    id = free_segment_ids_.back();
    free_segment_ids_.pop_back();
    segments_[id] = segment;
  } else {
    id = static_cast<SegmentId>(segments_.size());
    segments_.push_back(segment);
  }
  segments_by_addr_.emplace(segment.addr, id);
  return id;
}

void DeviceMemory::DeleteSegment(SegmentId id) {
  segments_by_addr_.erase(segments_[id].addr);
  segments_[id].num_blocks = 0;
  free_segment_ids_.push_back(id);
}

void DeviceMemory::UpdateReleasable(const Segment& s, bool entering) {
  // Neighbouring free blocks always merge, so no live block means one free block.
  if (s.live_blocks != 0) return;
  if (entering)
    counters(s).releasable += s.size;
  else
    counters(s).releasable -= s.size;
}

void DeviceMemory::RemoveFree(BlockId id) { counters(blocks_[id]).free.Remove(blocks_[id].size); }

void DeviceMemory::InsertFree(BlockId id) {
  Block* b = &blocks_[id];
  Segment& s = segments_[b->segment];
  b->state = BlockState::kFree;
  b->requested = 0;
  b->frame = -1;
  // Merge with the previous neighbour: it absorbs this block.
  if (b->prev != kNone && blocks_[b->prev].state == BlockState::kFree) {
    const BlockId prev = b->prev;
    RemoveFree(prev);
    blocks_[prev].size += b->size;
    blocks_[prev].next = b->next;
    if (b->next != kNone)
      blocks_[b->next].prev = prev;
    else
      s.last = prev;
    --s.num_blocks;
    DeleteBlock(id);
    id = prev;
    b = &blocks_[id];
  }
  // Merge with the next neighbour: this block absorbs it.
  if (b->next != kNone && blocks_[b->next].state == BlockState::kFree) {
    const BlockId next = b->next;
    RemoveFree(next);
    b->size += blocks_[next].size;
    b->next = blocks_[next].next;
    if (b->next != kNone)
      blocks_[b->next].prev = id;
    else
      s.last = id;
    --s.num_blocks;
    DeleteBlock(next);
  }
  counters(s).free.Add(b->size);
}

// ---------------------------------------------------------------------------------------------
// Lookups for validation and messages

Status DeviceMemory::CheckNoOverlap(std::uint64_t addr, std::uint64_t size) const {
  if (size == 0) return Status::Corruption("size is 0");
  if (addr + size < addr) {
    return Status::Corruption(
        fmt::format("range {} + {} bytes wraps past the end of the "
                    "address space",
                    FormatAddress(addr), size));
  }
  auto it = segments_by_addr_.lower_bound(addr);
  if (it != segments_by_addr_.end() && it->first < addr + size) {
    const Segment& s = segments_[it->second];
    return Status::Corruption(fmt::format("range [{}, {}) overlaps the segment at {} ({} bytes)",
                                          FormatAddress(addr), FormatAddress(addr + size),
                                          FormatAddress(s.addr), s.size));
  }
  if (it != segments_by_addr_.begin()) {
    const Segment& s = segments_[std::prev(it)->second];
    if (s.end() > addr) {
      return Status::Corruption(fmt::format("range [{}, {}) overlaps the segment at {} ({} bytes)",
                                            FormatAddress(addr), FormatAddress(addr + size),
                                            FormatAddress(s.addr), s.size));
    }
  }
  return Status::Ok();
}

SegmentId DeviceMemory::SegmentContaining(std::uint64_t addr) const {
  auto it = segments_by_addr_.upper_bound(addr);
  if (it == segments_by_addr_.begin()) return kNone;
  const SegmentId id = std::prev(it)->second;
  return segments_[id].end() > addr ? id : kNone;
}

std::string DeviceMemory::DescribeAddress(std::uint64_t addr) const {
  const SegmentId sid = SegmentContaining(addr);
  if (sid == kNone) return "it lies outside every segment";
  const Segment& s = segments_[sid];
  for (BlockId b = s.first; b != kNone; b = blocks_[b].next) {
    if (blocks_[b].addr <= addr && addr < blocks_[b].end()) {
      return fmt::format("it lies inside the {} block [{}, {}) of the segment at {}",
                         BlockStateName(blocks_[b].state), FormatAddress(blocks_[b].addr),
                         FormatAddress(blocks_[b].end()), FormatAddress(s.addr));
    }
  }
  return "the segment's blocks do not cover it (model bug)";
}

// ---------------------------------------------------------------------------------------------
// Events

Status DeviceMemory::Apply(const Event& e) {
  switch (e.action) {
    case Action::kAlloc:
      return Alloc(e);
    case Action::kBlock:
      return PlaceBlock(e);
    case Action::kFreeRequested:
      return FreeRequested(e);
    case Action::kFreeCompleted:
      return FreeCompleted(e);
    case Action::kSegmentAlloc:
      return SegmentAlloc(e);
    case Action::kSegmentFree:
      return SegmentFree(e);
    case Action::kSegmentMap:
      return SegmentMap(e);
    case Action::kSegmentUnmap:
      return SegmentUnmap(e);
    case Action::kOom:
      ++num_ooms_;
      last_oom_ = OomRecord{e.size, e.device_free};
      return Status::Ok();
    default:
      return Status::Ok();  // markers and replay controls do not change the layout
  }
}

Status DeviceMemory::SegmentAlloc(const Event& e) {
  if (Status st = CheckNoOverlap(e.addr, e.size); !st.ok()) {
    return st.WithPrefix(fmt::format("segment_alloc at {}", FormatAddress(e.addr)));
  }
  Segment s;
  s.addr = e.addr;
  s.size = e.size;
  s.stream = e.stream;
  // Small-pool segments are exactly kSmallBuffer; large ones are >= kMinLargeAlloc (§4.3).
  s.pool =
      e.pool != Pool::kUnknown ? e.pool : (e.size <= kSmallBuffer ? Pool::kSmall : Pool::kLarge);
  const SegmentId sid = NewSegment(s);
  Block b;
  b.addr = e.addr;
  b.size = e.size;
  b.segment = sid;
  b.pool = s.pool;
  const BlockId bid = NewBlock(b);
  Segment& seg = segments_[sid];
  seg.first = seg.last = bid;
  seg.num_blocks = 1;
  PoolCounters& c = counters(seg);
  c.reserved += e.size;
  ++c.segment_count;
  c.free.Add(e.size);
  UpdateReleasable(seg, true);
  return Status::Ok();
}

Status DeviceMemory::SegmentFree(const Event& e) {
  auto it = segments_by_addr_.find(e.addr);
  if (it == segments_by_addr_.end()) {
    return Status::Corruption(fmt::format("segment_free at {}: no segment starts there ({})",
                                          FormatAddress(e.addr), DescribeAddress(e.addr)));
  }
  const SegmentId sid = it->second;
  Segment& s = segments_[sid];
  if (e.size != 0 && e.size != s.size) {
    return Status::Corruption(fmt::format("segment_free at {}: size {} but the segment has {}",
                                          FormatAddress(e.addr), e.size, s.size));
  }
  if (s.num_blocks != 1 || blocks_[s.first].state != BlockState::kFree) {
    std::uint64_t live = 0;
    ForEachBlock(s, [&](const Block& b) { live += b.state != BlockState::kFree; });
    return Status::Corruption(
        fmt::format("segment_free at {}: the segment still holds {} allocated or pending block(s)",
                    FormatAddress(e.addr), live));
  }
  UpdateReleasable(s, false);
  PoolCounters& c = counters(s);
  c.free.Remove(s.size);
  c.reserved -= s.size;
  --c.segment_count;
  DeleteBlock(s.first);
  DeleteSegment(sid);
  return Status::Ok();
}

Status DeviceMemory::SegmentMap(const Event& e) {
  if (Status st = CheckNoOverlap(e.addr, e.size); !st.ok()) {
    return st.WithPrefix(fmt::format("segment_map at {}", FormatAddress(e.addr)));
  }
  // A mapped range that touches an expandable segment of the same stream extends it: PyTorch
  // reports one segment per contiguous mapped range (shared/spec/memory-snapshot-format.md §3).
  auto joinable = [&](SegmentId id) {
    const Segment& s = segments_[id];
    return s.expandable && s.stream == e.stream && (e.pool == Pool::kUnknown || e.pool == s.pool);
  };
  SegmentId left = kNone, right = kNone;
  auto it = segments_by_addr_.lower_bound(e.addr);
  if (it != segments_by_addr_.end() && it->first == e.addr + e.size && joinable(it->second)) {
    right = it->second;
  }
  if (it != segments_by_addr_.begin()) {
    const SegmentId id = std::prev(it)->second;
    if (segments_[id].end() == e.addr && joinable(id)) left = id;
  }
  if (left != kNone && right != kNone && segments_[left].pool != segments_[right].pool) {
    right = kNone;
  }

  if (left == kNone && right == kNone) {
    Event seg_event = e;
    if (seg_event.pool == Pool::kUnknown) {
      // Expandable pages are 2 MiB in the small pool and 20 MiB in the large one (§6.1).
      seg_event.pool = e.size % kLargeBuffer == 0 ? Pool::kLarge : Pool::kSmall;
    }
    FRAGSCOPE_RETURN_IF_ERROR(SegmentAlloc(seg_event));
    segments_[segments_by_addr_.at(e.addr)].expandable = true;
    return Status::Ok();
  }

  // The new range becomes one free block, linked at the right place, then merged.
  const SegmentId sid = left != kNone ? left : right;
  Segment* s = &segments_[sid];
  UpdateReleasable(*s, false);
  if (right != kNone) UpdateReleasable(segments_[right], false);
  Block nb;
  nb.addr = e.addr;
  nb.size = e.size;
  nb.segment = sid;
  nb.pool = segments_[sid].pool;
  const BlockId bid = NewBlock(nb);
  s = &segments_[sid];
  if (left != kNone) {
    blocks_[bid].prev = s->last;
    blocks_[s->last].next = bid;
    s->last = bid;
    s->size += e.size;
    ++s->num_blocks;
    if (right != kNone) {
      // Absorb the right segment: relabel its blocks and link them after the new block.
      Segment& r = segments_[right];
      for (BlockId b = r.first; b != kNone; b = blocks_[b].next) blocks_[b].segment = sid;
      blocks_[bid].next = r.first;
      blocks_[r.first].prev = bid;
      s->last = r.last;
      s->size += r.size;
      s->num_blocks += r.num_blocks;
      s->live_blocks += r.live_blocks;
      --counters(r).segment_count;
      DeleteSegment(right);
    }
  } else {
    // Extend the right segment downwards: its start address changes.
    segments_by_addr_.erase(s->addr);
    s->addr = e.addr;
    s->size += e.size;
    segments_by_addr_.emplace(s->addr, sid);
    blocks_[bid].next = s->first;
    blocks_[s->first].prev = bid;
    s->first = bid;
    ++s->num_blocks;
  }
  counters(*s).reserved += e.size;
  InsertFree(bid);
  UpdateReleasable(segments_[sid], true);
  return Status::Ok();
}

Status DeviceMemory::SegmentUnmap(const Event& e) {
  const std::string where = fmt::format("segment_unmap of [{}, {})", FormatAddress(e.addr),
                                        FormatAddress(e.addr + e.size));
  if (e.size == 0) return Status::Corruption(where + ": size is 0");
  if (e.addr + e.size < e.addr) return Status::Corruption(where + ": range wraps");
  const SegmentId sid = SegmentContaining(e.addr);
  if (sid == kNone) return Status::Corruption(where + ": no segment contains it");
  // Unmapped pages always lie inside one free block (§6.4). O(blocks in the segment).
  BlockId bid = kNone;
  for (BlockId b = segments_[sid].first; b != kNone; b = blocks_[b].next) {
    if (blocks_[b].addr <= e.addr && e.addr < blocks_[b].end()) {
      bid = b;
      break;
    }
  }
  if (bid == kNone) return Status::Internal(where + ": the segment's blocks do not cover it");
  const Block target = blocks_[bid];
  if (target.state != BlockState::kFree || e.addr + e.size > target.end()) {
    return Status::Corruption(
        fmt::format("{}: the range must lie inside one free block, but {}", where,
                    DescribeAddress(target.state != BlockState::kFree ? e.addr : target.end())));
  }
  Segment s = segments_[sid];
  UpdateReleasable(s, false);
  PoolCounters& c = counters(s);
  c.free.Remove(target.size);
  c.reserved -= e.size;

  const std::uint64_t left_size = e.addr - target.addr;
  const std::uint64_t right_size = target.end() - (e.addr + e.size);
  // Left part stays in this segment (keeps the block id); the right part, with every block
  // after it, becomes a new segment.
  BlockId right_first = kNone;
  if (right_size > 0) {
    Block rb;
    rb.addr = e.addr + e.size;
    rb.size = right_size;
    rb.next = target.next;
    rb.pool = s.pool;
    right_first = NewBlock(rb);
  } else {
    right_first = target.next;
  }
  const BlockId right_last = right_size > 0 && target.next == kNone ? right_first : s.last;
  if (right_size > 0 && target.next != kNone) blocks_[target.next].prev = right_first;

  // The part before the unmapped range.
  BlockId left_last = kNone;
  if (left_size > 0) {
    blocks_[bid].size = left_size;
    blocks_[bid].next = kNone;
    left_last = bid;
  } else {
    left_last = target.prev;
    if (left_last != kNone) blocks_[left_last].next = kNone;
    DeleteBlock(bid);
  }

  // Rebuild the left segment (or delete it) and create the right one.
  std::uint32_t left_blocks = 0;
  if (left_last != kNone) {
    Segment& ls = segments_[sid];
    ls.last = left_last;
    ls.size = (blocks_[left_last].end()) - ls.addr;
    std::uint32_t left_live = 0;
    for (BlockId b = ls.first; b != kNone; b = blocks_[b].next) {
      ++left_blocks;
      left_live += blocks_[b].state != BlockState::kFree;
    }
    ls.num_blocks = left_blocks;
    ls.live_blocks = left_live;
    if (left_size > 0) c.free.Add(left_size);
    UpdateReleasable(ls, true);
  } else {
    --c.segment_count;
    DeleteSegment(sid);
  }
  if (right_first != kNone) {
    blocks_[right_first].prev = kNone;
    Segment rs;
    rs.addr = blocks_[right_first].addr;
    rs.stream = s.stream;
    rs.pool = s.pool;
    rs.expandable = s.expandable;
    rs.first = right_first;
    rs.last = right_last;
    const SegmentId rid = NewSegment(rs);
    std::uint32_t n = 0, live = 0;
    for (BlockId b = right_first; b != kNone; b = blocks_[b].next) {
      blocks_[b].segment = rid;
      ++n;
      live += blocks_[b].state != BlockState::kFree;
    }
    Segment& r = segments_[rid];
    r.num_blocks = n;
    r.live_blocks = live;
    r.size = blocks_[r.last].end() - r.addr;
    ++c.segment_count;
    if (right_size > 0) c.free.Add(right_size);
    UpdateReleasable(r, true);
  }
  return Status::Ok();
}

Status DeviceMemory::Alloc(const Event& e) {
  const BlockId bid = FindBlock(e.addr);
  if (bid == AddressIndex::kNotFound) {
    return Status::Corruption(fmt::format("alloc at {}: no free block starts there ({})",
                                          FormatAddress(e.addr), DescribeAddress(e.addr)));
  }
  Block& b = blocks_[bid];
  if (b.state != BlockState::kFree) {
    return Status::Corruption(fmt::format("alloc at {}: the block there is already {}",
                                          FormatAddress(e.addr), BlockStateName(b.state)));
  }
  if (e.size == 0) return Status::Corruption("alloc of 0 bytes");
  Segment& s = segments_[b.segment];
  std::uint64_t take;
  if (e.block_size != 0) {
    if (e.block_size < e.size) {
      return Status::Corruption(fmt::format("alloc at {}: block_size {} < requested size {}",
                                            FormatAddress(e.addr), e.block_size, e.size));
    }
    take = e.block_size;
  } else {
    take = rules_.RoundSize(e.size);
  }
  if (take > b.size) {
    return Status::Corruption(fmt::format(
        "alloc at {} of {} bytes (block of {}) does not fit the free block of {} bytes there",
        FormatAddress(e.addr), e.size, take, b.size));
  }
  if (e.block_size == 0 && !rules_.ShouldSplit(s.pool, b.size, take)) take = b.size;

  UpdateReleasable(s, false);
  PoolCounters& c = counters(s);
  c.free.Remove(b.size);
  if (take < b.size) {
    Block rest;
    rest.addr = b.addr + take;
    rest.size = b.size - take;
    rest.prev = bid;
    rest.next = b.next;
    rest.segment = b.segment;
    rest.pool = b.pool;
    const BlockId rid = NewBlock(rest);  // may reallocate blocks_
    Block& nb = blocks_[bid];
    if (nb.next != kNone)
      blocks_[nb.next].prev = rid;
    else
      s.last = rid;
    nb.next = rid;
    nb.size = take;
    ++s.num_blocks;
    c.free.Add(rest.size);
  }
  ++s.live_blocks;
  Block& ab = blocks_[bid];
  ab.state = BlockState::kAllocated;
  ab.requested = e.size;
  ab.frame = e.frame;
  c.allocated += take;
  c.active += take;
  c.requested += e.size;
  ++c.allocated_count;
  return Status::Ok();
}

// A block that was live when the trace began (a snapshot's history starts mid-run): it is
// carved out of the free block that contains it, exactly, with no rounding or split rule.
Status DeviceMemory::PlaceBlock(const Event& e) {
  const auto where = [&] {
    return fmt::format("block at {} of {} bytes", FormatAddress(e.addr), e.block_size);
  };
  if (e.size == 0 || e.block_size < e.size) {
    return Status::Corruption(where() + ": needs 0 < size <= block_size");
  }
  const SegmentId sid = SegmentContaining(e.addr);
  if (sid == kNone) return Status::Corruption(where() + ": no segment contains it");
  Segment& s = segments_[sid];
  if (e.block_size > s.end() - e.addr) {
    return Status::Corruption(where() + ": runs past the end of its segment");
  }
  BlockId bid = s.first;
  while (bid != kNone && blocks_[bid].end() <= e.addr) bid = blocks_[bid].next;
  if (bid == kNone || blocks_[bid].state != BlockState::kFree ||
      blocks_[bid].end() < e.addr + e.block_size) {
    return Status::Corruption(where() + ": it overlaps a live block (" + DescribeAddress(e.addr) +
                              ")");
  }
  UpdateReleasable(s, false);
  PoolCounters& c = counters(s);
  c.free.Remove(blocks_[bid].size);
  // Split off a free front [b.addr, e.addr) and a free back [e.addr + block_size, b.end()).
  const auto split_after = [&](BlockId at, std::uint64_t keep) {
    Block rest;
    rest.addr = blocks_[at].addr + keep;
    rest.size = blocks_[at].size - keep;
    rest.prev = at;
    rest.next = blocks_[at].next;
    rest.segment = sid;
    rest.pool = blocks_[at].pool;
    const BlockId rid = NewBlock(rest);  // may reallocate blocks_
    if (blocks_[at].next != kNone)
      blocks_[blocks_[at].next].prev = rid;
    else
      s.last = rid;
    blocks_[at].next = rid;
    blocks_[at].size = keep;
    ++s.num_blocks;
    return rid;
  };
  if (blocks_[bid].addr < e.addr) {
    const BlockId front = bid;
    bid = split_after(front, e.addr - blocks_[front].addr);
    c.free.Add(blocks_[front].size);
  }
  if (blocks_[bid].size > e.block_size) {
    const BlockId back = split_after(bid, e.block_size);
    c.free.Add(blocks_[back].size);
  }
  ++s.live_blocks;
  Block& b = blocks_[bid];
  b.state = BlockState::kAllocated;
  b.requested = e.size;
  b.frame = e.frame;
  c.allocated += b.size;
  c.active += b.size;
  c.requested += e.size;
  ++c.allocated_count;
  return Status::Ok();
}

Status DeviceMemory::FreeRequested(const Event& e) {
  const BlockId bid = FindBlock(e.addr);
  if (bid == AddressIndex::kNotFound || blocks_[bid].state == BlockState::kFree) {
    return Status::Corruption(fmt::format(
        "free_requested at {}: no allocated block starts there ({})", FormatAddress(e.addr),
        bid == AddressIndex::kNotFound ? DescribeAddress(e.addr) : "the block there is free"));
  }
  Block& b = blocks_[bid];
  if (b.state == BlockState::kPendingFree) {
    return Status::Corruption(fmt::format(
        "free_requested at {}: the block was already freed (double free)", FormatAddress(e.addr)));
  }
  if (e.size != 0 && e.size != b.requested) {
    return Status::Corruption(
        fmt::format("free_requested at {}: size {} but the block was allocated for {} bytes",
                    FormatAddress(e.addr), e.size, b.requested));
  }
  PoolCounters& c = counters(b);
  b.state = BlockState::kPendingFree;
  c.allocated -= b.size;
  c.requested -= b.requested;
  --c.allocated_count;
  ++c.pending_count;
  return Status::Ok();
}

Status DeviceMemory::FreeCompleted(const Event& e) {
  const BlockId bid = FindBlock(e.addr);
  if (bid == AddressIndex::kNotFound || blocks_[bid].state == BlockState::kFree) {
    return Status::Corruption(fmt::format(
        "free_completed at {}: no allocated block starts there ({})", FormatAddress(e.addr),
        bid == AddressIndex::kNotFound ? DescribeAddress(e.addr) : "the block there is free"));
  }
  if (blocks_[bid].state == BlockState::kAllocated) {
    // A trace without free_requested (PyTorch's skip_actions, older files): do both steps.
    FRAGSCOPE_RETURN_IF_ERROR(FreeRequested(e));
  }
  Block& b = blocks_[bid];
  Segment& s = segments_[b.segment];
  PoolCounters& c = counters(s);
  c.active -= b.size;
  --c.pending_count;
  InsertFree(bid);
  --s.live_blocks;
  UpdateReleasable(s, true);
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Invariants

Status DeviceMemory::CheckInvariants() const {
  auto fail = [](std::string msg) { return Status::Internal("invariant violated: " + msg); };
  // Recomputed from the blocks; the free-size index is checked through its results.
  struct Expected {
    std::uint64_t reserved = 0, allocated = 0, active = 0, requested = 0, releasable = 0;
    std::uint64_t segment_count = 0, allocated_count = 0, pending_count = 0;
    std::uint64_t free_count = 0, free_bytes = 0, largest_free = 0;
    SizeHistogram histogram;
  };
  std::array<Expected, 2> expect;
  std::uint64_t prev_end = 0;
  bool first_segment = true;
  std::size_t blocks_seen = 0;
  for (const auto& [addr, sid] : segments_by_addr_) {
    const Segment& s = segments_[sid];
    if (s.addr != addr) return fail(fmt::format("segment key {} != addr", FormatAddress(addr)));
    if (s.size == 0) return fail(fmt::format("segment {} has size 0", FormatAddress(addr)));
    if (!first_segment && s.addr < prev_end) {
      return fail(fmt::format("segment {} overlaps its predecessor", FormatAddress(addr)));
    }
    first_segment = false;
    prev_end = s.end();
    Expected& pc = expect[PoolIndex(s.pool)];
    pc.reserved += s.size;
    ++pc.segment_count;
    std::uint64_t cursor = s.addr, total = 0;
    std::uint32_t n = 0, live = 0;
    BlockId prev = kNone;
    bool prev_free = false;
    for (BlockId b = s.first; b != kNone; b = blocks_[b].next) {
      const Block& blk = blocks_[b];
      if (++n > blocks_.size()) return fail("block list cycle");
      if (blk.segment != sid || blk.pool != s.pool) {
        return fail(fmt::format("block {} names another segment or pool", FormatAddress(blk.addr)));
      }
      if (blk.prev != prev) return fail(fmt::format("block {} prev link", FormatAddress(blk.addr)));
      if (blk.addr != cursor) {
        return fail(fmt::format("blocks of segment {} do not tile it at {}", FormatAddress(s.addr),
                                FormatAddress(cursor)));
      }
      if (blk.size == 0) return fail(fmt::format("block {} has size 0", FormatAddress(blk.addr)));
      if (block_index_.Find(blk.addr) != b) {
        return fail(
            fmt::format("block {} missing from the address index", FormatAddress(blk.addr)));
      }
      const bool is_free = blk.state == BlockState::kFree;
      if (is_free && prev_free) {
        return fail(
            fmt::format("neighbouring free blocks at {} were not merged", FormatAddress(blk.addr)));
      }
      if (is_free) {
        ++pc.free_count;
        pc.free_bytes += blk.size;
        pc.largest_free = std::max(pc.largest_free, blk.size);
        ++pc.histogram.count[static_cast<std::size_t>(HistogramBucket(blk.size))];
      }
      if (blk.state == BlockState::kAllocated) {
        pc.allocated += blk.size;
        pc.requested += blk.requested;
        ++pc.allocated_count;
      }
      if (blk.state != BlockState::kFree) pc.active += blk.size;
      if (blk.state == BlockState::kPendingFree) ++pc.pending_count;
      live += !is_free;
      prev_free = is_free;
      cursor += blk.size;
      total += blk.size;
      prev = b;
    }
    if (s.last != prev) return fail(fmt::format("segment {} last link", FormatAddress(s.addr)));
    if (total != s.size || n != s.num_blocks) {
      return fail(
          fmt::format("blocks of segment {} sum to {} bytes in {} blocks, expected {} "
                      "bytes in {}",
                      FormatAddress(s.addr), total, n, s.size, s.num_blocks));
    }
    if (live != s.live_blocks) {
      return fail(fmt::format("segment {} counts {} live blocks, has {}", FormatAddress(s.addr),
                              s.live_blocks, live));
    }
    if (n == 1 && blocks_[s.first].state == BlockState::kFree) pc.releasable += s.size;
    blocks_seen += n;
  }
  if (blocks_seen != block_index_.size()) {
    return fail(fmt::format("address index holds {} entries for {} blocks", block_index_.size(),
                            blocks_seen));
  }
  for (std::size_t p = 0; p < 2; ++p) {
    const PoolCounters& a = pools_[p];
    const Expected& x = expect[p];
    const char* name = p == 0 ? "small" : "large";
    auto check = [&](const char* field, std::uint64_t have, std::uint64_t want) -> Status {
      if (have == want) return Status::Ok();
      return fail(fmt::format("{} pool {}: counter {} != recomputed {}", name, field, have, want));
    };
    FRAGSCOPE_RETURN_IF_ERROR(check("reserved", a.reserved, x.reserved));
    FRAGSCOPE_RETURN_IF_ERROR(check("allocated", a.allocated, x.allocated));
    FRAGSCOPE_RETURN_IF_ERROR(check("active", a.active, x.active));
    FRAGSCOPE_RETURN_IF_ERROR(check("requested", a.requested, x.requested));
    FRAGSCOPE_RETURN_IF_ERROR(check("releasable", a.releasable, x.releasable));
    FRAGSCOPE_RETURN_IF_ERROR(check("segment_count", a.segment_count, x.segment_count));
    FRAGSCOPE_RETURN_IF_ERROR(check("allocated_count", a.allocated_count, x.allocated_count));
    FRAGSCOPE_RETURN_IF_ERROR(check("pending_count", a.pending_count, x.pending_count));
    FRAGSCOPE_RETURN_IF_ERROR(check("free count", a.free.count(), x.free_count));
    FRAGSCOPE_RETURN_IF_ERROR(check("free bytes", a.free.bytes(), x.free_bytes));
    FRAGSCOPE_RETURN_IF_ERROR(check("largest free", a.free.Largest(), x.largest_free));
    if (a.free.histogram().count != x.histogram.count) {
      return fail(fmt::format("{} pool: free histogram differs", name));
    }
  }
  return Status::Ok();
}

}  // namespace fragscope::model
