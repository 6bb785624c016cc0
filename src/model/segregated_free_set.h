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

#include <algorithm>
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

  // One class: up to kInline addresses in ascending order, in one cache line; a class that
  // outgrows it moves to a tree of its own (then addr[0] indexes spill_trees_).
  static constexpr int kInline = 5;
  struct alignas(64) Bucket {
    std::uint64_t addr[kInline];
    Value value[kInline];
    std::uint8_t n;
    bool spilled;
    std::size_t spill() const { return static_cast<std::size_t>(addr[0]); }
  };
  static_assert(sizeof(Value) > 4 || sizeof(Bucket) == 64);
  static constexpr std::uint32_t kChunk = 64;  // buckets are allocated 64 classes at a time

 public:
  class iterator {
   public:
    iterator() = default;
    const Key& key() const {
      if (InOverflow()) return over_.key();
      if (spilled_) return tree_it_.key();
      key_ = Key{set_->ClassSize(cls_), set_->BucketOf(cls_).addr[idx_]};
      return key_;
    }
    const Value& value() const {
      if (InOverflow()) return over_.value();
      if (spilled_) return tree_it_.value();
      return set_->BucketOf(cls_).value[idx_];
    }
    iterator& operator++() {
      if (InOverflow()) {
        ++over_;
        return *this;
      }
      if (spilled_) {
        ++tree_it_;
        if (tree_it_ == set_->TreeOf(cls_).end()) *this = set_->FirstFrom(cls_ + 1);
      } else if (++idx_ == set_->BucketOf(cls_).n) {
        *this = set_->FirstFrom(cls_ + 1);
      }
      return *this;
    }
    // REQUIRES: *this != begin().
    iterator& operator--() {
      if (InOverflow()) {
        if (over_ != set_->overflow_.begin()) {
          --over_;
          return *this;
        }
      } else if (spilled_) {
        if (tree_it_ != set_->TreeOf(cls_).begin()) {
          --tree_it_;
          return *this;
        }
      } else if (idx_ > 0) {
        --idx_;
        return *this;
      }
      *this = set_->LastOf(static_cast<std::uint32_t>(set_->PrevClass(std::int64_t{cls_} - 1)));
      return *this;
    }
    bool operator==(const iterator& o) const {
      if (cls_ != o.cls_) return false;
      if (InOverflow()) return over_ == o.over_;
      return spilled_ ? tree_it_ == o.tree_it_ : idx_ == o.idx_;
    }
    bool operator!=(const iterator& o) const { return !(*this == o); }

   private:
    friend class SegregatedFreeSet;
    bool InOverflow() const { return cls_ == set_->num_classes_; }
    const SegregatedFreeSet* set_ = nullptr;
    std::uint32_t cls_ = 0;  // == num_classes_: in the overflow tree
    int idx_ = 0;            // in the bucket
    bool spilled_ = false;   // in the class's tree
    ClassIt tree_it_;
    OverflowIt over_;
    mutable Key key_{};
  };

  /// Exact classes for sizes up to `classes` * 512 bytes; `classes` is a multiple of 64.
  explicit SegregatedFreeSet(std::uint32_t classes)
      : num_classes_(classes),
        chunks_(classes / kChunk),
        bits_(classes / 64),
        summary_((classes / 64 + 63) / 64) {}
  SegregatedFreeSet(const SegregatedFreeSet&) = delete;
  SegregatedFreeSet& operator=(const SegregatedFreeSet&) = delete;

  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  iterator begin() const { return FirstFrom(0); }
  iterator end() const { return InOverflowAt(overflow_.end()); }

  /// The first key not less than `key`.
  iterator lower_bound(const Key& key) const {
    const std::uint32_t c = ClassOf(key.size);
    if (c == num_classes_) return InOverflowAt(overflow_.lower_bound(key));
    if (HasClass(c)) {
      const Bucket& b = BucketOf(c);
      // Every key of the class has size ClassSize(c) >= key.size.
      const std::uint64_t addr = key.size == ClassSize(c) ? key.addr : 0;
      if (b.spilled) {
        const ClassTree& tree = *spill_trees_[b.spill()];
        ClassIt it = tree.lower_bound(Key{ClassSize(c), addr});
        if (it != tree.end()) return InTree(c, it);
      } else {
        int i = 0;
        while (i < b.n && b.addr[i] < addr) ++i;
        if (i < b.n) return InBucket(c, i);
      }
    }
    return FirstFrom(c + 1);
  }

  /// REQUIRES: no equivalent key is present.
  void insert(const Key& key, const Value& value) {
    ++size_;
    if (!degraded_ && (key.size % kGranule != 0 || key.size == 0) &&
        key.size <= ClassSize(num_classes_ - 1)) {
      Degrade();
    }
    const std::uint32_t c = ClassOf(key.size);
    if (c == num_classes_) {
      overflow_.insert(key, value);
      return;
    }
    Bucket& b = MutableBucket(c);
    if (b.spilled) {
      spill_trees_[b.spill()]->insert(key, value);
    } else if (b.n < kInline) {
      int i = b.n;
      while (i > 0 && b.addr[i - 1] > key.addr) {
        b.addr[i] = b.addr[i - 1];
        b.value[i] = b.value[i - 1];
        --i;
      }
      b.addr[i] = key.addr;
      b.value[i] = value;
      ++b.n;
    } else {
      Spill(c, b);
      spill_trees_[b.spill()]->insert(key, value);
    }
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
    if (!HasClass(c) || key.size != ClassSize(c)) return false;
    Bucket& b = MutableBucket(c);
    if (b.spilled) {
      if (!spill_trees_[b.spill()]->erase(key)) return false;
      --size_;
      if (spill_trees_[b.spill()]->empty()) Unspill(c, b);
      return true;
    }
    for (int i = 0; i < b.n; ++i) {
      if (b.addr[i] == key.addr) {
        EraseAt(c, b, i);
        --size_;
        return true;
      }
    }
    return false;
  }

  /// REQUIRES: `it` is dereferenceable.
  void erase(iterator it) {
    --size_;
    if (it.InOverflow()) {
      overflow_.erase(it.over_);
      return;
    }
    Bucket& b = MutableBucket(it.cls_);
    if (it.spilled_) {
      spill_trees_[b.spill()]->erase(it.tree_it_);
      if (spill_trees_[b.spill()]->empty()) Unspill(it.cls_, b);
      return;
    }
    EraseAt(it.cls_, b, it.idx_);
  }

 private:
  // Keys of class c have this size (unless degraded, when every key is in the overflow tree).
  static std::uint64_t ClassSize(std::uint32_t c) { return (std::uint64_t{c} + 1) * kGranule; }
  std::uint32_t ClassOf(std::uint64_t size) const {
    if (degraded_) return num_classes_;
    const std::uint64_t c = size == 0 ? 0 : (size - 1) / kGranule;
    return c < num_classes_ ? static_cast<std::uint32_t>(c) : num_classes_;
  }
  const Bucket& BucketOf(std::uint32_t c) const { return chunks_[c / kChunk][c % kChunk]; }
  Bucket& MutableBucket(std::uint32_t c) {
    std::unique_ptr<Bucket[]>& chunk = chunks_[c / kChunk];
    if (chunk == nullptr) chunk = std::make_unique<Bucket[]>(kChunk);  // zeroed: n = 0
    return chunk[c % kChunk];
  }
  const ClassTree& TreeOf(std::uint32_t c) const { return *spill_trees_[BucketOf(c).spill()]; }

  void EraseAt(std::uint32_t c, Bucket& b, int i) {
    for (int j = i + 1; j < b.n; ++j) {
      b.addr[j - 1] = b.addr[j];
      b.value[j - 1] = b.value[j];
    }
    if (--b.n == 0) ClearBit(c);
  }
  void Spill(std::uint32_t c, Bucket& b) {
    std::uint32_t t;
    if (!free_trees_.empty()) {
      t = free_trees_.back();
      free_trees_.pop_back();
    } else {
      t = static_cast<std::uint32_t>(spill_trees_.size());
      spill_trees_.push_back(std::make_unique<ClassTree>());
    }
    for (int i = 0; i < b.n; ++i) spill_trees_[t]->insert(Key{ClassSize(c), b.addr[i]}, b.value[i]);
    b.n = 0;
    b.spilled = true;
    b.addr[0] = t;
  }
  void Unspill(std::uint32_t c, Bucket& b) {
    free_trees_.push_back(static_cast<std::uint32_t>(b.spill()));
    b.spilled = false;
    b.n = 0;
    ClearBit(c);
  }
  // A key that is not a multiple of 512 would break "one size per class": from then on every
  // key lives in the overflow tree (the simulator never makes one; this keeps the order exact
  // if it ever did).
  void Degrade() {
    for (auto it = begin(); it != end() && !it.InOverflow(); ++it)
      overflow_.insert(it.key(), it.value());
    degraded_ = true;
    for (auto& chunk : chunks_) chunk.reset();
    std::fill(bits_.begin(), bits_.end(), 0);
    std::fill(summary_.begin(), summary_.end(), 0);
    spill_trees_.clear();
    free_trees_.clear();
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

  iterator InBucket(std::uint32_t c, int i) const {
    iterator out;
    out.set_ = this;
    out.cls_ = c;
    out.idx_ = i;
    return out;
  }
  iterator InTree(std::uint32_t c, ClassIt it) const {
    iterator out;
    out.set_ = this;
    out.cls_ = c;
    out.spilled_ = true;
    out.tree_it_ = it;
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
    const Bucket& b = BucketOf(n);
    return b.spilled ? InTree(n, spill_trees_[b.spill()]->begin()) : InBucket(n, 0);
  }
  // The last key of the non-empty class c.
  iterator LastOf(std::uint32_t c) const {
    const Bucket& b = BucketOf(c);
    if (!b.spilled) return InBucket(c, b.n - 1);
    ClassIt it = spill_trees_[b.spill()]->end();
    --it;
    return InTree(c, it);
  }

  std::uint32_t num_classes_;
  std::size_t size_ = 0;
  bool degraded_ = false;
  std::vector<std::unique_ptr<Bucket[]>> chunks_;
  std::vector<std::unique_ptr<ClassTree>> spill_trees_;
  std::vector<std::uint32_t> free_trees_;
  std::vector<std::uint64_t> bits_;
  std::vector<std::uint64_t> summary_;
  OverflowTree overflow_;
};

}  // namespace fragscope::model::internal

#endif  // FRAGSCOPE_MODEL_SEGREGATED_FREE_SET_H_
