#include <gtest/gtest.h>

#include "sources/snapshot/snapshot.h"
#include "sources/snapshot_test_util.h"

namespace fragscope::sources {
namespace {

using testing::DocBuilder;

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

TEST(SnapshotDecoderTest, DecodesSegmentsBlocksAndTraces) {
  DocBuilder b;
  const Value frames = b.List({b.Frame("/home/u/train.py", 42, "forward"),
                               b.Frame("/usr/lib/python3/torch/nn/linear.py", 7, "linear")});
  const std::uint64_t base = 0x7f0000000000;
  b.Snapshot({b.Segment(0, base, 20 * kMiB,
                        {b.Block(base, 4 * kMiB, 4 * kMiB - 100, "active_allocated", frames),
                         b.Block(base + 4 * kMiB, 16 * kMiB, 1, "inactive")})},
             {{b.Entry("segment_alloc", base, 20 * kMiB),
               b.Entry("alloc", base, 4 * kMiB - 100, frames)}});
  auto s = DecodeSnapshot(b.doc());
  ASSERT_TRUE(s.ok()) << s.status().message();
  ASSERT_EQ(s->segments.size(), 1u);
  EXPECT_EQ(s->segments[0].addr, base);
  EXPECT_EQ(s->segments[0].total_size, 20 * kMiB);
  EXPECT_EQ(s->segments[0].pool, Pool::kLarge);
  ASSERT_EQ(s->blocks.size(), 2u);
  EXPECT_EQ(s->blocks[0].state, model::BlockState::kAllocated);
  EXPECT_EQ(s->blocks[0].requested, 4 * kMiB - 100);
  EXPECT_EQ(s->blocks[1].state, model::BlockState::kFree);
  EXPECT_EQ(s->blocks[1].addr, base + 4 * kMiB);
  ASSERT_EQ(s->device_traces.size(), 1u);
  ASSERT_EQ(s->device_traces[0].size(), 2u);
  EXPECT_EQ(s->device_traces[0][1].action, Action::kAlloc);
  EXPECT_EQ(s->device_traces[0][1].size, 4 * kMiB - 100);
  // The block's frames and the entry's frames are the same list object: one stack, two frames.
  EXPECT_EQ(s->stacks.size(), 1u);
  EXPECT_EQ(s->frames.size(), 2u);
  EXPECT_EQ(s->blocks[0].stack, s->device_traces[0][1].stack);
  // The call site skips torch's own frames... the user's frame is innermost here anyway.
  const CallSite site = SnapshotCallSite(*s, s->blocks[0].stack);
  ASSERT_GE(site.frame, 0);
  EXPECT_EQ(s->frames[static_cast<std::size_t>(site.frame)].filename, "/home/u/train.py");
  EXPECT_TRUE(s->warnings.empty());
}

TEST(SnapshotDecoderTest, CallSiteSkipsTorchInternals) {
  DocBuilder b;
  const Value frames = b.List({b.Frame("CUDACachingAllocator.cpp", 0, "malloc"),
                               b.Frame("/x/site-packages/torch/nn/functional.py", 9, "gelu"),
                               b.Frame("/home/u/model.py", 3, "block")});
  b.Snapshot(
      {b.Segment(0, 0x1000000, 2 * kMiB,
                 {b.Block(0x1000000, 2 * kMiB, 2 * kMiB, "active_allocated", frames)}, "small")},
      {});
  auto s = DecodeSnapshot(b.doc());
  ASSERT_TRUE(s.ok()) << s.status().message();
  const CallSite site = SnapshotCallSite(*s, s->blocks[0].stack);
  ASSERT_GE(site.frame, 0);
  EXPECT_EQ(s->frames[static_cast<std::size_t>(site.frame)].name, "block");
  EXPECT_EQ(s->segments[0].pool, Pool::kSmall);
}

TEST(SnapshotDecoderTest, BareSegmentListAndEmptySnapshot) {
  DocBuilder b;
  b.doc().set_root(b.List(
      {b.Segment(0, 0x2000000, 2 * kMiB, {b.Block(0x2000000, 2 * kMiB, 0, "inactive")}, "small")}));
  auto s = DecodeSnapshot(b.doc());
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->layout, SnapshotLayout::kSegmentList);
  EXPECT_EQ(s->segments.size(), 1u);
  EXPECT_TRUE(s->device_traces.empty());

  DocBuilder e;
  e.Snapshot({}, {{}, {}, {}});
  auto empty = DecodeSnapshot(e.doc());
  ASSERT_TRUE(empty.ok()) << empty.status().message();
  EXPECT_TRUE(empty->segments.empty());
  EXPECT_EQ(empty->device_traces.size(), 3u);
  EXPECT_EQ(empty->trace_entries, 0u);
}

TEST(SnapshotDecoderTest, G0BlocksWithHistoryAndNoAddress) {
  // 2.0: no block address (running sum), requested size and frames from history[0].
  DocBuilder b;
  const Value frame_list = b.List({b.Frame("/a/gen.py", 5, "step")});
  const Value block0 = b.Dict({{"size", b.U(6 * kMiB)},
                               {"state", b.S("active_allocated")},
                               {"history", b.List({b.Dict({{"addr", b.U(0x5000000)},
                                                           {"real_size", b.U(5 * kMiB)},
                                                           {"frames", frame_list}})})}});
  const Value block1 = b.Dict({{"size", b.U(14 * kMiB)}, {"state", b.S("inactive")}});
  const Value seg = b.Dict({{"device", b.I(0)},
                            {"address", b.U(0x5000000)},
                            {"total_size", b.U(20 * kMiB)},
                            {"stream", b.I(0)},
                            {"blocks", b.List({block0, block1})}});
  b.doc().set_root(b.Dict({{"segments", b.List({seg})}, {"device_traces", b.List({})}}));
  auto s = DecodeSnapshot(b.doc());
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->generation, "G0");
  ASSERT_EQ(s->blocks.size(), 2u);
  EXPECT_EQ(s->blocks[0].requested, 5 * kMiB);
  EXPECT_EQ(s->blocks[1].addr, 0x5000000 + 6 * kMiB);
  EXPECT_GE(s->blocks[0].stack, 0);
}

TEST(SnapshotDecoderTest, MergedFreeAndUnknownActions) {
  DocBuilder b;
  b.Snapshot({}, {{b.Entry("alloc", 0x100, 512), b.Entry("free", 0x100, 512),
                   b.Entry("annotate", 0x100, 0), b.Entry("teleport", 0x100, 1)}});
  auto s = DecodeSnapshot(b.doc());
  ASSERT_TRUE(s.ok()) << s.status().message();
  ASSERT_EQ(s->device_traces[0].size(), 3u);  // alloc, free_requested, free_completed
  EXPECT_EQ(s->device_traces[0][1].action, Action::kFreeRequested);
  EXPECT_EQ(s->device_traces[0][2].action, Action::kFreeCompleted);
  EXPECT_EQ(s->device_traces[0][2].entry, 1u);
  EXPECT_EQ(s->ignored_entries, 2u);
  ASSERT_EQ(s->warnings.size(), 1u);  // annotate is known and silent; teleport is not
  EXPECT_NE(s->warnings[0].find("device_traces[0][3]"), std::string::npos);
  EXPECT_NE(s->warnings[0].find("teleport"), std::string::npos);
}

TEST(SnapshotDecoderTest, ErrorsNameThePath) {
  {
    DocBuilder b;
    const Value bad = b.Dict({{"size", b.S("big")}, {"state", b.S("inactive")}});
    const Value seg =
        b.Dict({{"address", b.U(0x1000)}, {"total_size", b.U(512)}, {"blocks", b.List({bad})}});
    b.doc().set_root(b.Dict({{"segments", b.List({seg})}}));
    auto s = DecodeSnapshot(b.doc());
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().message(), "segments[0].blocks[0].size: expected an int, found str");
  }
  {
    DocBuilder b;
    b.doc().set_root(b.Dict({{"device_traces", b.List({})}}));
    auto s = DecodeSnapshot(b.doc());
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.status().message().find("no \"segments\" key"), std::string::npos);
  }
  {
    DocBuilder b;
    b.doc().set_root(b.S("hello"));
    auto s = DecodeSnapshot(b.doc());
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.status().message().find("top-level object is a str"), std::string::npos);
  }
  {
    DocBuilder b;
    b.Snapshot({}, {{b.Dict({{"action", b.S("alloc")}, {"size", b.U(5)}})}});
    auto s = DecodeSnapshot(b.doc());
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().message(), "device_traces[0][0]: the required key \"addr\" is missing");
  }
  {
    DocBuilder b;
    const Value block = b.Dict({{"size", b.U(512)}, {"state", b.S("busy")}});
    const Value seg =
        b.Dict({{"address", b.U(0x1000)}, {"total_size", b.U(512)}, {"blocks", b.List({block})}});
    b.doc().set_root(b.Dict({{"segments", b.List({seg})}}));
    auto s = DecodeSnapshot(b.doc());
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.status().message().find("segments[0].blocks[0].state"), std::string::npos);
  }
}

TEST(SnapshotDecoderTest, WarnsWhenBlocksDoNotTileTheSegment) {
  DocBuilder b;
  b.Snapshot({b.Segment(0, 0x4000000, 20 * kMiB, {b.Block(0x4000000, 4 * kMiB, 1, "inactive")})},
             {});
  auto s = DecodeSnapshot(b.doc());
  ASSERT_TRUE(s.ok()) << s.status().message();
  ASSERT_EQ(s->warnings.size(), 1u);
  EXPECT_NE(s->warnings[0].find("add up to 4194304 bytes, not total_size 20971520"),
            std::string::npos);
}

TEST(SnapshotDecoderTest, AllocatorSettingsRenderedAsText) {
  DocBuilder b;
  b.Snapshot({}, {});
  const Value divisions = b.Dict({{"1", b.I(0)}, {"2", b.I(4)}});
  const Value settings = b.Dict({{"PYTORCH_CUDA_ALLOC_CONF", b.S("expandable_segments:True")},
                                 {"max_split_size", b.I(-1)},
                                 {"garbage_collection_threshold", b.doc().AddFloat(0.5)},
                                 {"expandable_segments", b.doc().AddBool(true)},
                                 {"roundup_power2_divisions", divisions}});
  b.doc().SetItem(b.doc().root(), b.S("allocator_settings"), settings);
  auto s = DecodeSnapshot(b.doc());
  ASSERT_TRUE(s.ok()) << s.status().message();
  ASSERT_TRUE(s->has_allocator_settings);
  ASSERT_EQ(s->allocator_settings.size(), 5u);
  EXPECT_EQ(s->allocator_settings[1].second, "-1");
  EXPECT_EQ(s->allocator_settings[2].second, "0.5");
  EXPECT_EQ(s->allocator_settings[3].second, "True");
  EXPECT_EQ(s->allocator_settings[4].second, "[1:0,2:4]");
  EXPECT_EQ(s->generation, "G3a");
}

// Issue 24 item 1: PyTorch never shares segments, blocks or trace entries; a file that does
// (through pickle memo references) is refused instead of expanded.
TEST(SnapshotDecoderTest, Issue24SharedTraceEntryIsRefused) {
  DocBuilder b;
  const Value entry = b.Entry("alloc", 0x1000, 512);
  b.Snapshot({}, {{entry, entry}});
  auto s = DecodeSnapshot(b.doc());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kCorruption);
  EXPECT_NE(s.status().message().find(
                "device_traces[0][1]: this dict is the same object as one read before"),
            std::string::npos)
      << s.status().message();
}

TEST(SnapshotDecoderTest, Issue24SharedBlockAndBlockListAreRefused) {
  const std::uint64_t base = 0x7f0000000000;
  {
    DocBuilder b;
    const Value block = b.Block(base, kMiB, kMiB, "active_allocated");
    b.Snapshot({b.Segment(0, base, 2 * kMiB, {block, block})}, {});
    auto s = DecodeSnapshot(b.doc());
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.status().message().find("segments[0].blocks[1]: this dict is the same object"),
              std::string::npos)
        << s.status().message();
  }
  {
    DocBuilder b;
    const Value segment = b.Segment(0, base, kMiB, {b.Block(base, kMiB, kMiB, "inactive")});
    b.Snapshot({segment, segment}, {});
    auto s = DecodeSnapshot(b.doc());
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.status().message().find("segments[1]: this dict is the same object"),
              std::string::npos)
        << s.status().message();
  }
}

TEST(SnapshotDecoderTest, Issue24EventBudgetIsCheckedBeforeEachList) {
  DocBuilder b;
  b.Snapshot({}, {{b.Entry("alloc", 0x1000, 512), b.Entry("alloc", 0x2000, 512),
                   b.Entry("alloc", 0x3000, 512)}});
  SnapshotDecodeOptions options;
  options.max_events = 2;
  auto s = DecodeSnapshot(b.doc(), options);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kLimitExceeded);
  EXPECT_EQ(s.status().message(),
            "device_traces[0]: 3 more segments, blocks or trace entries after 0: reached 3, "
            "more than the event budget of 2 (set by --max-events); raise it with --max-events");
  options.max_events = 3;
  EXPECT_TRUE(DecodeSnapshot(b.doc(), options).ok());
}

}  // namespace
}  // namespace fragscope::sources
