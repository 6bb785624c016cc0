// SegregatedFreeSet: an ordered set of (size, address) keys with a value each, in exactly the
// order of one B+tree keyed by (size, address), but split by size into exact classes so that
// the best-fit query of CachingAllocatorSim (the first key not less than (size, 0)) costs a
// bitmap scan and a search among a few keys instead of a descent through one large tree.
//
// Class c holds the keys with size in (c * 512, (c + 1) * 512] for c < classes; every rounded
// allocator size is a multiple of 512, so a class holds one size and its keys are ordered by
// address. Larger keys go to one overflow tree. Each class is a small BTreeMap created on first
// use, ordered by the full key, so even an unexpected size that is not a multiple of 512 keeps
// the total order. A two-level bitmap (one bit per non-empty class, one summary bit per word)
// finds the next or previous non-empty class in O(classes / 4096) word reads.
//
// Iterators walk the whole order in both directions (ascending classes, then the overflow
// tree) and are invalidated by any insert or erase. Thread safety: none.
#ifndef FRAGSCOPE_MODEL_SEGREGATED_FREE_SET_H_
#define FRAGSCOPE_MODEL_SEGREGATED_FREE_SET_H_

#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "model/btree_map.h"

namespace fragscope::model::internal {

struct SizeAddrKey {
  std::uint64_t size;
  std::uint64_t addr;
};
struct SizeAddrLess {
  // One 128-bit comparison (cmp + sbb): binary searches stay branch-free.
  __extension__ using Wide = unsigned __int128;
  bool operator()(const SizeAddrKey& a, const SizeAddrKey& b) const {
    return ((Wide{a.size} << 64) | a.addr) < ((Wide{b.size} << 64) | b.addr);
  }
};

template <typename Value>
class SegregatedFreeSet {
 public:
  using Key = SizeAddrKey;
  static constexpr std::uint64_t kGranule = 512;

 private:
  using ClassTree = BTreeMap<Key, Value, SizeAddrLess, 16, 16>;
  using OverflowTree = BTreeMap<Key, Value, SizeAddrLess>;
  using ClassIt = typename ClassTree::iterator;
  using OverflowIt = typename OverflowTree::iterator;

 public:
  class iterator {
   public:
    iterator() = default;
    const Key& key() const { return InOverflow() ? over_.key() : cls_it_.key(); }
    const Value& value() const { return InOverflow() ? over_.value() : cls_it_.value(); }
    iterator& operator++() {
      if (InOverflow()) {
        ++over_;
        return *this;
      }
      ++cls_it_;
      if (cls_it_ == set_->classes_[cls_]->end()) *this = set_->FirstFrom(cls_ + 1);
      return *this;
    }
    // REQUIRES: *this != begin().
    iterator& operator--() {
      if (InOverflow() && over_ != set_->overflow_.begin()) {
        --over_;
        return *this;
      }
      if (!InOverflow() && cls_it_ != set_->classes_[cls_]->begin()) {
        --cls_it_;
        return *this;
      }
      const std::int64_t c = set_->PrevClass(static_cast<std::int64_t>(cls_) - 1);
      cls_ = static_cast<std::uint32_t>(c);
      cls_it_ = set_->classes_[cls_]->end();
      --cls_it_;
      return *this;
    }
    bool operator==(const iterator& o) const {
      if (cls_ != o.cls_) return false;
      return InOverflow() ? over_ == o.over_ : cls_it_ == o.cls_it_;
    }
    bool operator!=(const iterator& o) const { return !(*this == o); }

   private:
    friend class SegregatedFreeSet;
    bool InOverflow() const { return cls_ == set_->num_classes_; }
    const SegregatedFreeSet* set_ = nullptr;
    std::uint32_t cls_ = 0;  // == num_classes_: in the overflow tree
    ClassIt cls_it_;
    OverflowIt over_;
  };

  /// Exact classes for sizes up to `classes` * 512 bytes; `classes` is a multiple of 64.
  explicit SegregatedFreeSet(std::uint32_t classes)
      : num_classes_(classes),
        classes_(classes),
        bits_(classes / 64),
        summary_((classes / 64 + 63) / 64) {}
  SegregatedFreeSet(const SegregatedFreeSet&) = delete;
  SegregatedFreeSet& operator=(const SegregatedFreeSet&) = delete;

  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  iterator begin() const { return FirstFrom(0); }
  iterator end() const {
    iterator it;
    it.set_ = this;
    it.cls_ = num_classes_;
    it.over_ = overflow_.end();
    return it;
  }

  /// The first key not less than `key`.
  iterator lower_bound(const Key& key) const {
    const std::uint32_t c = ClassOf(key.size);
    if (c == num_classes_) return InOverflowAt(overflow_.lower_bound(key));
    if (HasClass(c)) {
      ClassIt it = classes_[c]->lower_bound(key);
      if (it != classes_[c]->end()) return InClass(c, it);
    }
    return FirstFrom(c + 1);
  }

  /// REQUIRES: no equivalent key is present.
  void insert(const Key& key, const Value& value) {
    ++size_;
    const std::uint32_t c = ClassOf(key.size);
    if (c == num_classes_) {
      overflow_.insert(key, value);
      return;
    }
    if (classes_[c] == nullptr) classes_[c] = std::make_unique<ClassTree>();
    classes_[c]->insert(key, value);
    SetBit(c);
  }

  /// Erases `key` if present; returns whether it was.
  bool erase(const Key& key) {
    const std::uint32_t c = ClassOf(key.size);
    if (c == num_classes_) {
      if (!overflow_.erase(key)) return false;
      --size_;
      return true;
    }
    if (classes_[c] == nullptr || !classes_[c]->erase(key)) return false;
    --size_;
    if (classes_[c]->empty()) ClearBit(c);
    return true;
  }

  /// REQUIRES: `it` is dereferenceable.
  void erase(iterator it) {
    --size_;
    if (it.InOverflow()) {
      overflow_.erase(it.over_);
      return;
    }
    classes_[it.cls_]->erase(it.cls_it_);
    if (classes_[it.cls_]->empty()) ClearBit(it.cls_);
  }

 private:
  std::uint32_t ClassOf(std::uint64_t size) const {
    const std::uint64_t c = size == 0 ? 0 : (size - 1) / kGranule;
    return c < num_classes_ ? static_cast<std::uint32_t>(c) : num_classes_;
  }
  bool HasClass(std::uint32_t c) const { return (bits_[c / 64] >> (c % 64)) & 1; }
  void SetBit(std::uint32_t c) {
    bits_[c / 64] |= std::uint64_t{1} << (c % 64);
    summary_[c / 4096] |= std::uint64_t{1} << (c / 64 % 64);
  }
  void ClearBit(std::uint32_t c) {
    bits_[c / 64] &= ~(std::uint64_t{1} << (c % 64));
    if (bits_[c / 64] == 0) summary_[c / 4096] &= ~(std::uint64_t{1} << (c / 64 % 64));
  }

  // The first non-empty class >= c, or num_classes_.
  std::uint32_t NextClass(std::uint32_t c) const {
    if (c >= num_classes_) return num_classes_;
    std::size_t w = c / 64;
    const std::uint64_t here = bits_[w] & (~std::uint64_t{0} << (c % 64));
    if (here != 0) return static_cast<std::uint32_t>(w * 64 + std::countr_zero(here));
    ++w;  // the first non-empty word >= w, through the summary
    std::size_t s = w / 64;
    if (s >= summary_.size()) return num_classes_;
    std::uint64_t sw = w % 64 == 0 ? summary_[s] : summary_[s] & (~std::uint64_t{0} << (w % 64));
    while (sw == 0) {
      if (++s == summary_.size()) return num_classes_;
      sw = summary_[s];
    }
    w = s * 64 + static_cast<std::size_t>(std::countr_zero(sw));
    return static_cast<std::uint32_t>(w * 64 + std::countr_zero(bits_[w]));
  }
  // The last non-empty class <= c, or -1.
  std::int64_t PrevClass(std::int64_t c) const {
    if (c < 0) return -1;
    std::int64_t w = c / 64;
    const std::uint64_t here = bits_[w] & (~std::uint64_t{0} >> (63 - c % 64));
    if (here != 0) return w * 64 + 63 - std::countl_zero(here);
    --w;
    if (w < 0) return -1;
    std::int64_t s = w / 64;
    std::uint64_t sw = summary_[s] & (~std::uint64_t{0} >> (63 - w % 64));
    while (sw == 0) {
      if (--s < 0) return -1;
      sw = summary_[s];
    }
    w = s * 64 + 63 - std::countl_zero(sw);
    return w * 64 + 63 - std::countl_zero(bits_[w]);
  }

  iterator InClass(std::uint32_t c, ClassIt it) const {
    iterator out;
    out.set_ = this;
    out.cls_ = c;
    out.cls_it_ = it;
    return out;
  }
  iterator InOverflowAt(OverflowIt it) const {
    iterator out;
    out.set_ = this;
    out.cls_ = num_classes_;
    out.over_ = it;
    return out;
  }
  // The first key of the first non-empty class >= c, else of the overflow tree.
  iterator FirstFrom(std::uint32_t c) const {
    const std::uint32_t n = NextClass(c);
    if (n == num_classes_) return InOverflowAt(overflow_.begin());
    return InClass(n, classes_[n]->begin());
  }

  std::uint32_t num_classes_;
  std::size_t size_ = 0;
  std::vector<std::unique_ptr<ClassTree>> classes_;
  std::vector<std::uint64_t> bits_;
  std::vector<std::uint64_t> summary_;
  OverflowTree overflow_;
};

}  // namespace fragscope::model::internal

#endif  // FRAGSCOPE_MODEL_SEGREGATED_FREE_SET_H_
