#include "analysis/size_profile.h"

#include <algorithm>
#include <cmath>

namespace fragscope::analysis {

namespace {
// The 0-based rank of the q-quantile among n items: the smallest r with (r + 1) / n >= q.
std::uint64_t QuantileRank(double q, std::uint64_t n) {
  q = std::clamp(q, 0.0, 1.0);
  const double r = std::ceil(q * static_cast<double>(n)) - 1.0;
  return r <= 0 ? 0 : std::min<std::uint64_t>(static_cast<std::uint64_t>(r), n - 1);
}
}  // namespace

RequestWindow::RequestWindow(std::size_t capacity) : ring_(std::max<std::size_t>(capacity, 1)) {}

void RequestWindow::Add(std::uint64_t size) {
  if (count_ == ring_.size()) {
    classes_.Add(model::SizeClass(ring_[next_]), -1);
  } else {
    ++count_;
  }
  ring_[next_] = size;
  classes_.Add(model::SizeClass(size), 1);
  if (++next_ == ring_.size()) next_ = 0;
}

std::uint64_t RequestWindow::Quantile(double q) const {
  if (count_ == 0) return 0;
  return model::ClassFloor(classes_.FindByRank(QuantileRank(q, count_)));
}

void SizeProfile::Add(std::uint64_t size) {
  ++count_;
  bytes_ += size;
  min_ = std::min(min_, size);
  max_ = std::max(max_, size);
  classes_.Add(model::SizeClass(size), 1);
  const auto b = static_cast<std::size_t>(model::HistogramBucket(size));
  ++histogram_.count[b];
  histogram_.bytes[b] += size;
  if (overflowed_) return;
  const std::uint32_t slot = size_index_.Find(size);
  if (slot != model::AddressIndex::kNotFound) {
    ++sizes_[slot].count;
  } else if (sizes_.size() < kMaxDistinctSizes && size != ~std::uint64_t{0}) {
    size_index_.Insert(size, static_cast<std::uint32_t>(sizes_.size()));
    sizes_.push_back({size, 1});
  } else {
    overflowed_ = true;  // counts of the tracked sizes stay, but no longer cover every request
  }
}

std::uint64_t SizeProfile::Quantile(double q) const {
  if (count_ == 0) return 0;
  const std::uint64_t rank = QuantileRank(q, count_);
  if (overflowed_) return model::ClassFloor(classes_.FindByRank(rank));
  std::vector<SizeCount> sorted = sizes_;
  std::sort(sorted.begin(), sorted.end(),
            [](const SizeCount& a, const SizeCount& b) { return a.size < b.size; });
  std::uint64_t seen = 0;
  for (const SizeCount& sc : sorted) {
    seen += sc.count;
    if (seen > rank) return sc.size;
  }
  return max_;
}

std::vector<SizeCount> SizeProfile::TopSizes(std::size_t n) const {
  std::vector<SizeCount> all = sizes_;
  auto better = [](const SizeCount& a, const SizeCount& b) {
    return a.count != b.count ? a.count > b.count : a.size > b.size;
  };
  if (all.size() > n) {
    std::partial_sort(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n), all.end(), better);
    all.resize(n);
  } else {
    std::sort(all.begin(), all.end(), better);
  }
  return all;
}

}  // namespace fragscope::analysis
