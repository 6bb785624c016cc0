#include "analysis/size_profile.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "analysis/timeline.h"

namespace fragscope::analysis {
namespace {

TEST(SizeProfileTest, ExactQuantilesAndTopSizes) {
  SizeProfile p;
  for (std::uint64_t s : {100, 200, 200, 300, 300, 300, 4000, 4000, 4000, 4000}) p.Add(s);
  EXPECT_EQ(p.count(), 10u);
  EXPECT_EQ(p.bytes(), 100 + 400 + 900 + 16000u);
  EXPECT_EQ(p.min(), 100u);
  EXPECT_EQ(p.max(), 4000u);
  EXPECT_EQ(p.Quantile(0.0), 100u);
  EXPECT_EQ(p.Quantile(0.5), 300u);  // rank ceil(5) - 1 = 4 -> the 5th smallest
  EXPECT_EQ(p.Quantile(0.6), 300u);
  EXPECT_EQ(p.Quantile(0.61), 4000u);
  EXPECT_EQ(p.Quantile(1.0), 4000u);
  auto top = p.TopSizes(2);
  ASSERT_EQ(top.size(), 2u);
  EXPECT_EQ(top[0].size, 4000u);
  EXPECT_EQ(top[0].count, 4u);
  EXPECT_EQ(top[1].size, 300u);
  EXPECT_EQ(p.histogram().count[6], 1u);   // 100 in [64, 128)
  EXPECT_EQ(p.histogram().count[11], 4u);  // 4000 in [2048, 4096)
}

// Many distinct sizes (the exact table grows many times, multiples of 512 among them) against
// a brute-force count; then the distinct-size cap turns the quantiles to size-class floors.
TEST(SizeProfileTest, ManyDistinctSizesMatchABruteForceCount) {
  SizeProfile p;
  std::map<std::uint64_t, std::uint64_t> counts;
  std::vector<std::uint64_t> all;
  std::mt19937_64 rng(11);
  for (int i = 0; i < 400000; ++i) {
    const std::uint64_t s = rng() % 3 == 0 ? 512 * (1 + rng() % 5000) : 1 + rng() % 200000;
    if (i % 4 == 0) p.Prefetch(s);
    p.Add(s);
    ++counts[s];
    all.push_back(s);
  }
  ASSERT_TRUE(p.exact());
  EXPECT_EQ(p.distinct_sizes(), counts.size());
  std::sort(all.begin(), all.end());
  for (const double q : {0.0, 0.1, 0.5, 0.9, 0.99, 1.0}) {
    const auto rank = static_cast<std::size_t>(std::max(0.0, std::ceil(q * all.size()) - 1));
    EXPECT_EQ(p.Quantile(q), all[rank]) << q;
  }
  std::vector<SizeCount> expected;
  for (const auto& [size, count] : counts) expected.push_back({size, count});
  std::sort(expected.begin(), expected.end(), [](const SizeCount& a, const SizeCount& b) {
    return a.count != b.count ? a.count > b.count : a.size > b.size;
  });
  const std::vector<SizeCount> top = p.TopSizes(25);
  ASSERT_EQ(top.size(), 25u);
  for (std::size_t i = 0; i < top.size(); ++i) {
    EXPECT_EQ(top[i].size, expected[i].size) << i;
    EXPECT_EQ(top[i].count, expected[i].count) << i;
  }

  SizeProfile capped;
  for (std::uint64_t s = 1; s <= SizeProfile::kMaxDistinctSizes; ++s) capped.Add(s);
  EXPECT_TRUE(capped.exact());
  EXPECT_EQ(capped.Quantile(1.0), SizeProfile::kMaxDistinctSizes);
  capped.Add(SizeProfile::kMaxDistinctSizes + 1);
  EXPECT_FALSE(capped.exact());
  EXPECT_EQ(capped.distinct_sizes(), SizeProfile::kMaxDistinctSizes);
  EXPECT_EQ(capped.count(), SizeProfile::kMaxDistinctSizes + 1);
  EXPECT_LE(capped.Quantile(1.0), SizeProfile::kMaxDistinctSizes + 1);

  // The one size the exact table cannot hold (it marks free slots) also ends exactness.
  SizeProfile huge;
  huge.Add(512);
  huge.Add(~std::uint64_t{0});
  EXPECT_FALSE(huge.exact());
  EXPECT_EQ(huge.count(), 2u);
  EXPECT_EQ(huge.distinct_sizes(), 1u);
}

TEST(RequestWindowTest, ForgetsOldRequests) {
  RequestWindow w(4);
  EXPECT_EQ(w.Quantile(0.5), 0u);
  for (std::uint64_t s : {1024, 1024, 1024, 1024}) w.Add(s);
  EXPECT_EQ(w.Quantile(0.5), 1024u);
  for (std::uint64_t s : {1 << 20, 1 << 20, 1 << 20}) w.Add(s);
  EXPECT_EQ(w.size(), 4u);
  EXPECT_EQ(w.Quantile(0.5), 1u << 20);  // three of the four are 1 MiB now
  EXPECT_EQ(w.Quantile(0.25), 1024u);
}

TEST(RequestWindowTest, QuantileIsTheClassFloorOfTheExactQuantile) {
  std::mt19937_64 rng(5);
  RequestWindow w(1000);
  std::vector<std::uint64_t> all;
  for (int i = 0; i < 5000; ++i) {
    const std::uint64_t s = 1 + rng() % (64 << 20);
    w.Add(s);
    all.push_back(s);
  }
  std::vector<std::uint64_t> last(all.end() - 1000, all.end());
  std::sort(last.begin(), last.end());
  for (double q : {0.1, 0.5, 0.9, 0.99}) {
    const std::uint64_t exact = last[static_cast<std::size_t>(std::ceil(q * 1000)) - 1];
    EXPECT_EQ(w.Quantile(q), model::ClassFloor(model::SizeClass(exact))) << q;
  }
}

TEST(TimelineTest, DownsamplesPairwiseAndKeepsPeaks) {
  Timeline t(4);
  for (int i = 0; i < 10; ++i) {
    TimelineSample s;
    s.step_first = s.step_last = i;
    s.first_event = static_cast<std::uint64_t>(i) * 10;
    s.end_event = s.first_event + 10;
    s.peak_reserved_bytes = i == 3 ? 999 : static_cast<std::uint64_t>(i);
    s.reserved_bytes = static_cast<std::uint64_t>(i);
    s.allocs = 1;
    t.Add(s);
  }
  const auto samples = t.Samples();
  ASSERT_GE(samples.size(), 2u);
  EXPECT_LE(samples.size(), 4u);
  EXPECT_EQ(samples.front().step_first, 0);
  EXPECT_EQ(samples.back().step_last, 9);
  std::uint64_t allocs = 0, peak = 0;
  for (std::size_t i = 0; i < samples.size(); ++i) {
    allocs += samples[i].allocs;
    peak = std::max(peak, samples[i].peak_reserved_bytes);
    if (i > 0) {
      EXPECT_EQ(samples[i].step_first, samples[i - 1].step_last + 1);
    }
  }
  EXPECT_EQ(allocs, 10u);                        // every window is counted exactly once
  EXPECT_EQ(peak, 999u);                         // a peak survives merging
  EXPECT_EQ(samples.back().reserved_bytes, 9u);  // state is the end of the window
}

}  // namespace
}  // namespace fragscope::analysis
