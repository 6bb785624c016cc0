#include "analysis/fidelity.h"

#include <algorithm>
#include <map>
#include <string>

namespace fragscope::analysis {
namespace {

double Ratio(std::uint64_t matched, std::uint64_t a, std::uint64_t b) {
  const std::uint64_t denominator = std::max(a, b);
  return denominator == 0 ? 1.0 : static_cast<double>(matched) / static_cast<double>(denominator);
}

// Size, then each block's size and state: equal keys = the same layout at any address.
std::string LayoutKey(const model::SnapshotSegment& s) {
  std::string key = std::to_string(s.total_size);
  for (const model::SnapshotBlock& b : s.blocks) {
    key += ';';
    key += std::to_string(b.size);
    key += b.state == "inactive" ? 'f' : (b.state == "active_allocated" ? 'a' : 'p');
  }
  return key;
}

template <typename Key>
std::uint64_t MultisetOverlap(const std::vector<model::SnapshotSegment>& a,
                              const std::vector<model::SnapshotSegment>& b, Key key) {
  std::map<decltype(key(a.front())), std::uint64_t> count;
  for (const auto& s : a) ++count[key(s)];
  std::uint64_t matched = 0;
  for (const auto& s : b) {
    auto it = count.find(key(s));
    if (it != count.end() && it->second > 0) {
      --it->second;
      ++matched;
    }
  }
  return matched;
}

}  // namespace

double DeviceFidelity::segment_agreement() const {
  return Ratio(matched_segments, real_segments, sim_segments);
}
double DeviceFidelity::size_agreement() const {
  return Ratio(matched_by_size, real_segments, sim_segments);
}

DeviceFidelity CompareSegments(const std::vector<model::SnapshotSegment>& real,
                               const std::vector<model::SnapshotSegment>& sim) {
  DeviceFidelity f;
  f.real_segments = real.size();
  f.sim_segments = sim.size();
  for (const auto& s : real) {
    f.real_reserved += s.total_size;
    f.real_allocated += s.allocated_size;
  }
  for (const auto& s : sim) {
    f.sim_reserved += s.total_size;
    f.sim_allocated += s.allocated_size;
  }
  if (!real.empty() && !sim.empty()) {
    f.matched_segments = MultisetOverlap(real, sim, LayoutKey);
    f.matched_by_size =
        MultisetOverlap(real, sim, [](const model::SnapshotSegment& s) { return s.total_size; });
  }
  return f;
}

}  // namespace fragscope::analysis
