// TraceHistory: the compact encoding of a device's history round-trips every field, at and
// across chunk boundaries, for extreme values, by every way of reading it.
#include "sources/snapshot/trace_history.h"

#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace fragscope::sources {
namespace {

constexpr std::size_t kChunk = TraceHistory::kChunkEntries;

TraceHistory Build(const std::vector<SnapshotTraceEntry>& entries) {
  TraceHistory h;
  for (const SnapshotTraceEntry& e : entries) h.push_back(e);
  return h;
}

// Reads `h` back three ways (iteration, chunks, operator[]) and compares with `want`.
void ExpectSame(const TraceHistory& h, const std::vector<SnapshotTraceEntry>& want) {
  ASSERT_EQ(h.size(), want.size());
  EXPECT_EQ(h.empty(), want.empty());
  EXPECT_EQ(h.num_chunks(), (want.size() + kChunk - 1) / kChunk);
  std::size_t i = 0;
  for (const SnapshotTraceEntry& e : h) {
    ASSERT_LT(i, want.size());
    ASSERT_EQ(e, want[i]) << "iterated entry " << i;
    ++i;
  }
  EXPECT_EQ(i, want.size());
  std::vector<SnapshotTraceEntry> chunk;
  for (std::size_t c = h.num_chunks(); c-- > 0;) {  // backwards, as the reader's walk
    h.DecodeChunk(c, &chunk);
    ASSERT_EQ(chunk.size(), std::min(kChunk, want.size() - c * kChunk));
    for (std::size_t k = 0; k < chunk.size(); ++k) {
      ASSERT_EQ(chunk[k], want[c * kChunk + k]) << "chunk " << c << " entry " << k;
    }
  }
  for (std::size_t k : {std::size_t{0}, want.size() / 2, want.size() - 1}) {
    if (k < want.size()) {
      EXPECT_EQ(h[k], want[k]) << "entry " << k;
    }
  }
}

SnapshotTraceEntry Entry(Action action, std::uint64_t addr, std::uint64_t size,
                         std::uint32_t index) {
  SnapshotTraceEntry e;
  e.action = action;
  e.addr = addr;
  e.size = size;
  e.entry = index;
  return e;
}

TEST(TraceHistoryTest, EmptyHistory) {
  const TraceHistory h;
  EXPECT_TRUE(h.empty());
  EXPECT_EQ(h.num_chunks(), 0u);
  EXPECT_TRUE(h.begin() == h.end());
}

TEST(TraceHistoryTest, ExtremeValuesRoundTrip) {
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
  constexpr std::int64_t kMin64 = std::numeric_limits<std::int64_t>::min();
  constexpr std::int64_t kMax64 = std::numeric_limits<std::int64_t>::max();
  std::vector<SnapshotTraceEntry> want;
  // Addresses near 2^64 and 0, sizes 0 and 2^64 - 1, back and forth (deltas of either sign
  // and of the full width).
  want.push_back(Entry(Action::kSegmentAlloc, kMax - 4095, 4096, 0));
  want.push_back(Entry(Action::kAlloc, 0, 0, 1));
  want.push_back(Entry(Action::kAlloc, kMax, kMax, 2));
  want.push_back(Entry(Action::kFreeRequested, 1, kMax - 1, 3));
  want.push_back(Entry(Action::kFreeCompleted, 1ull << 63, 1ull << 63, 3));  // same index
  // Times: absent (-1), other negatives, the extremes, and absent again after a real one.
  for (const std::int64_t t : {std::int64_t{-1}, std::int64_t{1708187029490966}, kMin64, kMax64,
                               std::int64_t{-1}, std::int64_t{-7}, std::int64_t{0}}) {
    SnapshotTraceEntry e = Entry(Action::kAlloc, 0x7f0000000000, 512, want.back().entry + 1);
    e.time_us = t;
    want.push_back(e);
  }
  // Streams of any width, and back to 0.
  for (const std::uint64_t s :
       {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{0xffffffff}, std::uint64_t{1} << 32, kMax,
        std::uint64_t{0x55d3a0c3b2e0}, std::uint64_t{0}}) {
    SnapshotTraceEntry e = Entry(Action::kFreeRequested, 0x1000, 1, want.back().entry + 1);
    e.stream = s;
    want.push_back(e);
  }
  // Stacks: none, the largest, 0, none again; device_free of an oom, 0 and the largest.
  for (const std::int32_t s : {-1, std::numeric_limits<std::int32_t>::max(), 0, -1, 5}) {
    SnapshotTraceEntry e = Entry(Action::kOom, 0, 1 << 20, want.back().entry + 1);
    e.stack = s;
    e.device_free = s == 0 ? 0 : kMax - static_cast<std::uint64_t>(s) - 1;
    want.push_back(e);
  }
  // Entry indexes that jump (annotate entries skipped), stay, and reach 2^32 - 1.
  want.push_back(Entry(Action::kSnapshot, 0, 0, want.back().entry + 1000));
  want.push_back(Entry(Action::kSnapshot, 0, 0, want.back().entry));
  want.push_back(Entry(Action::kSnapshot, 0, 0, 0xffffffffu));
  want.push_back(Entry(Action::kSegmentUnmap, 0, 0, 0));
  // Every action the history holds.
  for (int a = 0; a <= static_cast<int>(Action::kSnapshot); ++a) {
    want.push_back(Entry(static_cast<Action>(a), 64, 64, want.back().entry + 1));
  }
  ExpectSame(Build(want), want);
}

// Random histories of lengths around the chunk size: every field drawn from a mix of small,
// repeated and full-width values, so a delta or flag that does not restart at a chunk boundary
// (or is taken from the wrong field) shows.
TEST(TraceHistoryTest, RandomHistoriesAcrossChunkBoundaries) {
  std::mt19937_64 rng(34);
  const auto pick = [&](std::uint64_t small) -> std::uint64_t {
    switch (rng() % 4) {
      case 0:
        return rng();
      case 1:
        return rng() % small;
      case 2:
        return 0;
      default:
        return small;
    }
  };
  for (const std::size_t n :
       {std::size_t{1}, kChunk - 1, kChunk, kChunk + 1, 2 * kChunk, 3 * kChunk + 17}) {
    std::vector<SnapshotTraceEntry> want(n);
    std::uint32_t index = static_cast<std::uint32_t>(rng() % 5);
    for (SnapshotTraceEntry& e : want) {
      e.action = static_cast<Action>(rng() % (static_cast<int>(Action::kSnapshot) + 1));
      e.addr = pick(1 << 20);
      e.size = pick(1 << 12);
      e.stream = pick(3);
      e.time_us = static_cast<std::int64_t>(pick(100)) - (rng() % 8 == 0 ? 100 : 0);
      e.stack = static_cast<std::int32_t>(rng() % 3 == 0 ? -1 : static_cast<int>(rng() % 70000));
      e.device_free = rng() % 5 == 0 ? pick(1 << 30) : 0;
      index += static_cast<std::uint32_t>(rng() % 3);
      e.entry = index;
    }
    SCOPED_TRACE(n);
    ExpectSame(Build(want), want);
  }
}

// A short history holds little: a file of many short device lists does not cost a chunk's
// worth of bytes per list.
TEST(TraceHistoryTest, ShortHistoryIsSmall) {
  TraceHistory h;
  h.push_back(Entry(Action::kAlloc, 0x7f0000000000, 512, 0));
  EXPECT_LT(h.bytes(), 256u);
}

TEST(TraceHistoryTest, IgnoresBlockSize) {
  SnapshotTraceEntry e = Entry(Action::kAlloc, 4096, 100, 0);
  e.block_size = 512;
  TraceHistory h;
  h.push_back(e);
  EXPECT_EQ(h[0].block_size, 0u);
}

TEST(TraceHistoryTest, MapStacksRenumbersAndComposes) {
  std::vector<SnapshotTraceEntry> want;
  for (std::uint32_t i = 0; i < kChunk + 10; ++i) {
    SnapshotTraceEntry e = Entry(Action::kAlloc, i * 512, 512, i);
    e.stack = i % 4 == 3 ? -1 : static_cast<std::int32_t>(i % 3);
    want.push_back(e);
  }
  TraceHistory h = Build(want);
  h.MapStacks(
      std::make_shared<const std::vector<std::int32_t>>(std::vector<std::int32_t>{2, 0, 1}));
  for (SnapshotTraceEntry& e : want) {
    if (e.stack >= 0)
      e.stack = std::vector<std::int32_t>{2, 0, 1}[static_cast<std::size_t>(e.stack)];
  }
  ExpectSame(h, want);
  h.MapStacks(
      std::make_shared<const std::vector<std::int32_t>>(std::vector<std::int32_t>{7, 8, 9}));
  for (SnapshotTraceEntry& e : want) {
    if (e.stack >= 0) e.stack += 7;
  }
  ExpectSame(h, want);
}

// Renumbering follows the order in which entries first name each stack.
TEST(TraceHistoryTest, FirstStacksInOrderOfFirstAppearance) {
  TraceHistory h;
  std::uint32_t i = 0;
  for (const std::int32_t s : {5, -1, 3, 5, 0, 3, 7, -1, 0, 7, 2}) {
    SnapshotTraceEntry e = Entry(Action::kAlloc, 0, 0, i++);
    e.stack = s;
    h.push_back(e);
  }
  EXPECT_EQ(h.first_stacks(), (std::vector<std::int32_t>{5, 3, 0, 7, 2}));
  // An id far beyond the entries is listed each time, after the ones before it.
  for (int k = 0; k < 2; ++k) {
    SnapshotTraceEntry e = Entry(Action::kAlloc, 0, 0, i++);
    e.stack = std::numeric_limits<std::int32_t>::max();
    h.push_back(e);
  }
  SnapshotTraceEntry e = Entry(Action::kAlloc, 0, 0, i++);
  e.stack = 9;
  h.push_back(e);
  const std::vector<std::int32_t>& first = h.first_stacks();
  ASSERT_GE(first.size(), 7u);
  EXPECT_EQ(first[5], std::numeric_limits<std::int32_t>::max());
  EXPECT_EQ(first.back(), 9);
}

// The point of the encoding: a history like the generator's (addresses among a few hundred
// segments, sizes of a few kinds, a time a few microseconds on, shared stacks) takes a fraction
// of the 64-byte record.
TEST(TraceHistoryTest, TypicalHistoryIsCompact) {
  std::mt19937_64 rng(11);
  TraceHistory h;
  std::int64_t t = 1708187029490966;
  constexpr std::size_t kEntries = 100000;
  for (std::uint32_t i = 0; i < kEntries; ++i) {
    SnapshotTraceEntry e;
    e.action = static_cast<Action>(rng() % 3);
    e.addr = 0x7f0000000000 + (rng() % 400) * (66ull << 20) + (rng() % 8) * (8ull << 20);
    e.size = (8ull << 20) - rng() % 512;
    t += 37;
    e.time_us = t;
    e.stack = static_cast<std::int32_t>(rng() % 2000);
    e.entry = i;
    h.push_back(e);
  }
  EXPECT_LT(h.bytes(), kEntries * 16);
  EXPECT_GT(h.bytes(), kEntries * 4);  // bytes() counts what is held
}

}  // namespace
}  // namespace fragscope::sources
