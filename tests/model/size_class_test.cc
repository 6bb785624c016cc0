#include "model/size_class.h"

#include <map>
#include <random>
#include <set>

#include <gtest/gtest.h>

#include "model/address_index.h"
#include "model/free_size_index.h"

namespace fragscope::model {
namespace {

TEST(SizeClassTest, MonotonicAndFloorInverts) {
  EXPECT_EQ(SizeClass(0), 0);
  EXPECT_EQ(SizeClass(63), 63);
  EXPECT_EQ(SizeClass(64), 64);
  EXPECT_EQ(ClassFloor(SizeClass(1000)), 1000u);  // 1000 = 512 + 61 * 8: a boundary
  EXPECT_EQ(ClassFloor(SizeClass(7340033)), 7340032u);
  EXPECT_EQ(SizeClass(~std::uint64_t{0}), kNumSizeClasses - 1);
  std::mt19937_64 rng(1);
  for (int i = 0; i < 100000; ++i) {
    const std::uint64_t a = rng() >> (rng() % 64);
    const std::uint64_t b = a + (rng() % 1000);
    if (b < a) continue;
    ASSERT_LE(SizeClass(a), SizeClass(b));
    ASSERT_EQ(SizeClass(ClassFloor(SizeClass(a))), SizeClass(a));
    ASSERT_LE(ClassFloor(SizeClass(a)), a);
    // Classes are at most 1/64 of an octave wide.
    ASSERT_LE(a - ClassFloor(SizeClass(a)), a / 64);
  }
}

TEST(ClassCountsTest, PrefixSumsAndRank) {
  ClassCounts f;
  f.Add(SizeClass(512), 3);
  f.Add(SizeClass(4096), 2);
  EXPECT_EQ(f.PrefixSum(SizeClass(512)), 0u);
  EXPECT_EQ(f.PrefixSum(SizeClass(512) + 1), 3u);
  EXPECT_EQ(f.FindByRank(0), SizeClass(512));
  EXPECT_EQ(f.FindByRank(2), SizeClass(512));
  EXPECT_EQ(f.FindByRank(3), SizeClass(4096));
  EXPECT_EQ(f.FindByRank(5), kNumSizeClasses);
}

// Random adds and removes over every class (the first, the last and group edges included),
// each query checked against a plain count array.
TEST(ClassCountsTest, MatchesBruteForce) {
  ClassCounts f;
  std::vector<std::uint64_t> truth(kNumSizeClasses, 0);
  std::mt19937_64 rng(3);
  std::uint64_t total = 0;
  auto pick = [&]() -> int {
    switch (rng() % 4) {
      case 0:
        return static_cast<int>(rng() % 3);  // 0, 1, 2
      case 1:
        return kNumSizeClasses - 1 - static_cast<int>(rng() % 3);
      case 2:
        return static_cast<int>(rng() % 59) * kSubClasses + (rng() % 2 == 0 ? 0 : kSubClasses - 1);
      default:
        return static_cast<int>(rng() % kNumSizeClasses);
    }
  };
  for (int i = 0; i < 20000; ++i) {
    const int c = pick();
    if (truth[static_cast<std::size_t>(c)] > 0 && rng() % 3 == 0) {
      f.Add(c, -1);
      --truth[static_cast<std::size_t>(c)];
      --total;
    } else {
      const std::uint64_t n = 1 + rng() % 3;
      f.Add(c, static_cast<std::int64_t>(n));
      truth[static_cast<std::size_t>(c)] += n;
      total += n;
    }
    if (i % 37 != 0) continue;
    const int q = static_cast<int>(rng() % (kNumSizeClasses + 1));
    std::uint64_t below = 0;
    for (int k = 0; k < q; ++k) below += truth[static_cast<std::size_t>(k)];
    ASSERT_EQ(f.PrefixSum(q), below) << "class " << q;
    const std::uint64_t rank = rng() % (total + 2);
    int want = kNumSizeClasses;
    std::uint64_t seen = 0;
    for (int k = 0; k < kNumSizeClasses; ++k) {
      seen += truth[static_cast<std::size_t>(k)];
      if (seen > rank) {
        want = k;
        break;
      }
    }
    ASSERT_EQ(f.FindByRank(rank), want) << "rank " << rank << " of " << total;
  }
}

// Adds a size from `make_size` to both, or removes a random one of truth's sizes from both.
template <typename MakeSize>
void AddOrRemove(FreeSizeIndex& index, std::multiset<std::uint64_t>& truth, std::mt19937_64& rng,
                 bool add, MakeSize&& make_size) {
  if (add) {
    const std::uint64_t size = make_size();
    index.Add(size);
    truth.insert(size);
    return;
  }
  auto it = truth.begin();
  std::advance(it, static_cast<long>(rng() % truth.size()));
  index.Remove(*it);
  truth.erase(it);
}

TEST(FreeSizeIndexTest, MatchesBruteForce) {
  FreeSizeIndex index;
  std::multiset<std::uint64_t> truth;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 20000; ++i) {
    AddOrRemove(index, truth, rng, truth.empty() || rng() % 3 != 0,
                [&] { return 512 * (1 + rng() % 50000); });
    if (i % 97 == 0) {
      const std::uint64_t t = rng() % (512 * 50001);
      std::uint64_t below = 0, n = 0;
      for (std::uint64_t s : truth) {
        if (s < t) {
          below += s;
          ++n;
        }
      }
      ASSERT_EQ(index.BytesBelow(t), below);
      ASSERT_EQ(index.CountBelow(t), n);
      ASSERT_EQ(index.Largest(), truth.empty() ? 0 : *truth.rbegin());
      ASSERT_EQ(index.count(), truth.size());
      SizeHistogram h;
      for (std::uint64_t s : truth) {
        ++h.count[static_cast<std::size_t>(HistogramBucket(s))];
        h.bytes[static_cast<std::size_t>(HistogramBucket(s))] += s;
      }
      ASSERT_EQ(index.histogram().count, h.count);
      ASSERT_EQ(index.histogram().bytes, h.bytes);
    }
  }
}

// Few distinct sizes per class, as allocator traces have: each class keeps up to
// kInlineSizes of them in its slot and spills the rest beside it, and back once it empties.
// Sizes 0..4 KiB and around 1 GiB (classes 16 MiB wide), added and removed at random; every
// read is compared with a multiset after every operation.
TEST(FreeSizeIndexTest, InlineAndSpilledSizesMatchBruteForce) {
  FreeSizeIndex index;
  std::multiset<std::uint64_t> truth;
  std::mt19937_64 rng(11);
  const std::uint64_t gib = std::uint64_t{1} << 30;
  auto pick = [&]() -> std::uint64_t {
    switch (rng() % 3) {
      case 0:
        return rng() % 4097;  // classes 0..63 are single sizes; above, 1/64-octave classes
      case 1:
        return gib + (rng() % (FreeSizeIndex::kInlineSizes + 3)) * 4096;  // one class
      default:
        return gib + (std::uint64_t{1} << 24) * (rng() % 4) + rng() % 8;  // 4 classes, 8 sizes
    }
  };
  for (int i = 0; i < 30000; ++i) {
    AddOrRemove(index, truth, rng, truth.empty() || rng() % 2 == 0, pick);
    ASSERT_EQ(index.Largest(), truth.empty() ? 0 : *truth.rbegin());
    ASSERT_EQ(index.count(), truth.size());
    const std::uint64_t t = rng() % 2 == 0 ? pick() + rng() % 2 : rng() % (2 * gib);
    std::uint64_t below = 0, n = 0;
    for (auto it = truth.begin(); it != truth.end() && *it < t; ++it) {
      below += *it;
      ++n;
    }
    ASSERT_EQ(index.BytesBelow(t), below) << "op " << i << " threshold " << t;
    ASSERT_EQ(index.CountBelow(t), n);
  }
  while (!truth.empty()) {
    index.Remove(*truth.begin());
    truth.erase(truth.begin());
  }
  EXPECT_EQ(index.Largest(), 0u);
  EXPECT_EQ(index.bytes(), 0u);
  // A moved-to index keeps the state, spilled classes included.
  for (std::uint64_t k = 0; k < 6; ++k) index.Add(gib + k);
  FreeSizeIndex moved = std::move(index);
  EXPECT_EQ(moved.Largest(), gib + 5);
  EXPECT_EQ(moved.CountBelow(gib + 3), 3u);
  index = std::move(moved);
  EXPECT_EQ(index.BytesBelow(gib + 2), 2 * gib + 1);
}

TEST(AddressIndexTest, InsertFindEraseAgainstStdMap) {
  AddressIndex index;
  std::map<std::uint64_t, std::uint32_t> truth;
  std::mt19937_64 rng(3);
  for (std::uint32_t i = 0; i < 200000; ++i) {
    const std::uint64_t key = (rng() % 5000) * 512;  // many collisions and reuse
    if (truth.count(key)) {
      ASSERT_EQ(index.Find(key), truth[key]);
      index.Erase(key);
      truth.erase(key);
      ASSERT_EQ(index.Find(key), AddressIndex::kNotFound);
    } else {
      index.Insert(key, i);
      truth[key] = i;
    }
    ASSERT_EQ(index.size(), truth.size());
  }
  for (const auto& [k, v] : truth) ASSERT_EQ(index.Find(k), v);
  EXPECT_EQ(index.Find(~std::uint64_t{0}), AddressIndex::kNotFound);
}

}  // namespace
}  // namespace fragscope::model

namespace fragscope::model {
namespace {

// A hostile trace can put many distinct sizes into one size class; past kMaxFlatSizes the
// class switches to a tree, and back when it empties. Results must not change.
TEST(FreeSizeIndexTest, ManyDistinctSizesInOneClass) {
  FreeSizeIndex index;
  const std::uint64_t base = std::uint64_t{1} << 30;  // class width: 16 MiB
  std::vector<std::uint64_t> sizes;
  for (std::uint64_t i = 0; i < 3 * FreeSizeIndex::kMaxFlatSizes; ++i) {
    sizes.push_back(base + i * 7);
    index.Add(sizes.back());
  }
  EXPECT_EQ(index.Largest(), sizes.back());
  EXPECT_EQ(index.CountBelow(base + 7 * 100), 100u);
  std::uint64_t expect = 0;
  for (std::uint64_t i = 0; i < 100; ++i) expect += base + i * 7;
  EXPECT_EQ(index.BytesBelow(base + 7 * 100), expect);
  for (std::size_t i = sizes.size(); i-- > 1;) index.Remove(sizes[i]);
  EXPECT_EQ(index.Largest(), base);
  EXPECT_EQ(index.count(), 1u);
  index.Remove(base);
  EXPECT_EQ(index.Largest(), 0u);
  EXPECT_EQ(index.BytesBelow(~std::uint64_t{0}), 0u);
}

}  // namespace
}  // namespace fragscope::model
