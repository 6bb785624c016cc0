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

RequestWindow::RequestWindow(std::size_t capacity)
    : capacity_(std::max<std::size_t>(capacity, 1)) {}

void RequestWindow::Add(std::uint64_t size) {
  if (ring_.size() < capacity_) {  // filling: the ring grows with what it holds
    ring_.push_back(size);
    ++count_;
  } else {
    classes_.Add(model::SizeClass(ring_[next_]), -1);
    ring_[next_] = size;
    if (++next_ == ring_.size()) next_ = 0;
  }
  classes_.Add(model::SizeClass(size), 1);
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
  if (size == kEmpty) {  // it marks free slots, so it cannot be counted
    overflowed_ = true;
    return;
  }
  if (table_.empty()) table_.assign(64, SizeCount{kEmpty, 0});
  for (std::size_t i = Slot(size);; i = (i + 1) & (table_.size() - 1)) {
    SizeCount& slot = table_[i];
    if (slot.size == size) {
      ++slot.count;
      return;
    }
    if (slot.size != kEmpty) continue;
    if (distinct_ >= kMaxDistinctSizes) {
      overflowed_ = true;  // counts of the tracked sizes stay, but no longer cover every request
      return;
    }
    slot = SizeCount{size, 1};
    if (++distinct_ * 2 > table_.size()) Grow();
    return;
  }
}

void SizeProfile::Grow() {
  std::vector<SizeCount> old(table_.size() * 2, SizeCount{kEmpty, 0});
  old.swap(table_);
  for (const SizeCount& sc : old) {
    if (sc.size == kEmpty) continue;
    std::size_t i = Slot(sc.size);
    while (table_[i].size != kEmpty) i = (i + 1) & (table_.size() - 1);
    table_[i] = sc;
  }
}

std::vector<SizeCount> SizeProfile::Counted() const {
  std::vector<SizeCount> all;
  all.reserve(distinct_);
  for (const SizeCount& sc : table_) {
    if (sc.size != kEmpty) all.push_back(sc);
  }
  return all;
}

std::uint64_t SizeProfile::Quantile(double q) const {
  if (count_ == 0) return 0;
  const std::uint64_t rank = QuantileRank(q, count_);
  if (overflowed_) return model::ClassFloor(classes_.FindByRank(rank));
  std::vector<SizeCount> sorted = Counted();
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
  std::vector<SizeCount> all = Counted();
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
