// Differential test of CachingAllocatorSim against the naive ReferenceAllocator
// (tests/testing/): thousands of random request sequences (default settings, one stream, a
// device small enough that release-and-retry and OOMs happen) run through both, and after
// every operation the full state must agree: every segment and block (address, size,
// requested size, state), reserved and allocated bytes, and whether the request failed. The
// events the simulator emits must also rebuild the same layout in a DeviceMemory.
#include <random>

#include <gtest/gtest.h>

#include "model/caching_allocator_sim.h"
#include "model/device_memory.h"
#include "testing/flat_layout.h"
#include "testing/reference_allocator.h"
#include "testing/test_util.h"

namespace fragscope {
namespace {

using testing::FlatLayout;

// One random trace of `ops` operations from `seed`; returns the number of OOMs it hit.
int RunTrace(std::uint64_t seed, int ops) {
  std::mt19937_64 rng(seed * 7919);
  // 96..352 MiB devices: tight enough that segments get released and requests fail.
  const std::uint64_t capacity = (96 + 32 * (rng() % 9)) << 20;
  testing::ReferenceAllocator ref(capacity);
  model::SimOptions options;
  options.driver.capacity_bytes = capacity;
  model::CachingAllocatorSim sim(options);
  model::DeviceMemory replayed(0);
  Status sink_status;
  sim.SetEventSink([&](const Event& e) {
    if (sink_status.ok()) sink_status = replayed.Apply(e);
  });
  std::vector<std::uint64_t> live;
  std::vector<Event> ignored;
  int ooms = 0;
  for (int op = 0; op < ops; ++op) {
    const auto dice = rng() % 100;
    if (dice < 55 || live.empty()) {
      std::uint64_t size;
      const auto kind = rng() % 10;
      if (kind < 5)
        size = 1 + rng() % 65536;
      else if (kind < 8)
        size = 1 + rng() % (4u << 20);
      else
        size = 1 + rng() % (48u << 20);
      const std::uint64_t want = ref.Malloc(size, &ignored);
      Result<std::uint64_t> got = sim.Malloc(size, 0);
      EXPECT_EQ(want == 0, !got.ok())
          << "seed " << seed << " op " << op << " size " << size << ": " << got.status().ToString();
      if ((want == 0) != !got.ok()) return -1;
      if (want == 0) {
        EXPECT_EQ(got.status().code(), StatusCode::kOutOfMemory);
        ++ooms;
      } else {
        EXPECT_EQ(*got, want) << "seed " << seed << " op " << op;
        if (*got != want) return -1;
        live.push_back(want);
      }
    } else if (dice < 98) {
      const std::size_t i = rng() % live.size();
      ref.Free(live[i], &ignored);
      if (!sim.Free(live[i]).ok()) {
        ADD_FAILURE() << "seed " << seed << " op " << op << ": free failed";
        return -1;
      }
      live[i] = live.back();
      live.pop_back();
    } else {
      ref.EmptyCache(&ignored);
      sim.EmptyCache();
    }
    const auto stats = sim.stats().Flatten();
    const Status inv = sim.CheckInvariants();
    const bool same =
        FlatLayout(sim) == FlatLayout(ref) && sink_status.ok() &&
        FlatLayout(replayed) == FlatLayout(ref) &&
        static_cast<std::uint64_t>(stats.at("reserved_bytes.all.current")) == ref.reserved() &&
        inv.ok();
    if (!same) {
      EXPECT_EQ(FlatLayout(sim), FlatLayout(ref)) << "seed " << seed << " op " << op;
      EXPECT_TRUE(sink_status.ok()) << sink_status.ToString();
      EXPECT_EQ(FlatLayout(replayed), FlatLayout(ref)) << "events rebuild another layout";
      EXPECT_TRUE(inv.ok()) << inv.ToString();
      return -1;
    }
  }
  return ooms;
}

// Thousands of short traces: many different early states (400 under the sanitizers).
TEST(SimDifferentialTest, TwoThousandShortTraces) {
  int ooms = 0;
  const auto seeds = static_cast<std::uint64_t>(testing::Repetitions(2000));
  for (std::uint64_t seed = 1; seed <= seeds; ++seed) {
    const int n = RunTrace(seed, 150);
    ASSERT_GE(n, 0) << "seed " << seed;
    ooms += n;
  }
  EXPECT_GT(ooms, 0) << "the devices are meant to be small enough to run out of memory";
}

// Fewer, longer traces: deep fragmentation, releases and many OOMs.
TEST(SimDifferentialTest, LongTraces) {
  int ooms = 0;
  for (std::uint64_t seed = 10001; seed <= 10020; ++seed) {
    const int n = RunTrace(seed, 1500);
    ASSERT_GE(n, 0) << "seed " << seed;
    ooms += n;
  }
  EXPECT_GT(ooms, 500);
}

}  // namespace
}  // namespace fragscope
