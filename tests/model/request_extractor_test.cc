#include "model/request_extractor.h"

#include <vector>

#include <gtest/gtest.h>

namespace fragscope::model {
namespace {

Event Make(Action a, std::uint64_t addr = 0, std::uint64_t size = 0) {
  Event e;
  e.action = a;
  e.addr = addr;
  e.size = size;
  return e;
}

std::vector<Event> Extract(RequestExtractor& x, const std::vector<Event>& in) {
  std::vector<Event> out;
  for (const Event& e : in) {
    Event o;
    if (x.Convert(e, &o)) out.push_back(o);
  }
  return out;
}

TEST(RequestExtractorTest, KeepsWhatTheProgramAskedFor) {
  RequestExtractor x;
  const auto out =
      Extract(x, {Make(Action::kSegmentAlloc, 0x1000, 20 << 20), Make(Action::kAlloc, 0x1000, 100),
                  Make(Action::kBlock, 0x2000, 300), Make(Action::kFreeRequested, 0x1000, 100),
                  Make(Action::kFreeCompleted, 0x1000, 100),
                  Make(Action::kFreeCompleted, 0x2000, 300),  // no free_requested
                  Make(Action::kSegmentFree, 0x1000, 20 << 20), Make(Action::kSnapshot)});
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0].action, Action::kAlloc);
  EXPECT_EQ(out[1].action, Action::kAlloc);  // the block live at the start
  EXPECT_EQ(out[1].block_size, 0u);
  EXPECT_EQ(out[2].action, Action::kFreeRequested);
  EXPECT_EQ(out[3].action, Action::kFreeRequested);
  EXPECT_EQ(out[3].addr, 0x2000u);
}

TEST(RequestExtractorTest, AnOomBecomesAnAllocWithAFreshId) {
  RequestExtractor x;
  const auto out = Extract(x, {Make(Action::kOom, 0, 5000), Make(Action::kOom, 0, 6000)});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].action, Action::kAlloc);
  EXPECT_EQ(out[0].size, 5000u);
  EXPECT_EQ(out[0].addr, RequestExtractor::kOomIdBase);
  EXPECT_EQ(out[1].addr, RequestExtractor::kOomIdBase - 1);
  EXPECT_FALSE(out[0].device_free.has_value());
}

TEST(RequestExtractorTest, ARunOfSegmentFreesIsOneEmptyCacheWhenAsked) {
  const std::vector<Event> in = {
      Make(Action::kSegmentFree, 0x1000), Make(Action::kSegmentFree, 0x9000),
      Make(Action::kAlloc, 0x1000, 1), Make(Action::kSegmentFree, 0x1000)};
  RequestExtractor plain;
  EXPECT_EQ(Extract(plain, in).size(), 1u);
  RequestExtractor inferring(true);
  const auto out = Extract(inferring, in);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].action, Action::kEmptyCache);
  EXPECT_EQ(out[1].action, Action::kAlloc);
  EXPECT_EQ(out[2].action, Action::kEmptyCache);
  EXPECT_EQ(inferring.inferred_empty_caches(), 2u);
}

}  // namespace
}  // namespace fragscope::model
