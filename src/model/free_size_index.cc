#include "model/free_size_index.h"

#include <algorithm>
#include <utility>

namespace fragscope::model {

FreeSizeIndex::FreeSizeIndex() = default;
FreeSizeIndex::~FreeSizeIndex() { FreeSpills(); }
FreeSizeIndex::FreeSizeIndex(FreeSizeIndex&& other) noexcept
    : count_(std::exchange(other.count_, 0)),
      bytes_(std::exchange(other.bytes_, 0)),
      groups_(std::move(other.groups_)),
      group_totals_(std::exchange(other.group_totals_, {})),
      group_mask_(std::exchange(other.group_mask_, 0)),
      class_mask_(std::exchange(other.class_mask_, {})) {}
FreeSizeIndex& FreeSizeIndex::operator=(FreeSizeIndex&& other) noexcept {
  if (this != &other) {
    FreeSpills();
    count_ = std::exchange(other.count_, 0);
    bytes_ = std::exchange(other.bytes_, 0);
    groups_ = std::move(other.groups_);
    group_totals_ = std::exchange(other.group_totals_, {});
    group_mask_ = std::exchange(other.group_mask_, 0);
    class_mask_ = std::exchange(other.class_mask_, {});
  }
  return *this;
}

void FreeSizeIndex::FreeSpills() {
  for (std::unique_ptr<Slot[]>& group : groups_) {
    if (!group) continue;
    for (int i = 0; i < kSubClasses; ++i) delete std::exchange(group[i].spill, nullptr);
  }
}

void FreeSizeIndex::SpillAdd(Spill& spill, std::uint64_t size) {
  if (spill.tree) {
    ++(*spill.tree)[size];
    return;
  }
  auto it = std::lower_bound(spill.flat.begin(), spill.flat.end(), size,
                             [](const SizeCount& sc, std::uint64_t s) { return sc.size < s; });
  if (it != spill.flat.end() && it->size == size) {
    ++it->count;
    return;
  }
  if (spill.flat.size() < kMaxFlatSizes) {
    spill.flat.insert(it, SizeCount{size, 1});
    return;
  }
  spill.tree = std::make_unique<std::map<std::uint64_t, std::uint64_t>>();
  for (const SizeCount& sc : spill.flat)
    spill.tree->emplace_hint(spill.tree->end(), sc.size, sc.count);
  spill.flat.clear();
  spill.flat.shrink_to_fit();
  ++(*spill.tree)[size];
}

void FreeSizeIndex::SpillRemove(Spill& spill, std::uint64_t size) {
  if (spill.tree) {
    auto it = spill.tree->find(size);
    if (--it->second == 0) spill.tree->erase(it);
    return;
  }
  auto it = std::lower_bound(spill.flat.begin(), spill.flat.end(), size,
                             [](const SizeCount& sc, std::uint64_t s) { return sc.size < s; });
  if (--it->count == 0) spill.flat.erase(it);
}

void FreeSizeIndex::AddExact(Slot& slot, std::uint64_t size) {
  if (slot.spill != nullptr) {
    SpillAdd(*slot.spill, size);
    return;
  }
  std::uint32_t i = 0;
  while (i < slot.inline_n && slot.size[i] < size) ++i;
  if (i < slot.inline_n && slot.size[i] == size &&
      slot.size_count[i] < UINT32_MAX) {  // a count that would wrap spills instead
    ++slot.size_count[i];
    return;
  }
  if (slot.inline_n < kInlineSizes && (i == slot.inline_n || slot.size[i] != size)) {
    for (std::uint32_t j = slot.inline_n; j > i; --j) {
      slot.size[j] = slot.size[j - 1];
      slot.size_count[j] = slot.size_count[j - 1];
    }
    slot.size[i] = size;
    slot.size_count[i] = 1;
    ++slot.inline_n;
    return;
  }
  // Out of room: the class's sizes move beside the slot, for as long as it holds any.
  auto spill = std::make_unique<Spill>();
  spill->flat.reserve(kInlineSizes + 1);
  for (std::uint32_t j = 0; j < slot.inline_n; ++j) {
    spill->flat.push_back(SizeCount{slot.size[j], slot.size_count[j]});
  }
  slot.inline_n = 0;
  SpillAdd(*spill, size);
  slot.spill = spill.release();
}

void FreeSizeIndex::RemoveExact(Slot& slot, std::uint64_t size) {
  if (slot.spill != nullptr) {
    SpillRemove(*slot.spill, size);
    return;  // the spill goes when the class empties (Remove)
  }
  std::uint32_t i = 0;
  while (slot.size[i] != size) ++i;  // present: REQUIRES of Remove
  if (--slot.size_count[i] != 0) return;
  for (--slot.inline_n; i < slot.inline_n; ++i) {
    slot.size[i] = slot.size[i + 1];
    slot.size_count[i] = slot.size_count[i + 1];
  }
}

void FreeSizeIndex::Add(std::uint64_t size) {
  ++count_;
  bytes_ += size;
  const int c = SizeClass(size);
  const int g = c / kSubClasses;
  std::unique_ptr<Slot[]>& group = groups_[static_cast<std::size_t>(g)];
  if (!group) group.reset(new Slot[kSubClasses]);  // an octave's slots, made when first used
  Slot& slot = group[c % kSubClasses];
  AddExact(slot, size);
  ++slot.count;
  slot.bytes += size;
  Totals& gt = group_totals_[static_cast<std::size_t>(g)];
  ++gt.count;
  gt.bytes += size;
  class_mask_[static_cast<std::size_t>(g)] |= std::uint64_t{1} << (c % kSubClasses);
  group_mask_ |= std::uint64_t{1} << g;
}

void FreeSizeIndex::Remove(std::uint64_t size) {
  --count_;
  bytes_ -= size;
  const int c = SizeClass(size);
  const int g = c / kSubClasses;
  Slot& slot = groups_[static_cast<std::size_t>(g)][c % kSubClasses];  // Add made the group
  RemoveExact(slot, size);
  --slot.count;
  slot.bytes -= size;
  if (slot.count == 0) {
    delete std::exchange(slot.spill, nullptr);  // back to the inline sizes (none now)
    class_mask_[static_cast<std::size_t>(g)] &= ~(std::uint64_t{1} << (c % kSubClasses));
  }
  Totals& gt = group_totals_[static_cast<std::size_t>(g)];
  --gt.count;
  gt.bytes -= size;
  if (gt.count == 0) group_mask_ &= ~(std::uint64_t{1} << g);
}

std::uint64_t FreeSizeIndex::Largest() const {
  if (group_mask_ == 0) return 0;
  const int g = 63 - std::countl_zero(group_mask_);
  const int i = 63 - std::countl_zero(class_mask_[static_cast<std::size_t>(g)]);
  const Slot& slot = groups_[static_cast<std::size_t>(g)][i];
  if (slot.spill == nullptr) return slot.size[slot.inline_n - 1];
  const Spill& spill = *slot.spill;
  return spill.tree ? spill.tree->rbegin()->first : spill.flat.back().size;
}

FreeSizeIndex::Totals FreeSizeIndex::ExactBelow(int c, std::uint64_t threshold) const {
  Totals t;
  const Slot* group = groups_[static_cast<std::size_t>(c / kSubClasses)].get();
  if (group == nullptr) return t;  // no size of that octave was ever added
  const Slot& slot = group[c % kSubClasses];
  auto add = [&](std::uint64_t size, std::uint64_t n) {
    t.count += n;
    t.bytes += size * n;
  };
  if (slot.spill == nullptr) {
    for (std::uint32_t i = 0; i < slot.inline_n && slot.size[i] < threshold; ++i) {
      add(slot.size[i], slot.size_count[i]);
    }
  } else if (slot.spill->tree) {
    for (auto it = slot.spill->tree->begin();
         it != slot.spill->tree->end() && it->first < threshold; ++it) {
      add(it->first, it->second);
    }
  } else {
    for (const SizeCount& sc : slot.spill->flat) {
      if (sc.size >= threshold) break;
      add(sc.size, sc.count);
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
    const Slot& slot = groups_[static_cast<std::size_t>(g)][std::countr_zero(m)];
    t.count += slot.count;
    t.bytes += slot.bytes;
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

SizeHistogram FreeSizeIndex::histogram() const {
  // Group 0 holds the sizes 0..63, one per class; group g >= 1 is the octave [2^(g+5), 2^(g+6)),
  // which is histogram bucket g + 5.
  SizeHistogram h;
  for (std::uint64_t m = class_mask_[0]; m != 0; m &= m - 1) {
    const int c = std::countr_zero(m);
    const auto b = static_cast<std::size_t>(HistogramBucket(static_cast<std::uint64_t>(c)));
    h.count[b] += groups_[0][c].count;
    h.bytes[b] += groups_[0][c].bytes;
  }
  for (std::uint64_t m = group_mask_ & ~std::uint64_t{1}; m != 0; m &= m - 1) {
    const int g = std::countr_zero(m);
    const auto b = static_cast<std::size_t>(g + kSubClassBits - 1);
    h.count[b] = group_totals_[static_cast<std::size_t>(g)].count;
    h.bytes[b] = group_totals_[static_cast<std::size_t>(g)].bytes;
  }
  return h;
}

}  // namespace fragscope::model
