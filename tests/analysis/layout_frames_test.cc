#include "analysis/layout_frames.h"

#include <gtest/gtest.h>

#include "common/units.h"

namespace fragscope::analysis {
namespace {

constexpr std::uint64_t S = std::uint64_t{1} << 32;

Event Ev(Action action, std::uint64_t addr = 0, std::uint64_t size = 0, std::int32_t device = 0) {
  Event e;
  e.action = action;
  e.addr = addr;
  e.size = size;
  e.device = device;
  return e;
}

std::vector<DeviceFrames> Record(const std::vector<Event>& events, LayoutFramesOptions options) {
  auto recorder = LayoutRecorder::Create(TraceHeader{}, options);
  EXPECT_TRUE(recorder.ok());
  for (const Event& e : events) (*recorder)->Consume(e);
  return (*recorder)->Finish();
}

// Issue 29, item 7: the map's moments are all inside the recorded history. A snapshot's start
// state is rebuilt one event at a time; the moments between two of those events never existed
// (docs/snapshots.md), so no periodic or peak frame is taken among them.
TEST(LayoutRecorderTest, NoFrameInsideARebuiltStartState) {
  LayoutFramesOptions options;
  options.first_period = 2;
  auto recorder = LayoutRecorder::Create(TraceHeader{}, options);
  ASSERT_TRUE(recorder.ok());
  const std::vector<Event> start = {
      Ev(Action::kSegmentAlloc, S, 20 * kMiB),              // 0
      Ev(Action::kAlloc, S, 4 * kMiB),                      // 1
      Ev(Action::kAlloc, S + 4 * kMiB, 8 * kMiB),           // 2
      Ev(Action::kSegmentAlloc, S + 64 * kMiB, 20 * kMiB),  // 3
  };
  const std::vector<Event> history = {
      Ev(Action::kAlloc, S + 64 * kMiB, 2 * kMiB),  // 4
      Ev(Action::kFreeCompleted, S),                // 5
      Ev(Action::kFreeCompleted, S + 64 * kMiB),    // 6
  };
  for (const Event& e : start) (*recorder)->Consume(e, /*start_state=*/true);
  for (const Event& e : history) (*recorder)->Consume(e);
  const std::vector<DeviceFrames> frames = (*recorder)->Finish();
  ASSERT_EQ(frames.size(), 1u);
  ASSERT_FALSE(frames[0].frames.empty());
  for (const LayoutFrame& f : frames[0].frames) {
    // The layout after events [0, event_index): the history starts after the 4 rebuild events.
    EXPECT_GE(f.event_index, 4u) << FrameReasonName(f.reason);
    std::uint64_t reserved = 0;
    for (const LayoutSegment& seg : f.segments) reserved += seg.size;
    EXPECT_EQ(reserved, 40 * kMiB) << "frame at " << f.event_index;  // both segments, always
  }
  EXPECT_EQ(frames[0].frames.back().reason, FrameReason::kEnd);
}

TEST(LayoutRecorderTest, KeepsPeriodicOomAndEndFramesInOrder) {
  LayoutFramesOptions options;
  options.first_period = 2;
  options.stranded_threshold = 3 * kMiB;
  const std::vector<Event> events = {
      Ev(Action::kSegmentAlloc, S, 20 * kMiB),      // 0
      Ev(Action::kAlloc, S, 4 * kMiB),              // 1 -> periodic frame at 2
      Ev(Action::kAlloc, S + 4 * kMiB, 14 * kMiB),  // 2
      Ev(Action::kOom, 0, 30 * kMiB),               // 3: before-oom frame at 3
      Ev(Action::kFreeCompleted, S),                // 4 -> periodic at 4
  };
  const std::vector<DeviceFrames> frames = Record(events, options);
  ASSERT_EQ(frames.size(), 1u);
  const std::vector<LayoutFrame>& f = frames[0].frames;
  ASSERT_EQ(f.size(), 5u);
  EXPECT_EQ(f[0].event_index, 2u);
  EXPECT_EQ(f[0].reason, FrameReason::kPeriodic);
  ASSERT_EQ(f[0].segments.size(), 1u);
  ASSERT_EQ(f[0].segments[0].blocks.size(), 2u);  // 4 MiB allocated, 16 MiB free
  EXPECT_EQ(f[0].segments[0].blocks[0].state, model::BlockState::kAllocated);
  EXPECT_EQ(f[1].event_index, 3u);
  EXPECT_EQ(f[1].reason, FrameReason::kBeforeOom);
  ASSERT_EQ(f[1].segments[0].blocks.size(), 3u);     // 4 + 14 allocated, 2 MiB free
  EXPECT_TRUE(f[1].segments[0].blocks[2].stranded);  // 2 MiB free < 3 MiB threshold
  EXPECT_EQ(f[1].blocks, 3u);
  // The high-water mark of allocated bytes: 18 MiB after event 2.
  EXPECT_EQ(f[2].reason, FrameReason::kPeak);
  EXPECT_EQ(f[2].event_index, 3u);
  ASSERT_EQ(f[2].segments[0].blocks.size(), 3u);
  EXPECT_EQ(f[3].event_index, 4u);
  EXPECT_EQ(f[4].reason, FrameReason::kEnd);
  EXPECT_EQ(f[4].event_index, 5u);
  EXPECT_EQ(f[4].segments[0].blocks[0].state, model::BlockState::kFree);
}

TEST(LayoutRecorderTest, PeriodicFramesStayBoundedAndSpreadOverTheRun) {
  LayoutFramesOptions options;
  options.first_period = 1;
  options.max_frames = 8;
  std::vector<Event> events = {Ev(Action::kSegmentAlloc, S, 2 * kMiB)};
  for (int i = 0; i < 5000; ++i) {
    events.push_back(Ev(Action::kAlloc, S, 1 * kMiB));
    events.push_back(Ev(Action::kFreeCompleted, S));
  }
  const std::vector<DeviceFrames> frames = Record(events, options);
  ASSERT_EQ(frames.size(), 1u);
  std::size_t periodic = 0;
  std::uint64_t last = 0, last_periodic = 0;
  for (const LayoutFrame& f : frames[0].frames) {
    EXPECT_GE(f.event_index, last);
    last = f.event_index;
    if (f.reason == FrameReason::kPeriodic) {
      ++periodic;
      last_periodic = f.event_index;
    }
  }
  EXPECT_LE(periodic, 8u);
  EXPECT_GE(periodic, 4u);
  EXPECT_GT(last_periodic, events.size() / 2);
  EXPECT_EQ(frames[0].frames.back().reason, FrameReason::kEnd);
}

TEST(LayoutRecorderTest, BlockBudgetThinsPeriodicFramesButKeepsOomFrames) {
  LayoutFramesOptions options;
  options.first_period = 1;
  options.max_frames = 1000;
  options.max_blocks = 40;  // each frame holds 2 or 3 blocks
  std::vector<Event> events = {Ev(Action::kSegmentAlloc, S, 4 * kMiB)};
  for (int i = 0; i < 200; ++i) {
    events.push_back(Ev(Action::kAlloc, S, 1 * kMiB));
    if (i % 50 == 0) events.push_back(Ev(Action::kOom, 0, 8 * kMiB));
    events.push_back(Ev(Action::kFreeCompleted, S));
  }
  const std::vector<DeviceFrames> frames = Record(events, options);
  std::uint64_t blocks = 0;
  std::size_t ooms = 0;
  for (const LayoutFrame& f : frames[0].frames) {
    if (f.reason == FrameReason::kPeriodic) blocks += f.blocks;
    ooms += f.reason == FrameReason::kBeforeOom;
  }
  EXPECT_EQ(ooms, 4u);
  EXPECT_LE(blocks, 40u);
}

TEST(LayoutRecorderTest, OnlyTheChosenDeviceAndBlocksKeepTheirCallSite) {
  LayoutFramesOptions options;
  options.device = 1;
  Event a = Ev(Action::kAlloc, S, 1 * kMiB, 1);
  a.frame = 7;
  const std::vector<DeviceFrames> frames = Record(
      {Ev(Action::kSegmentAlloc, S, 2 * kMiB, 0), Ev(Action::kSegmentAlloc, S, 2 * kMiB, 1), a},
      options);
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_EQ(frames[0].device, 1);
  EXPECT_EQ(frames[0].frames.back().segments[0].blocks[0].frame, 7);
}

TEST(LayoutRecorderTest, ARejectedEventStopsThatDevice) {
  const std::vector<DeviceFrames> frames =
      Record({Ev(Action::kSegmentAlloc, S, 2 * kMiB), Ev(Action::kFreeCompleted, S + 99)}, {});
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_TRUE(frames[0].stopped);
}

}  // namespace
}  // namespace fragscope::analysis
