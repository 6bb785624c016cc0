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
  for (const Event& e : events) EXPECT_TRUE((*recorder)->Consume(e).ok());
  Result<std::vector<DeviceFrames>> frames = (*recorder)->Finish();
  EXPECT_TRUE(frames.ok()) << frames.status().message();
  return frames.ok() ? std::move(*frames) : std::vector<DeviceFrames>{};
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
  for (const Event& e : start) ASSERT_TRUE((*recorder)->Consume(e, /*start_state=*/true).ok());
  for (const Event& e : history) ASSERT_TRUE((*recorder)->Consume(e).ok());
  Result<std::vector<DeviceFrames>> finished = (*recorder)->Finish();
  ASSERT_TRUE(finished.ok());
  const std::vector<DeviceFrames>& frames = *finished;
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
  EXPECT_EQ(f[2].event_index, 4u);
  EXPECT_EQ(f[2].reason, FrameReason::kPeriodic);
  // The high-water mark of allocated bytes, 18 MiB from event 2 on, taken at the top of the
  // rise: the state before the first free (event 4).
  EXPECT_EQ(f[3].reason, FrameReason::kPeak);
  EXPECT_EQ(f[3].event_index, 4u);
  ASSERT_EQ(f[3].segments[0].blocks.size(), 3u);
  EXPECT_EQ(f[4].reason, FrameReason::kEnd);
  EXPECT_EQ(f[4].event_index, 5u);
  EXPECT_EQ(f[4].segments[0].blocks[0].state, model::BlockState::kFree);
}

// Issue 34: the peak map is the top of a rise, taken once, not at every 1% of the way up (a
// snapshot whose allocated bytes rise 300-fold over millions of blocks took hundreds of maps).
TEST(LayoutRecorderTest, ThePeakMapIsTheTopOfTheRise) {
  LayoutFramesOptions options;
  options.first_period = 1'000'000;  // no periodic maps
  std::vector<Event> events = {Ev(Action::kSegmentAlloc, S, 2048 * kMiB)};
  for (std::uint64_t i = 0; i < 1000; ++i)
    events.push_back(Ev(Action::kAlloc, S + i * 2 * kMiB, 2 * kMiB));
  const std::size_t first_free = events.size();
  for (std::uint64_t i = 0; i < 1000; ++i)
    events.push_back(Ev(Action::kFreeCompleted, S + i * 2 * kMiB));
  const std::vector<DeviceFrames> frames = Record(events, options);
  ASSERT_EQ(frames.size(), 1u);
  const LayoutFrame* peak = nullptr;
  for (const LayoutFrame& f : frames[0].frames) {
    if (f.reason == FrameReason::kPeak) peak = &f;
  }
  ASSERT_NE(peak, nullptr);
  EXPECT_EQ(peak->event_index, first_free);
  EXPECT_EQ(peak->blocks, 1001u);  // every allocation, and the segment's free tail
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
    blocks += f.blocks;  // every kept map counts: before each OOM, at the peak, at the end
    ooms += f.reason == FrameReason::kBeforeOom;
  }
  EXPECT_EQ(ooms, 4u);
  EXPECT_LE(blocks, 40u);
}

// Issue 30 item 7: the maps kept before each OOM and at each peak, on every device, count
// against the budget too; when they alone outgrow it, the recording is refused at once (not
// after the whole input) naming the flag, and nothing is kept.
TEST(LayoutRecorderTest, MapsBeforeOomsOnManyDevicesAreRefusedAtTheBudget) {
  LayoutFramesOptions options;
  options.max_blocks = 1000;
  auto recorder = LayoutRecorder::Create(TraceHeader{}, options);
  ASSERT_TRUE(recorder.ok());
  constexpr int kDevices = 64, kBlocks = 50;  // 50 blocks a map: 16 OOMs of 64 devices = 51,200
  std::size_t consumed = 0;
  Status refused;
  for (int d = 0; d < kDevices && refused.ok(); ++d) {
    std::vector<Event> events = {Ev(Action::kSegmentAlloc, S, kBlocks * 2 * kMiB, d)};
    for (int b = 0; b < kBlocks; ++b) {
      events.push_back(Ev(Action::kAlloc, S + b * 2 * kMiB, 2 * kMiB, d));
    }
    for (int i = 0; i < 16; ++i) events.push_back(Ev(Action::kOom, 0, 256 * kMiB, d));
    for (const Event& e : events) {
      if (!refused.ok()) continue;
      refused = (*recorder)->Consume(e);
      consumed += refused.ok();
    }
  }
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.code(), StatusCode::kLimitExceeded);
  EXPECT_NE(refused.message().find("more than --max-map-blocks 1000"), std::string::npos)
      << refused.message();
  EXPECT_NE(refused.message().find("--device N"), std::string::npos) << refused.message();
  // Refused at the second device: 50 blocks a map, its peak and 16 OOMs make 17 maps each.
  EXPECT_LT(consumed, 2u * (kBlocks + 17));
  EXPECT_FALSE((*recorder)->Consume(Ev(Action::kAlloc, S, kMiB, 0)).ok());
  EXPECT_FALSE((*recorder)->Finish().ok());
}

TEST(LayoutRecorderTest, EveryKeptMapOfEveryDeviceFitsTheBudget) {
  LayoutFramesOptions options;
  options.first_period = 1;
  options.max_blocks = 300;
  std::vector<Event> events;
  for (int d = 0; d < 8; ++d) events.push_back(Ev(Action::kSegmentAlloc, S, 64 * kMiB, d));
  for (int i = 0; i < 10; ++i) {
    for (int d = 0; d < 8; ++d) {
      events.push_back(Ev(Action::kAlloc, S + i * 2 * kMiB, 2 * kMiB, d));
    }
  }
  for (int d = 0; d < 8; ++d) events.push_back(Ev(Action::kOom, 0, 128 * kMiB, d));
  const std::vector<DeviceFrames> frames = Record(events, options);
  ASSERT_EQ(frames.size(), 8u);
  std::uint64_t blocks = 0;
  std::size_t ooms = 0;
  for (const DeviceFrames& d : frames) {
    for (const LayoutFrame& f : d.frames) {
      blocks += f.blocks;
      ooms += f.reason == FrameReason::kBeforeOom;
    }
  }
  EXPECT_EQ(ooms, 8u);
  EXPECT_LE(blocks, 300u);
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

// Issue 33 item 1: each allocation a kept map shows is described once (when it was made and
// freed, stream, call site, stack), and every change of a call site's live bytes is logged
// with the index of the event that made it.
TEST(LayoutRecorderTest, AllocationsAndSiteBytesFollowEveryEvent) {
  auto alloc = [](std::uint64_t addr, std::uint64_t size, std::int32_t site, std::int32_t stack,
                  std::int64_t time_us) {
    Event e = Ev(Action::kAlloc, addr, size);
    e.frame = site;
    e.stack = stack;
    e.stream = 7;
    e.time_us = time_us;
    return e;
  };
  std::vector<Event> events = {
      Ev(Action::kSegmentAlloc, S, 20 * kMiB),    // 0
      alloc(S, 4 * kMiB, 3, 11, 100),             // 1
      alloc(S + 4 * kMiB, 8 * kMiB, 5, 12, 110),  // 2
      Ev(Action::kFreeRequested, S, 4 * kMiB),    // 3
      Ev(Action::kFreeCompleted, S, 4 * kMiB),    // 4
  };
  events[3].time_us = 120;
  LayoutFramesOptions options;
  options.first_period = 1000;  // no periodic frame: the peak (after event 2) and the end
  const std::vector<DeviceFrames> frames = Record(events, options);
  ASSERT_EQ(frames.size(), 1u);
  const DeviceFrames& d = frames[0];

  // The site log: +4 MiB for site 3 at event 1, +8 MiB for site 5 at event 2, -4 MiB for site
  // 3 when the block left the allocated bytes.
  ASSERT_EQ(d.site_changes.size(), 3u);
  EXPECT_EQ(d.site_changes[0].event, 1u);
  EXPECT_EQ(d.site_changes[0].site, 3);
  EXPECT_EQ(d.site_changes[0].delta_bytes, static_cast<std::int64_t>(4 * kMiB));
  EXPECT_EQ(d.site_changes[1].event, 2u);
  EXPECT_EQ(d.site_changes[1].site, 5);
  EXPECT_EQ(d.site_changes[2].site, 3);
  EXPECT_EQ(d.site_changes[2].delta_bytes, -static_cast<std::int64_t>(4 * kMiB));
  EXPECT_GE(d.site_changes[2].event, 3u);

  // The peak map holds both allocations; the first is freed at event 3 (its free request).
  const LayoutFrame* peak = nullptr;
  for (const LayoutFrame& f : d.frames) {
    if (f.reason == FrameReason::kPeak) peak = &f;
  }
  ASSERT_NE(peak, nullptr);
  std::vector<std::int32_t> shown;
  for (const LayoutSegment& seg : peak->segments) {
    for (const LayoutBlock& b : seg.blocks) {
      if (b.state == model::BlockState::kFree) {
        EXPECT_EQ(b.allocation, -1);
      } else {
        shown.push_back(b.allocation);
      }
    }
  }
  ASSERT_EQ(shown.size(), 2u);
  ASSERT_EQ(d.allocations.size(), 2u);
  const LayoutAllocation& first = d.allocations[static_cast<std::size_t>(shown[0])];
  const LayoutAllocation& second = d.allocations[static_cast<std::size_t>(shown[1])];
  EXPECT_EQ(first.alloc_event, 1);
  EXPECT_EQ(first.alloc_time_us, 100);
  EXPECT_EQ(first.free_event, 3);
  EXPECT_EQ(first.free_time_us, 120);
  EXPECT_EQ(first.site, 3);
  EXPECT_EQ(first.stack, 11);
  EXPECT_EQ(first.stream, 7u);
  EXPECT_EQ(second.alloc_event, 2);
  EXPECT_EQ(second.free_event, -1);  // live at the end
  EXPECT_EQ(second.stack, 12);
}

}  // namespace
}  // namespace fragscope::analysis
