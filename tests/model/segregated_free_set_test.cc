// SegregatedFreeSet against std::set on the same random operations: it must keep exactly the
// (size, address) order of one ordered tree, which is what makes the simulator's best fit
// (the first key not less than (size, 0)) and its ordered walks pick the same block as before.
#include "model/segregated_free_set.h"

#include <cstdint>
#include <iterator>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

namespace fragscope::model::internal {
namespace {

using Set = SegregatedFreeSet<std::uint32_t>;
struct Entry {
  std::uint64_t size;
  std::uint64_t addr;
  std::uint32_t value;
  bool operator<(const Entry& o) const { return std::tie(size, addr) < std::tie(o.size, o.addr); }
};
using Ref = std::set<Entry>;

// The whole order, forwards, and backwards from end().
void ExpectSameOrder(const Set& set, const Ref& ref) {
  ASSERT_EQ(set.size(), ref.size());
  auto it = set.begin();
  for (const Entry& e : ref) {
    ASSERT_NE(it, set.end());
    EXPECT_EQ(it.key().size, e.size);
    EXPECT_EQ(it.key().addr, e.addr);
    EXPECT_EQ(it.value(), e.value);
    ++it;
  }
  EXPECT_EQ(it, set.end());
  auto back = set.end();
  for (auto r = ref.rbegin(); r != ref.rend(); ++r) {
    --back;
    EXPECT_EQ(back.key().size, r->size);
    EXPECT_EQ(back.key().addr, r->addr);
  }
  EXPECT_EQ(back, set.begin());
}

TEST(SegregatedFreeSetTest, EmptySet) {
  Set set(128);
  EXPECT_TRUE(set.empty());
  EXPECT_EQ(set.begin(), set.end());
  EXPECT_EQ(set.lower_bound({512, 0}), set.end());
  EXPECT_FALSE(set.erase(Set::Key{512, 0}));
}

TEST(SegregatedFreeSetTest, OrdersClassesThenOverflowByAddressWithinASize) {
  Set set(64);  // exact classes up to 32 KiB
  // Same size, addresses out of order; a size in the last class; sizes in the overflow tree.
  set.insert({1024, 0x3000}, 1);
  set.insert({1024, 0x1000}, 2);
  set.insert({32768, 0x500}, 3);
  set.insert({32768 + 512, 0x100}, 4);
  set.insert({512, 0x9000}, 5);
  set.insert({1 << 20, 0x0}, 6);
  std::vector<std::uint32_t> order;
  for (auto it = set.begin(); it != set.end(); ++it) order.push_back(it.value());
  EXPECT_EQ(order, (std::vector<std::uint32_t>{5, 2, 1, 3, 4, 6}));
  // Best fit: the smallest size >= the request, then the lowest address.
  EXPECT_EQ(set.lower_bound({600, 0}).value(), 2u);
  EXPECT_EQ(set.lower_bound({1024, 0x2000}).value(), 1u);
  EXPECT_EQ(set.lower_bound({1025, 0}).value(), 3u);   // skips the empty classes between
  EXPECT_EQ(set.lower_bound({32769, 0}).value(), 4u);  // from the last class into the overflow
  EXPECT_EQ(set.lower_bound({(1 << 20) + 1, 0}), set.end());
}

// Random inserts, erases (by key and by iterator), best-fit queries and walks in both
// directions, with sizes clustered around class and overflow boundaries and many ties (classes
// outgrow their inline slots and move to trees, and back). With `irregular`, some sizes are
// not multiples of 512, which moves every key to the overflow tree at the first such insert.
void RunRandomOperations(bool irregular) {
  for (const std::uint32_t classes : {64u, 4096u}) {
    std::mt19937_64 rng(classes + (irregular ? 1 : 0));
    Set set(classes);
    Ref ref;
    const std::uint64_t limit = std::uint64_t{classes} * 512;
    auto random_size = [&]() -> std::uint64_t {
      switch (rng() % 6) {
        case 0:
          return 512 * (1 + rng() % 4);  // few sizes: long runs of ties
        case 1:
          return limit - 512 * (rng() % 3);  // the last classes
        case 2:
          return limit + 512 * (1 + rng() % 3);  // just into the overflow tree
        case 3:
          return 512 * (1 + rng() % (2 * classes));
        case 4:
          if (irregular && rng() % 1000 == 0) return 1 + rng() % (2 * limit);
          return 512 * (1 + rng() % (2 * classes));
        default:
          return 512 * (1 + rng() % 8);
      }
    };
    std::uint32_t next_value = 0;
    for (int step = 0; step < 40000; ++step) {
      const auto op = rng() % 10;
      if (op < 4 || ref.empty()) {
        Entry e{random_size(), (rng() % 512) * 512, next_value++};
        if (ref.count(e) != 0) continue;
        ref.insert(e);
        set.insert({e.size, e.addr}, e.value);
      } else if (op < 6) {
        auto r = ref.begin();
        std::advance(r, static_cast<long>(rng() % ref.size()));
        ASSERT_TRUE(set.erase(Set::Key{r->size, r->addr}));
        ref.erase(r);
      } else if (op < 8) {
        const Entry probe{random_size(), 0, 0};
        auto r = ref.lower_bound(probe);
        auto it = set.lower_bound({probe.size, probe.addr});
        if (r == ref.end()) {
          ASSERT_EQ(it, set.end());
          continue;
        }
        ASSERT_NE(it, set.end());
        ASSERT_EQ(it.key().size, r->size);
        ASSERT_EQ(it.key().addr, r->addr);
        ASSERT_EQ(it.value(), r->value);
        // Walk a few steps on, as the expandable-segment ranking does, and back.
        for (int k = 0; k < 3 && std::next(r) != ref.end(); ++k) {
          ++r;
          ++it;
          ASSERT_EQ(it.value(), r->value);
        }
        if (r != ref.begin()) {
          --r;
          --it;
          ASSERT_EQ(it.value(), r->value);
        }
        if (rng() % 2 == 0) {  // erase through the iterator, as GetFreeBlock does
          set.erase(it);
          ref.erase(r);
        }
      } else if (op == 8) {
        EXPECT_FALSE(set.erase(Set::Key{random_size(), 512 * 512 + 1}));
      } else if (step % 64 == 0) {
        ExpectSameOrder(set, ref);
      }
      ASSERT_EQ(set.size(), ref.size());
    }
    ExpectSameOrder(set, ref);
    // Empty it from the largest key down, as the oversize release walks.
    while (!ref.empty()) {
      auto it = set.end();
      --it;
      ASSERT_EQ(it.value(), std::prev(ref.end())->value);
      set.erase(it);
      ref.erase(std::prev(ref.end()));
    }
    EXPECT_TRUE(set.empty());
    EXPECT_EQ(set.begin(), set.end());
  }
}

TEST(SegregatedFreeSetTest, MatchesAnOrderedSetOnRandomOperations) { RunRandomOperations(false); }

TEST(SegregatedFreeSetTest, KeepsTheOrderAfterASizeThatIsNotAMultipleOf512) {
  RunRandomOperations(true);
}

TEST(SegregatedFreeSetTest, ManyBlocksOfOneSizeStayInAddressOrder) {
  Set set(4096);
  for (std::uint32_t i = 0; i < 100; ++i) set.insert({4096, (i * 37 % 100) * 4096}, i * 37 % 100);
  EXPECT_EQ(set.lower_bound({4096, 0}).value(), 0u);
  EXPECT_EQ(set.lower_bound({4096, 50 * 4096}).value(), 50u);
  for (std::uint32_t i = 0; i < 100; i += 2) EXPECT_TRUE(set.erase(Set::Key{4096, i * 4096}));
  std::uint32_t expect = 1;
  for (auto it = set.begin(); it != set.end(); ++it, expect += 2) EXPECT_EQ(it.value(), expect);
  for (std::uint32_t i = 1; i < 100; i += 2) EXPECT_TRUE(set.erase(Set::Key{4096, i * 4096}));
  EXPECT_TRUE(set.empty());
  set.insert({4096, 7}, 7);  // the class starts over inline
  EXPECT_EQ(set.begin().value(), 7u);
}

}  // namespace
}  // namespace fragscope::model::internal
