// BTreeMap: an ordered map from small trivially copyable keys to small values, stored in a B+tree
// whose leaves hold up to kLeafCap keys side by side (values in a parallel array, so searches
// read keys only). CachingAllocatorSim's free sets (segregated_free_set.h) use it, keyed by
// (size, address) as PyTorch's std::set orders them, for blocks above the exact size classes
// and for a size class that outgrows its inline slots; a search, insert or erase then touches a
// few contiguous cache lines instead of a chain of tree nodes.
//
// Deletion is lazy: a leaf is only removed when it becomes empty (inner separators stay valid
// bounds), so erase never rebalances. Every leaf holds at least one key, so the height stays
// O(log of the peak size). Nodes are recycled, never returned before destruction.
//
// Iterators are invalidated by any insert or erase (keys move inside leaves).
// Thread safety: none.
#ifndef FRAGSCOPE_MODEL_BTREE_MAP_H_
#define FRAGSCOPE_MODEL_BTREE_MAP_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <vector>

namespace fragscope::model::internal {

template <typename Key, typename Value, typename Less, int kLeafCap = 64, int kInnerCap = 32>
class BTreeMap {
  static_assert(std::is_trivially_copyable_v<Key> && std::is_trivially_copyable_v<Value>);
  static_assert(kLeafCap >= 4 && kInnerCap >= 4);

  struct Inner;
  struct Node {
    Inner* parent = nullptr;
    int n = 0;  // keys in a leaf; children in an inner node
    bool is_leaf = true;
  };
  struct Leaf : Node {
    Leaf* prev = nullptr;
    Leaf* next = nullptr;
    Key keys[kLeafCap];
    Value values[kLeafCap];
  };
  struct Inner : Node {
    // seps[i] separates child[i] from child[i + 1]: keys in child[i] are < seps[i] and keys in
    // child[i + 1] are >= seps[i].
    Key seps[kInnerCap - 1];
    Node* child[kInnerCap];
  };

 public:
  class iterator {
   public:
    iterator() = default;
    const Key& key() const { return leaf_->keys[idx_]; }
    const Value& value() const { return leaf_->values[idx_]; }
    iterator& operator++() {
      if (++idx_ == leaf_->n) {
        leaf_ = leaf_->next;
        idx_ = 0;
      }
      return *this;
    }
    iterator operator++(int) {
      iterator old = *this;
      ++*this;
      return old;
    }
    iterator& operator--() {
      if (leaf_ == nullptr) {
        leaf_ = tree_->last_;
        idx_ = leaf_->n - 1;
      } else if (idx_ == 0) {
        leaf_ = leaf_->prev;
        idx_ = leaf_->n - 1;
      } else {
        --idx_;
      }
      return *this;
    }
    bool operator==(const iterator& o) const { return leaf_ == o.leaf_ && idx_ == o.idx_; }
    bool operator!=(const iterator& o) const { return !(*this == o); }

   private:
    friend class BTreeMap;
    iterator(const BTreeMap* tree, Leaf* leaf, int idx) : tree_(tree), leaf_(leaf), idx_(idx) {}
    const BTreeMap* tree_ = nullptr;
    Leaf* leaf_ = nullptr;  // nullptr = end()
    int idx_ = 0;
  };

  BTreeMap() = default;
  BTreeMap(const BTreeMap&) = delete;
  BTreeMap& operator=(const BTreeMap&) = delete;

  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  /// Leaves in use (for tests and tuning: the average leaf holds size() / leaves() keys).
  std::size_t leaves() const { return leaves_.size() - free_leaves_.size(); }
  iterator begin() const { return iterator(this, first_, 0); }
  iterator end() const { return iterator(this, nullptr, 0); }

  /// The first key not less than `key`.
  iterator lower_bound(const Key& key) const {
    if (root_ == nullptr) return end();
    Leaf* leaf = Descend(key);
    const int i = LowerBound(leaf->keys, leaf->n, key);
    if (i == leaf->n) return iterator(this, leaf->next, 0);
    return iterator(this, leaf, i);
  }

  iterator find(const Key& key) const {
    iterator it = lower_bound(key);
    if (it == end() || less_(key, it.key())) return end();
    return it;
  }

  /// REQUIRES: no equivalent key is present.
  void insert(const Key& key, const Value& value) {
    ++size_;
    if (root_ == nullptr) {
      Leaf* leaf = NewLeaf();
      leaf->keys[0] = key;
      leaf->values[0] = value;
      leaf->n = 1;
      root_ = first_ = last_ = leaf;
      return;
    }
    Leaf* leaf = Descend(key);
    int i = LowerBound(leaf->keys, leaf->n, key);
    if (leaf->n < kLeafCap) {
      InsertAt(leaf, i, key, value);
      return;
    }
    // Split the full leaf in two halves, then insert into the half the key belongs to.
    Leaf* right = NewLeaf();
    constexpr int kKeep = kLeafCap / 2;
    std::copy(leaf->keys + kKeep, leaf->keys + kLeafCap, right->keys);
    std::copy(leaf->values + kKeep, leaf->values + kLeafCap, right->values);
    right->n = kLeafCap - kKeep;
    leaf->n = kKeep;
    right->prev = leaf;
    right->next = leaf->next;
    if (leaf->next != nullptr)
      leaf->next->prev = right;
    else
      last_ = right;
    leaf->next = right;
    if (i > kKeep) {
      InsertAt(right, i - kKeep, key, value);
    } else {
      InsertAt(leaf, i, key, value);
    }
    InsertIntoParent(leaf, right->keys[0], right);
  }

  /// REQUIRES: it is a valid, dereferenceable iterator.
  void erase(iterator it) {
    Leaf* leaf = it.leaf_;
    std::copy(leaf->keys + it.idx_ + 1, leaf->keys + leaf->n, leaf->keys + it.idx_);
    std::copy(leaf->values + it.idx_ + 1, leaf->values + leaf->n, leaf->values + it.idx_);
    --leaf->n;
    --size_;
    if (leaf->n == 0) RemoveLeaf(leaf);
  }

  /// Erases `key` if present; returns whether it was.
  bool erase(const Key& key) {
    iterator it = find(key);
    if (it == end()) return false;
    erase(it);
    return true;
  }

  void clear() {
    while (root_ != nullptr) erase(begin());
  }

 private:
  static void InsertAt(Leaf* leaf, int i, const Key& key, const Value& value) {
    std::copy_backward(leaf->keys + i, leaf->keys + leaf->n, leaf->keys + leaf->n + 1);
    std::copy_backward(leaf->values + i, leaf->values + leaf->n, leaf->values + leaf->n + 1);
    leaf->keys[i] = key;
    leaf->values[i] = value;
    ++leaf->n;
  }

  Leaf* Descend(const Key& key) const {
    Node* node = root_;
    while (!node->is_leaf) {
      Inner* in = static_cast<Inner*>(node);
      node = in->child[UpperBound(in->seps, in->n - 1, key)];
    }
    return static_cast<Leaf*>(node);
  }

  // Branch-free binary searches (the comparisons are data-dependent and mispredict otherwise):
  // the index of the first key not less than / greater than `key` among keys[0, n).
  int LowerBound(const Key* keys, int n, const Key& key) const {
    if (n == 0) return 0;
    const Key* base = keys;
    while (n > 1) {
      const int half = n / 2;
      base = less_(base[half], key) ? base + half : base;
      n -= half;
    }
    return static_cast<int>(base - keys) + (less_(*base, key) ? 1 : 0);
  }
  int UpperBound(const Key* keys, int n, const Key& key) const {
    if (n == 0) return 0;
    const Key* base = keys;
    while (n > 1) {
      const int half = n / 2;
      base = less_(key, base[half]) ? base : base + half;
      n -= half;
    }
    return static_cast<int>(base - keys) + (less_(key, *base) ? 0 : 1);
  }

  static int IndexInParent(const Node* node) {
    const Inner* p = node->parent;
    int i = 0;
    while (p->child[i] != node) ++i;
    return i;
  }

  void InsertIntoParent(Node* left, const Key& sep, Node* right) {
    Inner* p = left->parent;
    if (p == nullptr) {
      Inner* root = NewInner();
      root->n = 2;
      root->child[0] = left;
      root->child[1] = right;
      root->seps[0] = sep;
      left->parent = right->parent = root;
      root_ = root;
      return;
    }
    const int i = IndexInParent(left);
    if (p->n < kInnerCap) {
      std::copy_backward(p->child + i + 1, p->child + p->n, p->child + p->n + 1);
      std::copy_backward(p->seps + i, p->seps + p->n - 1, p->seps + p->n);
      p->child[i + 1] = right;
      p->seps[i] = sep;
      right->parent = p;
      ++p->n;
      return;
    }
    // Split the full inner node: lay out all kInnerCap + 1 children and kInnerCap separators,
    // keep the first half, move the second half, push the middle separator up.
    Node* children[kInnerCap + 1];
    Key seps[kInnerCap];
    std::copy(p->child, p->child + i + 1, children);
    children[i + 1] = right;
    std::copy(p->child + i + 1, p->child + kInnerCap, children + i + 2);
    std::copy(p->seps, p->seps + i, seps);
    seps[i] = sep;
    std::copy(p->seps + i, p->seps + kInnerCap - 1, seps + i + 1);
    constexpr int kLeft = (kInnerCap + 1) / 2;  // children kept on the left
    constexpr int kRight = kInnerCap + 1 - kLeft;
    Inner* q = NewInner();
    std::copy(children, children + kLeft, p->child);
    std::copy(seps, seps + kLeft - 1, p->seps);
    p->n = kLeft;
    std::copy(children + kLeft, children + kInnerCap + 1, q->child);
    std::copy(seps + kLeft, seps + kInnerCap, q->seps);
    q->n = kRight;
    for (int c = 0; c < p->n; ++c) p->child[c]->parent = p;
    for (int c = 0; c < q->n; ++c) q->child[c]->parent = q;
    InsertIntoParent(p, seps[kLeft - 1], q);
  }

  void RemoveLeaf(Leaf* leaf) {
    if (leaf->prev != nullptr)
      leaf->prev->next = leaf->next;
    else
      first_ = leaf->next;
    if (leaf->next != nullptr)
      leaf->next->prev = leaf->prev;
    else
      last_ = leaf->prev;
    RemoveNode(leaf);
  }

  // Removes an empty node from its parent (recursively when the parent empties) and collapses
  // a root with a single child.
  void RemoveNode(Node* node) {
    Inner* p = node->parent;
    FreeNode(node);
    if (p == nullptr) {
      root_ = nullptr;
      return;
    }
    const int i = IndexInParent(node);
    std::copy(p->child + i + 1, p->child + p->n, p->child + i);
    const int s = i > 0 ? i - 1 : 0;  // the separator that bounded the removed child
    if (p->n > 1) std::copy(p->seps + s + 1, p->seps + p->n - 1, p->seps + s);
    --p->n;
    if (p->n == 0) {
      RemoveNode(p);
      return;
    }
    while (root_ != nullptr && !root_->is_leaf && root_->n == 1) {
      Inner* old = static_cast<Inner*>(root_);
      root_ = old->child[0];
      root_->parent = nullptr;
      FreeNode(old);
    }
  }

  Leaf* NewLeaf() {
    Leaf* leaf;
    if (!free_leaves_.empty()) {
      leaf = free_leaves_.back();
      free_leaves_.pop_back();
    } else {
      leaves_.push_back(std::make_unique<Leaf>());
      leaf = leaves_.back().get();
    }
    leaf->parent = nullptr;
    leaf->n = 0;
    leaf->is_leaf = true;
    leaf->prev = leaf->next = nullptr;
    return leaf;
  }

  Inner* NewInner() {
    Inner* in;
    if (!free_inners_.empty()) {
      in = free_inners_.back();
      free_inners_.pop_back();
    } else {
      inners_.push_back(std::make_unique<Inner>());
      in = inners_.back().get();
    }
    in->parent = nullptr;
    in->n = 0;
    in->is_leaf = false;
    return in;
  }

  void FreeNode(Node* node) {
    if (node->is_leaf)
      free_leaves_.push_back(static_cast<Leaf*>(node));
    else
      free_inners_.push_back(static_cast<Inner*>(node));
  }

  Node* root_ = nullptr;
  Leaf* first_ = nullptr;
  Leaf* last_ = nullptr;
  std::size_t size_ = 0;
  [[no_unique_address]] Less less_{};
  std::vector<std::unique_ptr<Leaf>> leaves_;
  std::vector<std::unique_ptr<Inner>> inners_;
  std::vector<Leaf*> free_leaves_;
  std::vector<Inner*> free_inners_;
};

}  // namespace fragscope::model::internal

#endif  // FRAGSCOPE_MODEL_BTREE_MAP_H_
