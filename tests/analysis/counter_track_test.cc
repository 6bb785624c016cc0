#include "analysis/counter_track.h"

#include <vector>

#include <gtest/gtest.h>

#include "common/units.h"

namespace fragscope::analysis {
namespace {

constexpr std::uint64_t MiB = kMiB;

Event Make(Action a, std::uint64_t addr, std::uint64_t size, std::int64_t time_us = -1) {
  Event e;
  e.action = a;
  e.addr = addr;
  e.size = size;
  e.time_us = time_us;
  return e;
}

TEST(CounterTrackTest, SamplesWhenTheCountersChangeAndMarksSegments) {
  std::vector<CounterSample> samples;
  std::vector<Marker> markers;
  CounterTrack track(
      model::AllocatorRules{},
      [&](const CounterSample& s) {
        samples.push_back(s);
        return Status::Ok();
      },
      [&](const Marker& m) {
        markers.push_back(m);
        return Status::Ok();
      });
  const std::uint64_t s = 0x7f0000000000;
  // Untimed start, then timed events 1,000,000 us apart from 5,000,000.
  ASSERT_TRUE(track.Consume(Make(Action::kSegmentAlloc, s, 20 * MiB)).ok());
  ASSERT_TRUE(track.Consume(Make(Action::kAlloc, s, 4 * MiB, 5'000'000)).ok());
  ASSERT_TRUE(track.Consume(Make(Action::kSnapshot, 0, 0, 5'500'000)).ok());  // no change
  ASSERT_TRUE(track.Consume(Make(Action::kFreeRequested, s, 4 * MiB, 6'000'000)).ok());
  ASSERT_TRUE(track.Consume(Make(Action::kFreeCompleted, s, 4 * MiB, 6'000'000)).ok());
  ASSERT_EQ(samples.size(), 4u);  // free_requested: allocated drops (pending is not allocated)
  EXPECT_EQ(samples[0].ts_us, 0);
  EXPECT_EQ(samples[0].reserved, 20 * MiB);
  EXPECT_EQ(samples[0].allocated, 0u);
  EXPECT_DOUBLE_EQ(samples[0].fragmentation_ratio, 1.0);
  EXPECT_EQ(samples[1].ts_us, 0);  // the first timed event continues from the untimed ones
  EXPECT_EQ(samples[1].allocated, 4 * MiB);
  EXPECT_EQ(samples[1].largest_free_block, 16 * MiB);
  EXPECT_DOUBLE_EQ(samples[1].fragmentation_ratio, 0.8);
  EXPECT_EQ(samples[2].ts_us, 1'000'000);
  EXPECT_EQ(samples[2].allocated, 0u);
  EXPECT_EQ(samples[2].largest_free_block, 16 * MiB);  // the block waits, not yet free
  EXPECT_EQ(samples[3].largest_free_block, 20 * MiB);
  ASSERT_EQ(markers.size(), 2u);
  EXPECT_EQ(markers[0].event.action, Action::kSegmentAlloc);
  EXPECT_EQ(markers[1].event.action, Action::kSnapshot);
  EXPECT_EQ(markers[1].ts_us, 500'000);
}

TEST(CounterTrackTest, UntimedTracesUseTheEventIndex) {
  std::vector<CounterSample> samples;
  CounterTrack track(model::AllocatorRules{},
                     [&](const CounterSample& s) {
                       samples.push_back(s);
                       return Status::Ok();
                     },
                     {});
  ASSERT_TRUE(track.Consume(Make(Action::kSegmentAlloc, 0x1000000, 2 * MiB)).ok());
  ASSERT_TRUE(track.Consume(Make(Action::kAlloc, 0x1000000, 512)).ok());
  ASSERT_EQ(samples.size(), 2u);
  EXPECT_EQ(samples[1].ts_us, 1);
  EXPECT_FALSE(track.Consume(Make(Action::kFreeRequested, 0x5, 1)).ok());  // model errors pass up
}

}  // namespace
}  // namespace fragscope::analysis
