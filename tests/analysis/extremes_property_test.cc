// Property test (issue 29, item 1): the worst moments `analyze` reports are exact. Random
// workloads run through the naive ReferenceAllocator; a brute-force pass over the blocks after
// every event gives the extremes by their definitions (docs/metrics.md, "Extremes"), and the
// TraceAnalyzer must report the same figures at the same events whatever its sampling is
// (--every 1, 7, 1000, or step markers).
#include <optional>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "analysis/trace_analyzer.h"
#include "common/units.h"
#include "model/allocator_rules.h"
#include "model/device_memory.h"
#include "testing/reference_allocator.h"

namespace fragscope::analysis {
namespace {

using model::Block;
using model::BlockState;
using model::DeviceMemory;
using model::Segment;

constexpr std::uint64_t kCapacity = std::uint64_t{3} << 30;

struct Naive {
  std::uint64_t peak_reserved = 0;
  std::optional<std::pair<std::uint64_t, std::uint64_t>> max_cached_free;  // (bytes, event)
  std::optional<std::pair<std::uint64_t, std::uint64_t>> min_largest_free;
  std::optional<std::pair<std::uint64_t, std::uint64_t>> min_max_allocatable;
  std::optional<std::uint64_t> worst_event;
  double worst_ratio = 0;
  std::uint64_t worst_cached = 0;
  std::uint64_t worst_reserved = 0;
};

struct State {
  std::uint64_t event = 0;
  std::uint64_t reserved = 0;
  std::uint64_t allocated = 0;
  bool segment_grew = false;
};

// The definitions, the slow way: a scan of every block after every event.
Naive BruteForce(const std::vector<Event>& events) {
  DeviceMemory m(0);
  Naive n;
  std::vector<State> states;
  for (std::size_t i = 0; i < events.size(); ++i) {
    const Event& e = events[i];
    if (e.action == Action::kStep) continue;
    EXPECT_TRUE(m.Apply(e).ok()) << "event " << i;
    std::uint64_t reserved = 0, allocated = 0, largest_small = 0, largest_large = 0;
    std::uint64_t releasable = 0;
    m.ForEachSegment([&](const Segment& s) {
      reserved += s.size;
      bool all_free = true;
      m.ForEachBlock(s, [&](const Block& b) {
        if (b.state != BlockState::kFree) all_free = false;
        if (b.state == BlockState::kAllocated) allocated += b.size;
        if (b.state == BlockState::kFree) {
          auto& l = s.pool == Pool::kSmall ? largest_small : largest_large;
          l = std::max(l, b.size);
        }
      });
      if (all_free) releasable += s.size;
    });
    const std::uint64_t cached_part =
        std::max(largest_large > kMiB ? largest_large : 0, std::min(largest_small, kMiB));
    const std::uint64_t device_free = kCapacity > reserved ? kCapacity - reserved : 0;
    const std::uint64_t max_allocatable = std::max(
        cached_part, model::AllocatorRules::LargestRequestForNewSegment(device_free + releasable));
    const std::uint64_t largest = std::max(largest_small, largest_large);
    n.peak_reserved = std::max(n.peak_reserved, reserved);
    if (!n.max_cached_free || reserved - allocated > n.max_cached_free->first) {
      n.max_cached_free = {reserved - allocated, i};
    }
    if (reserved > 0) {
      if (!n.min_largest_free || largest < n.min_largest_free->first) {
        n.min_largest_free = {largest, i};
      }
      if (!n.min_max_allocatable || max_allocatable < n.min_max_allocatable->first) {
        n.min_max_allocatable = {max_allocatable, i};
      }
    }
    states.push_back(State{i, reserved, allocated,
                           e.action == Action::kSegmentAlloc || e.action == Action::kSegmentMap});
  }
  // The worst ratio: moments with something allocated and at least half the peak reserved,
  // not right after a segment was reserved for the next event's block.
  for (const State& s : states) {
    if (s.allocated == 0 || s.segment_grew || 2 * s.reserved < n.peak_reserved) continue;
    const double ratio =
        static_cast<double>(s.reserved - s.allocated) / static_cast<double>(s.reserved);
    if (!n.worst_event || ratio > n.worst_ratio) {
      n.worst_event = s.event;
      n.worst_ratio = ratio;
      n.worst_cached = s.reserved - s.allocated;
      n.worst_reserved = s.reserved;
    }
  }
  return n;
}

std::vector<Event> RandomWorkload(std::uint64_t seed, bool steps) {
  std::mt19937_64 rng(seed);
  testing::ReferenceAllocator ref;
  std::vector<std::uint64_t> live;
  std::vector<Event> events;
  std::int64_t step = 0;
  const int ops = 1500 + static_cast<int>(rng() % 1500);
  for (int op = 0; op < ops; ++op) {
    if (steps && rng() % 40 == 0) {
      Event marker;
      marker.action = Action::kStep;
      marker.step = step++;
      events.push_back(marker);
    }
    const auto dice = rng() % 100;
    // Phases: growing, then shrinking, then growing again, so the peak moves.
    const bool grow = (op / 400) % 2 == 0;
    if (live.empty() || dice < (grow ? 65u : 35u)) {
      std::uint64_t size;
      const auto kind = rng() % 10;
      if (kind < 5)
        size = 1 + rng() % 65536;
      else if (kind < 8)
        size = 1 + rng() % (4u << 20);
      else
        size = 1 + rng() % (48u << 20);
      live.push_back(ref.Malloc(size, &events));
    } else if (dice < 99) {
      const std::size_t i = rng() % live.size();
      ref.Free(live[i], &events);
      live[i] = live.back();
      live.pop_back();
    } else {
      ref.EmptyCache(&events);
    }
  }
  return events;
}

void ExpectSame(const DeviceReport& d, const Naive& n, const std::string& how) {
  SCOPED_TRACE(how);
  ASSERT_TRUE(n.max_cached_free && n.min_largest_free && n.min_max_allocatable && n.worst_event);
  EXPECT_EQ(d.peak_reserved.bytes, n.peak_reserved);
  EXPECT_EQ(d.max_cached_free.bytes, n.max_cached_free->first);
  EXPECT_EQ(d.max_cached_free.when.event_index, n.max_cached_free->second);
  ASSERT_TRUE(d.min_largest_free_block.seen);
  EXPECT_EQ(d.min_largest_free_block.bytes, n.min_largest_free->first);
  EXPECT_EQ(d.min_largest_free_block.when.event_index, n.min_largest_free->second);
  ASSERT_TRUE(d.min_max_allocatable.seen);
  EXPECT_EQ(d.min_max_allocatable.bytes, n.min_max_allocatable->first);
  EXPECT_EQ(d.min_max_allocatable.when.event_index, n.min_max_allocatable->second);
  ASSERT_TRUE(d.worst_fragmentation.seen);
  EXPECT_DOUBLE_EQ(d.worst_fragmentation_ratio, n.worst_ratio);
  EXPECT_EQ(d.worst_fragmentation.bytes, n.worst_cached);
  EXPECT_EQ(d.worst_fragmentation_reserved, n.worst_reserved);
  EXPECT_EQ(d.worst_fragmentation.when.event_index, *n.worst_event);
  EXPECT_EQ(d.worst_fragmentation_min_reserved, (n.peak_reserved + 1) / 2);
}

class ExtremesPropertyTest : public ::testing::TestWithParam<int> {};

TEST_P(ExtremesPropertyTest, ExtremesMatchABruteForcePassWhateverTheSampling) {
  const auto seed = static_cast<std::uint64_t>(GetParam());
  for (bool steps : {false, true}) {
    const std::vector<Event> events = RandomWorkload(seed * 2 + (steps ? 1 : 0), steps);
    const Naive naive = BruteForce(events);
    TraceHeader header;
    header.kind = TraceKind::kAllocator;
    header.devices.push_back(DeviceInfo{0, "gpu", kCapacity, std::nullopt});
    for (std::uint64_t every : {0, 1, 7, 1000}) {
      AnalysisOptions options;
      options.every_events = every;
      auto analyzer = TraceAnalyzer::Create(header, options);
      ASSERT_TRUE(analyzer.ok());
      for (std::size_t i = 0; i < events.size(); ++i) {
        Status st = (*analyzer)->Consume(events[i]);
        ASSERT_TRUE(st.ok()) << "event " << i << ": " << st.ToString();
      }
      const AnalysisResult r = (*analyzer)->Finish("random");
      ASSERT_EQ(r.devices.size(), 1u);
      ExpectSame(r.devices[0], naive,
                 "seed " + std::to_string(seed) + (steps ? " with steps" : "") + ", every " +
                     std::to_string(every));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Seeds, ExtremesPropertyTest, ::testing::Range(1, 13));

}  // namespace
}  // namespace fragscope::analysis
