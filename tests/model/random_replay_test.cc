// Differential test: random workloads run through the naive ReferenceAllocator; its events
// are applied to DeviceMemory, and after every event the two layouts must be identical and
// every metric must equal a brute-force recomputation from the blocks.
#include <random>

#include <gtest/gtest.h>

#include "analysis/metrics.h"
#include "model/device_memory.h"
#include "testing/flat_layout.h"
#include "testing/reference_allocator.h"

namespace fragscope {
namespace {

using model::Block;
using model::BlockState;
using model::DeviceMemory;
using model::Segment;

// Brute force over the blocks: the definitions of docs/metrics.md, written the slow way.
void ExpectMetricsMatchBruteForce(const DeviceMemory& m, const analysis::MetricsInputs& in) {
  const DeviceMetrics d = analysis::ComputeMetrics(m, in);
  std::uint64_t reserved = 0, allocated = 0, requested = 0, largest = 0, stranded = 0;
  std::uint64_t largest_small = 0, largest_large = 0, free_blocks = 0, releasable = 0;
  m.ForEachSegment([&](const Segment& s) {
    reserved += s.size;
    if (s.num_blocks == 1) {
      bool all_free = true;
      m.ForEachBlock(s, [&](const Block& b) { all_free &= b.state == BlockState::kFree; });
      if (all_free) releasable += s.size;
    }
    m.ForEachBlock(s, [&](const Block& b) {
      if (b.state == BlockState::kAllocated) {
        allocated += b.size;
        requested += b.requested;
      } else if (b.state == BlockState::kFree) {
        ++free_blocks;
        largest = std::max(largest, b.size);
        auto& l = s.pool == Pool::kSmall ? largest_small : largest_large;
        l = std::max(l, b.size);
        const std::uint64_t t = s.pool == Pool::kSmall ? in.small_threshold : in.large_threshold;
        if (b.size < t) stranded += b.size;
      }
    });
  });
  ASSERT_EQ(d.all.reserved_bytes, reserved);
  ASSERT_EQ(d.all.allocated_bytes, allocated);
  ASSERT_EQ(d.all.requested_bytes, requested);
  ASSERT_EQ(d.all.cached_free_bytes, reserved - allocated);
  ASSERT_EQ(d.all.largest_free_block, largest);
  ASSERT_EQ(d.all.stranded_bytes, stranded);
  ASSERT_EQ(d.all.free_block_count, free_blocks);
  ASSERT_EQ(d.all.releasable_bytes, releasable);
  ASSERT_EQ(d.all.internal_waste_bytes, allocated - requested);
  const std::uint64_t cached = std::max(largest_large > (1u << 20) ? largest_large : 0,
                                        std::min<std::uint64_t>(largest_small, 1u << 20));
  ASSERT_EQ(d.max_allocatable_cached, cached);
  if (reserved > 0) {
    ASSERT_DOUBLE_EQ(d.all.fragmentation_ratio,
                     static_cast<double>(reserved - allocated) / static_cast<double>(reserved));
  }
}

class RandomReplayTest : public ::testing::TestWithParam<int> {};

TEST_P(RandomReplayTest, ModelMatchesReferenceAfterEveryEvent) {
  std::mt19937_64 rng(static_cast<std::uint64_t>(GetParam()));
  testing::ReferenceAllocator ref;
  DeviceMemory memory(0);
  std::vector<std::uint64_t> live;
  std::vector<Event> events;
  analysis::MetricsInputs in;
  in.small_threshold = 4096 + 512 * (rng() % 64);
  in.large_threshold = (2 << 20) + 512 * (rng() % 20000);
  in.capacity_bytes = std::uint64_t{1} << 32;
  for (int op = 0; op < 3000; ++op) {
    events.clear();
    const auto dice = rng() % 100;
    if (dice < 55 || live.empty()) {
      // Mostly small and medium tensors, some large ones: the shapes of a training step.
      std::uint64_t size;
      const auto kind = rng() % 10;
      if (kind < 5)
        size = 1 + rng() % 65536;
      else if (kind < 8)
        size = 1 + rng() % (4u << 20);
      else
        size = 1 + rng() % (48u << 20);
      live.push_back(ref.Malloc(size, &events));
    } else if (dice < 98) {
      const std::size_t i = rng() % live.size();
      ref.Free(live[i], &events);
      live[i] = live.back();
      live.pop_back();
    } else {
      ref.EmptyCache(&events);
    }
    for (const Event& e : events) {
      Status st = memory.Apply(e);
      ASSERT_TRUE(st.ok()) << "op " << op << ": " << st.ToString();
      Status inv = memory.CheckInvariants();
      ASSERT_TRUE(inv.ok()) << "op " << op << ": " << inv.ToString();
    }
    ASSERT_EQ(testing::FlatLayout(memory), testing::FlatLayout(ref)) << "op " << op;
    ExpectMetricsMatchBruteForce(memory, in);
  }
}

INSTANTIATE_TEST_SUITE_P(Seeds, RandomReplayTest, ::testing::Range(1, 9));

}  // namespace
}  // namespace fragscope
