#include "analysis/diagnosis.h"

#include <algorithm>
#include <unordered_map>

#include <fmt/format.h>

namespace fragscope::analysis {

std::string_view OomCauseName(OomCause cause) {
  switch (cause) {
    case OomCause::kFragmentation:
      return "fragmentation";
    case OomCause::kShortage:
      return "shortage";
    case OomCause::kAddressSpace:
      return "address_space_limit";
  }
  return "shortage";
}

OomDiagnosis DiagnoseOom(const model::DeviceMemory& memory, const model::AllocatorRules& rules,
                         const Event& oom) {
  OomDiagnosis d;
  d.time_us = oom.time_us;
  d.requested = oom.size;
  d.rounded = rules.RoundSize(std::max<std::uint64_t>(oom.size, 1));
  d.pool = model::AllocatorRules::PoolFor(d.rounded);
  d.needed = model::AllocatorRules::SegmentSize(d.rounded);
  d.reserved = memory.reserved();
  d.allocated = memory.allocated();
  const std::uint64_t active = memory.pool(Pool::kSmall).active + memory.pool(Pool::kLarge).active;
  d.free_unusable = d.reserved > active ? d.reserved - active : 0;
  d.largest_free_block = memory.pool(d.pool).free.Largest();
  d.device_free = oom.device_free;
  // Had every free byte been one block, would the request have fit? Then the failure is the
  // layout's, not the amount's.
  const std::uint64_t free_total = d.free_unusable + oom.device_free.value_or(0);
  if (free_total >= d.rounded) {
    d.cause = OomCause::kFragmentation;
    d.margin = free_total - d.rounded;
  } else {
    d.cause = OomCause::kShortage;
    d.margin = d.rounded - free_total;
  }
  return d;
}

std::vector<SiteStranding> AttributeStranding(const model::DeviceMemory& memory, std::size_t top) {
  struct Acc {
    double stranded = 0;
    std::uint64_t live = 0;
    std::uint64_t blocks = 0;
    std::uint64_t segments = 0;
    const model::Segment* last_segment = nullptr;
  };
  std::unordered_map<std::int32_t, Acc> by_site;
  memory.ForEachSegment([&](const model::Segment& s) {
    if (s.live_blocks == 0) return;
    std::uint64_t free_bytes = 0;
    std::uint64_t live_bytes = 0;
    memory.ForEachBlock(s, [&](const model::Block& b) {
      if (b.state == model::BlockState::kFree) {
        free_bytes += b.size;
      } else {
        live_bytes += b.size;
      }
    });
    if (free_bytes == 0 || live_bytes == 0) return;
    memory.ForEachBlock(s, [&](const model::Block& b) {
      if (b.state == model::BlockState::kFree) return;
      Acc& a = by_site[b.frame];
      a.stranded += static_cast<double>(free_bytes) * static_cast<double>(b.size) /
                    static_cast<double>(live_bytes);
      a.live += b.size;
      ++a.blocks;
      if (a.last_segment != &s) {
        ++a.segments;
        a.last_segment = &s;
      }
    });
  });
  std::vector<SiteStranding> out;
  out.reserve(by_site.size());
  for (const auto& [frame, a] : by_site) {
    SiteStranding site;
    site.frame = frame;
    site.stranded_bytes = static_cast<std::uint64_t>(a.stranded + 0.5);
    site.live_bytes = a.live;
    site.blocks = a.blocks;
    site.segments = a.segments;
    out.push_back(site);
  }
  std::sort(out.begin(), out.end(), [](const SiteStranding& a, const SiteStranding& b) {
    if (a.stranded_bytes != b.stranded_bytes) return a.stranded_bytes > b.stranded_bytes;
    return a.frame < b.frame;
  });
  if (out.size() > top) out.resize(top);
  return out;
}

void NameSite(const std::vector<Frame>& frames, SiteStranding* site) {
  if (site->frame < 0 || static_cast<std::size_t>(site->frame) >= frames.size()) {
    site->site = "(no stack recorded)";
    site->site_has_file = false;
    return;
  }
  const Frame& f = frames[static_cast<std::size_t>(site->frame)];
  site->site_has_file = !f.filename.empty();
  site->site =
      site->site_has_file ? fmt::format("{}:{} in {}", f.filename, f.line, f.name) : f.name;
}

}  // namespace fragscope::analysis
