#include "model/seed_requests.h"

#include <algorithm>

namespace fragscope::model {
namespace {

struct Live {
  std::uint64_t addr;
  std::uint64_t block_size;
  std::uint64_t requested;
  std::int32_t frame;
  bool pending;
};

Event Request(Action action, const Event& like, std::uint64_t id, std::uint64_t size) {
  Event e;
  e.action = action;
  e.device = like.device;
  e.stream = like.stream;
  e.addr = id;
  e.size = size;
  return e;
}

}  // namespace

SeedResult SeedRequests(std::span<const Event> start, const AllocatorRules& rules) {
  SeedResult out;
  std::vector<const Event*> segments;
  std::vector<Live> live;
  for (const Event& e : start) {
    if (e.action == Action::kSegmentAlloc || e.action == Action::kSegmentMap) {
      segments.push_back(&e);
    } else if (e.action == Action::kBlock) {
      live.push_back(Live{e.addr, e.block_size, e.size, e.frame, false});
    } else if (e.action == Action::kFreeRequested && !live.empty() && live.back().addr == e.addr) {
      live.back().pending = true;
    }
  }
  std::sort(segments.begin(), segments.end(),
            [](const Event* a, const Event* b) { return a->addr < b->addr; });
  std::sort(live.begin(), live.end(), [](const Live& a, const Live& b) { return a.addr < b.addr; });

  std::uint64_t next_filler = kSeedIdBase;
  std::vector<Event> fillers;  // freed at the end
  std::vector<Event> pending;  // freed after the fillers
  // A live block's request: its requested size when that rounds to the block, else the block.
  auto live_request = [&](const Live& b) {
    return rules.RoundSize(b.requested) == b.block_size ? b.requested : b.block_size;
  };
  // The simulator keeps one expandable reservation per (stream, pool): a mapped range is built
  // exactly only when it is the only one of its pair (two would become one).
  auto only_range_of_its_kind = [&](const Event* seg) {
    std::size_t n = 0;
    for (const Event* other : segments) {
      n += other->action == Action::kSegmentMap && other->stream == seg->stream &&
           other->pool == seg->pool;
    }
    return n == 1;
  };
  std::size_t next_live = 0;
  for (const Event* seg : segments) {
    const std::uint64_t end = seg->addr + seg->size;
    std::size_t first = next_live;
    while (first < live.size() && live[first].addr < seg->addr) ++first;  // outside any segment
    std::size_t last = first;
    while (last < live.size() && live[last].addr < end) ++last;
    next_live = last;

    // The pieces, and whether the allocator would carve exactly these.
    struct Piece {
      std::uint64_t size;
      const Live* block;         // nullptr: a gap
      std::uint64_t behind = 0;  // a live block's free gap of at most 1 MiB right after it
    };
    std::vector<Piece> pieces;
    std::uint64_t at = seg->addr;
    const bool expandable = seg->action == Action::kSegmentMap;
    bool exact = !expandable || (rules.expandable_segments && only_range_of_its_kind(seg));
    const bool small =
        seg->pool == Pool::kSmall || (seg->pool == Pool::kUnknown && seg->size <= kSmallBuffer);
    for (std::size_t i = first; i < last && exact; ++i) {
      if (live[i].addr < at || live[i].addr + live[i].block_size > end) {
        exact = false;
        break;
      }
      if (live[i].addr > at) pieces.push_back(Piece{live[i].addr - at, nullptr});
      pieces.push_back(Piece{live[i].block_size, &live[i]});
      at = live[i].addr + live[i].block_size;
    }
    if (exact && at < end) pieces.push_back(Piece{end - at, nullptr});
    if (expandable && !small) {
      // Expandable mode splits off any remainder of 512 B or more, so a large range can hold
      // free gaps of 1 MiB or less, which no large-pool request can fill. Such a gap behind a
      // live block is built with it: a placeholder of both is carved, and once the pieces after
      // it exist, freed and the live block requested into it (below).
      std::vector<Piece> merged;
      for (const Piece& p : pieces) {
        if (p.block == nullptr && p.size <= kSmallSize && !merged.empty() &&
            merged.back().block != nullptr) {
          merged.back().behind = p.size;
          continue;
        }
        merged.push_back(p);
      }
      pieces = std::move(merged);
    }
    for (const Piece& p : pieces) {
      if (!exact) break;
      if (p.behind != 0 && (rules.RoundSize(p.size + p.behind) != p.size + p.behind ||
                            p.size + p.behind >= rules.max_split_size)) {
        exact = false;
      }
      if (p.block != nullptr && rules.RoundSize(live_request(*p.block)) != p.size) exact = false;
      if (!small && (p.size <= kSmallSize || rules.RoundSize(p.size) != p.size)) exact = false;
      if (!small && p.size < rules.max_split_size && seg->size >= rules.max_split_size) {
        exact = false;
      }
      if (expandable && p.size >= rules.max_split_size) exact = false;  // no oversize rules
      if (small && p.block == nullptr && p.size % kMinBlockSize != 0) exact = false;
    }
    // A mapped range grows page by page as its pieces are requested; a cudaMalloc'd segment
    // must be the size its first request makes.
    if (!expandable && small && seg->size != kSmallBuffer) exact = false;
    if (!expandable && !small &&
        AllocatorRules::SegmentSize(rules.RoundSize(seg->size)) != seg->size) {
      exact = false;
    }

    auto request_live = [&](const Live& block) {
      out.requests.push_back(Request(Action::kAlloc, *seg, block.addr, live_request(block)));
      out.requests.back().frame = block.frame;
      if (block.pending) pending.push_back(Request(Action::kFreeRequested, *seg, block.addr, 0));
    };
    if (!exact) {
      ++out.fallback_segments;
      for (std::size_t i = first; i < last; ++i) request_live(live[i]);
      continue;
    }
    ++out.exact_segments;
    if (!small && !expandable) {
      const std::uint64_t whole = next_filler++;
      out.requests.push_back(Request(Action::kAlloc, *seg, whole, seg->size));
      out.requests.push_back(Request(Action::kFreeRequested, *seg, whole, 0));
    }
    std::vector<std::pair<std::uint64_t, const Live*>> placeholders;  // in address order
    for (const Piece& p : pieces) {
      if (p.block != nullptr && p.behind != 0) {
        const std::uint64_t id = next_filler++;
        out.requests.push_back(Request(Action::kAlloc, *seg, id, p.size + p.behind));
        placeholders.emplace_back(id, p.block);
        continue;
      }
      if (p.block != nullptr) {
        request_live(*p.block);
        continue;
      }
      // A gap: one filler, or chunks of at most 1 MiB in the small pool.
      std::uint64_t left = p.size;
      while (left > 0) {
        const std::uint64_t chunk = small ? std::min(left, kSmallSize) : left;
        const std::uint64_t id = next_filler++;
        out.requests.push_back(Request(Action::kAlloc, *seg, id, chunk));
        fillers.push_back(Request(Action::kFreeRequested, *seg, id, 0));
        left -= chunk;
      }
    }
    // Highest first, so that each freed placeholder lies between allocated blocks: the live
    // block is carved from its front (the smallest free block that fits) and the gap stays.
    for (auto it = placeholders.rbegin(); it != placeholders.rend(); ++it) {
      out.requests.push_back(Request(Action::kFreeRequested, *seg, it->first, 0));
      request_live(*it->second);
    }
  }
  // Live blocks outside every segment (an inconsistent start state): requested plainly.
  for (std::size_t i = 0; i < live.size(); ++i) {
    bool inside = false;
    for (const Event* seg : segments) {
      inside |= live[i].addr >= seg->addr && live[i].addr < seg->addr + seg->size;
    }
    if (inside) continue;
    Event e;
    e.action = Action::kAlloc;
    e.device = start.empty() ? 0 : start.front().device;
    e.addr = live[i].addr;
    e.size = live_request(live[i]);
    out.requests.push_back(e);
  }
  out.requests.insert(out.requests.end(), fillers.begin(), fillers.end());
  out.requests.insert(out.requests.end(), pending.begin(), pending.end());
  return out;
}

}  // namespace fragscope::model
