#include "model/allocator_rules.h"

#include <gtest/gtest.h>

namespace fragscope::model {
namespace {

// Expected figures: shared/spec/pytorch-caching-allocator.md §4.1 table and §4.3 examples.
TEST(AllocatorRulesTest, RoundsRequestsLikePyTorch) {
  AllocatorRules rules;
  EXPECT_EQ(rules.RoundSize(1), 512u);
  EXPECT_EQ(rules.RoundSize(513), 1024u);
  EXPECT_EQ(rules.RoundSize(1000), 1024u);
  EXPECT_EQ(rules.RoundSize(1048577), 1049088u);
  EXPECT_EQ(AllocatorRules::PoolFor(rules.RoundSize(1048577)), Pool::kLarge);
  EXPECT_EQ(AllocatorRules::PoolFor(rules.RoundSize(1048576)), Pool::kSmall);
}

TEST(AllocatorRulesTest, PowerOfTwoDivisions) {
  AllocatorRules four;
  four.roundup_power2_divisions.fill(4);
  EXPECT_EQ(four.RoundSize(1200), 1536u);  // 1200 <= 512 * 4: plain rounding
  EXPECT_EQ(four.RoundSize(3000), 3072u);
  EXPECT_EQ(four.RoundSize(88080384), 100663296u);  // 84 MiB -> 96 MiB
  AllocatorRules eight;
  eight.roundup_power2_divisions.fill(8);
  EXPECT_EQ(eight.RoundSize(88080384), 92274688u);  // 84 MiB -> 88 MiB
  AllocatorRules two;
  two.roundup_power2_divisions.fill(2);
  EXPECT_EQ(two.RoundSize(419430400), 536870912u);  // 400 MiB -> 512 MiB
}

TEST(AllocatorRulesTest, SegmentSizes) {
  EXPECT_EQ(AllocatorRules::SegmentSize(512), 2 * kMiB);
  EXPECT_EQ(AllocatorRules::SegmentSize(kMiB), 2 * kMiB);
  EXPECT_EQ(AllocatorRules::SegmentSize(kMiB + 512), 20 * kMiB);  // 1 MiB + 1 B request
  EXPECT_EQ(AllocatorRules::SegmentSize(9 * kMiB + kMiB / 2), 20 * kMiB);
  EXPECT_EQ(AllocatorRules::SegmentSize(10485760), 10485760u);
  EXPECT_EQ(AllocatorRules::SegmentSize(10486272), 12582912u);
}

TEST(AllocatorRulesTest, SplitRules) {
  AllocatorRules rules;
  // Small pool: split iff the remainder is >= 512.
  EXPECT_TRUE(rules.ShouldSplit(Pool::kSmall, 2 * kMiB, 1024));
  EXPECT_TRUE(rules.ShouldSplit(Pool::kSmall, 1536, 1024));
  EXPECT_FALSE(rules.ShouldSplit(Pool::kSmall, 1024, 1024));
  // Large pool: remainder must exceed 1 MiB; exactly 1 MiB is not split (§4.8).
  EXPECT_FALSE(rules.ShouldSplit(Pool::kLarge, 20 * kMiB, 19 * kMiB + kMiB / 2));
  EXPECT_FALSE(rules.ShouldSplit(Pool::kLarge, 20 * kMiB, 19 * kMiB));
  EXPECT_TRUE(rules.ShouldSplit(Pool::kLarge, 20 * kMiB, 19 * kMiB - 512));
  // A freed 12 MiB block is not split for a 11.5 MiB request (remainder 0.5 MiB <= 1 MiB).
  EXPECT_FALSE(rules.ShouldSplit(Pool::kLarge, 12 * kMiB, 11 * kMiB + kMiB / 2));
  // Oversize: with max_split_size 20 MiB, a 30 MiB request takes a 64 MiB block whole.
  AllocatorRules limited;
  limited.max_split_size = 20 * kMiB;
  EXPECT_FALSE(limited.ShouldSplit(Pool::kLarge, 64 * kMiB, 30 * kMiB));
  EXPECT_TRUE(limited.ShouldSplit(Pool::kLarge, 64 * kMiB, 10 * kMiB));
  // Expandable segments split at 512 in the large pool too.
  AllocatorRules expandable;
  expandable.expandable_segments = true;
  EXPECT_TRUE(expandable.ShouldSplit(Pool::kLarge, 20 * kMiB, 20 * kMiB - 512));
}

TEST(AllocatorRulesTest, LargestRequestForNewSegment) {
  EXPECT_EQ(AllocatorRules::LargestRequestForNewSegment(0), 0u);
  EXPECT_EQ(AllocatorRules::LargestRequestForNewSegment(2 * kMiB - 1), 0u);
  EXPECT_EQ(AllocatorRules::LargestRequestForNewSegment(2 * kMiB), kMiB);
  EXPECT_EQ(AllocatorRules::LargestRequestForNewSegment(10 * kMiB - 1), kMiB);
  EXPECT_EQ(AllocatorRules::LargestRequestForNewSegment(10 * kMiB), 10 * kMiB);
  EXPECT_EQ(AllocatorRules::LargestRequestForNewSegment(81788928 + 100), 81788928u);
}

TEST(AllocatorRulesTest, FromSettings) {
  auto rules = AllocatorRules::FromSettings({{"max_split_size_mb", "128"},
                                             {"expandable_segments", "True"},
                                             {"roundup_power2_divisions", "4"},
                                             {"garbage_collection_threshold", "0.6"}});
  ASSERT_TRUE(rules.ok()) << rules.status().ToString();
  EXPECT_EQ(rules->max_split_size, 128 * kMiB);
  EXPECT_TRUE(rules->expandable_segments);
  EXPECT_EQ(rules->roundup_power2_divisions[3], 4u);
  auto bad = AllocatorRules::FromSettings({{"expandable_segments", "yes"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("expandable_segments"), std::string::npos);
  EXPECT_FALSE(AllocatorRules::FromSettings({{"roundup_power2_divisions", "3"}}).ok());
  EXPECT_FALSE(AllocatorRules::FromSettings({{"max_split_size_mb", "x"}}).ok());
}

}  // namespace
}  // namespace fragscope::model
