#include "model/free_size_index.h"

#include <algorithm>

namespace fragscope::model {

FreeSizeIndex::FreeSizeIndex() : sizes_(kNumSizeClasses), class_totals_(kNumSizeClasses) {}
FreeSizeIndex::~FreeSizeIndex() = default;
FreeSizeIndex::FreeSizeIndex(FreeSizeIndex&&) noexcept = default;
FreeSizeIndex& FreeSizeIndex::operator=(FreeSizeIndex&&) noexcept = default;

void FreeSizeIndex::AddExact(ClassSizes& sizes, std::uint64_t size) {
  if (sizes.tree) {
    ++(*sizes.tree)[size];
    return;
  }
  auto it = std::lower_bound(sizes.flat.begin(), sizes.flat.end(), size,
                             [](const SizeCount& sc, std::uint64_t s) { return sc.size < s; });
  if (it != sizes.flat.end() && it->size == size) {
    ++it->count;
    return;
  }
  if (sizes.flat.size() < kMaxFlatSizes) {
    sizes.flat.insert(it, SizeCount{size, 1});
    return;
  }
  sizes.tree = std::make_unique<std::map<std::uint64_t, std::uint64_t>>();
  for (const SizeCount& sc : sizes.flat)
    sizes.tree->emplace_hint(sizes.tree->end(), sc.size, sc.count);
  sizes.flat.clear();
  sizes.flat.shrink_to_fit();
  ++(*sizes.tree)[size];
}

void FreeSizeIndex::RemoveExact(ClassSizes& sizes, std::uint64_t size) {
  if (sizes.tree) {
    auto it = sizes.tree->find(size);
    if (--it->second == 0) sizes.tree->erase(it);
    if (sizes.tree->empty()) sizes.tree.reset();
    return;
  }
  auto it = std::lower_bound(sizes.flat.begin(), sizes.flat.end(), size,
                             [](const SizeCount& sc, std::uint64_t s) { return sc.size < s; });
  if (--it->count == 0) sizes.flat.erase(it);
}

void FreeSizeIndex::Add(std::uint64_t size) {
  ++count_;
  bytes_ += size;
  const int c = SizeClass(size);
  const int g = c / kSubClasses;
  AddExact(sizes_[static_cast<std::size_t>(c)], size);
  Totals& ct = class_totals_[static_cast<std::size_t>(c)];
  ++ct.count;
  ct.bytes += size;
  Totals& gt = group_totals_[static_cast<std::size_t>(g)];
  ++gt.count;
  gt.bytes += size;
  class_mask_[static_cast<std::size_t>(g)] |= std::uint64_t{1} << (c % kSubClasses);
  group_mask_ |= std::uint64_t{1} << g;
  const auto b = static_cast<std::size_t>(HistogramBucket(size));
  ++histogram_.count[b];
  histogram_.bytes[b] += size;
}

void FreeSizeIndex::Remove(std::uint64_t size) {
  --count_;
  bytes_ -= size;
  const int c = SizeClass(size);
  const int g = c / kSubClasses;
  RemoveExact(sizes_[static_cast<std::size_t>(c)], size);
  Totals& ct = class_totals_[static_cast<std::size_t>(c)];
  --ct.count;
  ct.bytes -= size;
  if (ct.count == 0)
    class_mask_[static_cast<std::size_t>(g)] &= ~(std::uint64_t{1} << (c % kSubClasses));
  Totals& gt = group_totals_[static_cast<std::size_t>(g)];
  --gt.count;
  gt.bytes -= size;
  if (gt.count == 0) group_mask_ &= ~(std::uint64_t{1} << g);
  const auto b = static_cast<std::size_t>(HistogramBucket(size));
  --histogram_.count[b];
  histogram_.bytes[b] -= size;
}

std::uint64_t FreeSizeIndex::Largest() const {
  if (group_mask_ == 0) return 0;
  const int g = 63 - std::countl_zero(group_mask_);
  const int i = 63 - std::countl_zero(class_mask_[static_cast<std::size_t>(g)]);
  const ClassSizes& sizes = sizes_[static_cast<std::size_t>(g * kSubClasses + i)];
  return sizes.tree ? sizes.tree->rbegin()->first : sizes.flat.back().size;
}

FreeSizeIndex::Totals FreeSizeIndex::ExactBelow(int c, std::uint64_t threshold) const {
  Totals t;
  const ClassSizes& sizes = sizes_[static_cast<std::size_t>(c)];
  if (sizes.tree) {
    for (auto it = sizes.tree->begin(); it != sizes.tree->end() && it->first < threshold; ++it) {
      t.count += it->second;
      t.bytes += it->first * it->second;
    }
  } else {
    for (const SizeCount& sc : sizes.flat) {
      if (sc.size >= threshold) break;
      t.count += sc.count;
      t.bytes += sc.size * sc.count;
    }
  }
  return t;
}

FreeSizeIndex::Totals FreeSizeIndex::Below(std::uint64_t threshold) const {
  Totals t;
  if (threshold == 0) return t;
  const int c = SizeClass(threshold);
  const int g = c / kSubClasses;
  // Whole groups below g, whole classes of group g below c, then the exact sizes of class c.
  for (std::uint64_t m = group_mask_ & ((std::uint64_t{1} << g) - 1); m != 0; m &= m - 1) {
    const Totals& gt = group_totals_[static_cast<std::size_t>(std::countr_zero(m))];
    t.count += gt.count;
    t.bytes += gt.bytes;
  }
  const int i = c % kSubClasses;
  for (std::uint64_t m = class_mask_[static_cast<std::size_t>(g)] & ((std::uint64_t{1} << i) - 1);
       m != 0; m &= m - 1) {
    const Totals& ct =
        class_totals_[static_cast<std::size_t>(g * kSubClasses + std::countr_zero(m))];
    t.count += ct.count;
    t.bytes += ct.bytes;
  }
  const Totals exact = ExactBelow(c, threshold);
  t.count += exact.count;
  t.bytes += exact.bytes;
  return t;
}

std::uint64_t FreeSizeIndex::BytesBelow(std::uint64_t threshold) const {
  return Below(threshold).bytes;
}

std::uint64_t FreeSizeIndex::CountBelow(std::uint64_t threshold) const {
  return Below(threshold).count;
}

}  // namespace fragscope::model
