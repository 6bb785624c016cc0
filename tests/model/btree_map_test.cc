// BTreeMap against std::map: random inserts, erases (by key and by iterator), lower_bound, and
// iteration in both directions, values travelling with their keys, with tiny nodes so that splits,
// empty-leaf removal and root collapse happen constantly.
#include "model/btree_map.h"

#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace fragscope::model::internal {
namespace {

struct Key {
  std::uint64_t a;
  std::uint64_t b;
};
struct KeyLess {
  bool operator()(const Key& x, const Key& y) const { return x.a != y.a ? x.a < y.a : x.b < y.b; }
};
using Ref = std::map<std::pair<std::uint64_t, std::uint64_t>, std::uint32_t>;

std::uint32_t ValueOf(const Key& k) { return static_cast<std::uint32_t>(k.a * 1000003 + k.b); }

template <typename Tree>
void ExpectSame(const Tree& tree, const Ref& ref) {
  ASSERT_EQ(tree.size(), ref.size());
  auto it = tree.begin();
  for (const auto& [k, v] : ref) {
    ASSERT_NE(it, tree.end());
    ASSERT_EQ(it.key().a, k.first);
    ASSERT_EQ(it.key().b, k.second);
    ASSERT_EQ(it.value(), v);
    ++it;
  }
  ASSERT_EQ(it, tree.end());
  // Backwards from end().
  auto rit = ref.rbegin();
  for (auto bit = tree.end(); rit != ref.rend(); ++rit) {
    --bit;
    ASSERT_EQ(bit.key().a, rit->first.first);
    ASSERT_EQ(bit.key().b, rit->first.second);
    ASSERT_EQ(bit.value(), rit->second);
  }
}

template <int kLeaf, int kInner>
void RandomRun(std::uint64_t seed, int steps, std::uint64_t key_range) {
  BTreeMap<Key, std::uint32_t, KeyLess, kLeaf, kInner> tree;
  Ref ref;
  std::mt19937_64 rng(seed);
  for (int step = 0; step < steps; ++step) {
    const Key k{rng() % 8, rng() % key_range};
    const int op = static_cast<int>(rng() % 10);
    if (op < 5) {
      if (ref.emplace(std::make_pair(k.a, k.b), ValueOf(k)).second) tree.insert(k, ValueOf(k));
    } else if (op < 7) {
      EXPECT_EQ(tree.erase(k), ref.erase(std::make_pair(k.a, k.b)) == 1);
    } else if (op < 9) {
      auto it = tree.lower_bound(k);
      auto rt = ref.lower_bound(std::make_pair(k.a, k.b));
      if (rt == ref.end()) {
        EXPECT_EQ(it, tree.end());
      } else {
        ASSERT_NE(it, tree.end());
        EXPECT_EQ(it.key().a, rt->first.first);
        EXPECT_EQ(it.key().b, rt->first.second);
        EXPECT_EQ(it.value(), rt->second);
        if (op == 8) {  // erase through the iterator
          tree.erase(it);
          ref.erase(rt);
        }
      }
    } else if (step % 97 == 0) {
      ExpectSame(tree, ref);
    }
  }
  ExpectSame(tree, ref);
  // Drain completely, then reuse.
  while (!ref.empty()) {
    tree.erase(tree.begin());
    ref.erase(ref.begin());
  }
  EXPECT_TRUE(tree.empty());
  EXPECT_EQ(tree.begin(), tree.end());
  tree.insert(Key{1, 2}, 7);
  EXPECT_EQ(tree.size(), 1u);
  EXPECT_EQ(tree.begin().key().b, 2u);
  EXPECT_EQ(tree.begin().value(), 7u);
}

TEST(BTreeMapTest, MatchesStdMapWithTinyNodes) { RandomRun<4, 4>(1, 200000, 64); }
TEST(BTreeMapTest, MatchesStdMapWithOddInnerNodes) { RandomRun<5, 5>(2, 200000, 500); }
TEST(BTreeMapTest, MatchesStdMapWithDefaultNodes) { RandomRun<64, 32>(3, 300000, 5000); }

TEST(BTreeMapTest, AscendingAndDescendingBulk) {
  BTreeMap<Key, std::uint32_t, KeyLess, 4, 4> tree;
  Ref ref;
  for (std::uint64_t i = 0; i < 5000; ++i) {
    tree.insert(Key{0, i}, ValueOf(Key{0, i}));
    ref.emplace(std::make_pair(std::uint64_t{0}, i), ValueOf(Key{0, i}));
  }
  for (std::uint64_t i = 10000; i > 5000; --i) {
    tree.insert(Key{1, i}, ValueOf(Key{1, i}));
    ref.emplace(std::make_pair(std::uint64_t{1}, i), ValueOf(Key{1, i}));
  }
  ExpectSame(tree, ref);
  for (std::uint64_t i = 0; i < 5000; i += 2) {
    tree.erase(Key{0, i});
    ref.erase(std::make_pair(std::uint64_t{0}, i));
  }
  ExpectSame(tree, ref);
  auto it = tree.lower_bound(Key{0, 4999});
  ASSERT_NE(it, tree.end());
  EXPECT_EQ(it.key().b, 4999u);
  ++it;
  EXPECT_EQ(it.key().a, 1u);
  EXPECT_EQ(it.key().b, 5001u);
}

}  // namespace
}  // namespace fragscope::model::internal
