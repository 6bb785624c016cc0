#include "common/did_you_mean.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace fragscope {
namespace {

TEST(EditDistanceTest, CountsEditsAndAdjacentSwaps) {
  EXPECT_EQ(EditDistance("", ""), 0u);
  EXPECT_EQ(EditDistance("analyze", "analyze"), 0u);
  EXPECT_EQ(EditDistance("anlyze", "analyze"), 1u);   // deletion
  EXPECT_EQ(EditDistance("analyse", "analyze"), 1u);  // substitution
  EXPECT_EQ(EditDistance("anaylze", "analyze"), 1u);  // swap
  EXPECT_EQ(EditDistance("Replay", "replay"), 0u);    // case
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3u);
  EXPECT_EQ(EditDistance("abc", ""), 3u);
}

TEST(ClosestMatchTest, SuggestsOnlyPlausibleTypos) {
  const std::vector<std::string> commands = {"analyze", "replay", "tune",  "convert", "gpus",
                                             "history", "check",  "serve", "explain", "alerts"};
  EXPECT_EQ(ClosestMatch("anlyze", commands), "analyze");
  EXPECT_EQ(ClosestMatch("replya", commands), "replay");
  EXPECT_EQ(ClosestMatch("expalin", commands), "explain");
  EXPECT_EQ(ClosestMatch("tuen", commands), "tune");
  EXPECT_EQ(ClosestMatch("frobnicate", commands), std::nullopt);
  EXPECT_EQ(ClosestMatch("x", commands), std::nullopt);
  const std::vector<std::string> flags = {"--capacity", "--used-by-others", "--alloc-conf",
                                          "--json", "--continue-after-oom"};
  EXPECT_EQ(ClosestMatch("--capacty", flags), "--capacity");
  EXPECT_EQ(ClosestMatch("--jsn", flags), "--json");
  EXPECT_EQ(ClosestMatch("--alloc_conf", flags), "--alloc-conf");
  EXPECT_EQ(ClosestMatch("--continue", flags), "--continue-after-oom");  // a unique prefix
  EXPECT_EQ(DidYouMean("--capacty", flags), " (did you mean '--capacity'?)");
  EXPECT_EQ(DidYouMean("--zzzzzzzz", flags), "");
}

}  // namespace
}  // namespace fragscope
