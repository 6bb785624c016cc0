// The simulator's free sets changed structure (one B+tree per pool and stream became exact
// 512-byte size classes, src/model/segregated_free_set.h); best fit must still pick exactly the
// same block, ties included, and the ordered walks (expandable-segment ranking, oversize
// release, garbage collection, empty_cache) must visit blocks in the same order. This test
// replays random request streams under settings that reach each of those paths (several
// streams, record_stream and syncs, expandable segments, max_split_size_mb, garbage collection
// under a memory fraction, empty_cache, PyTorch 2.0-2.5 sizes that are not multiples of 512,
// devices small enough for release-and-retry and OOMs) and compares a digest of everything
// observable (every emitted event, every malloc result, the final memory_stats and snapshot)
// with the digest the B+tree simulator produced (main at 096dbf5, the commit before the
// change), recorded below.
//
// To record digests from another build: FRAGSCOPE_PRINT_SIM_DIGESTS=1 model_sim_free_set_
// regression_test prints them. A digest that changes means the simulator decides differently:
// that is a behaviour change, not a refactoring, and needs its own tests.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/alloc_conf.h"
#include "model/caching_allocator_sim.h"

namespace fragscope {
namespace {

struct Digest {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a over 64-bit words
  void Add(std::uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  void Add(const std::string& s) {
    for (const char c : s) Add(static_cast<std::uint64_t>(static_cast<unsigned char>(c)));
  }
};

struct Scenario {
  const char* conf;
  std::uint64_t capacity_mib;
  int streams;
  model::ConfigVersion version = model::ConfigVersion::kNewest;
};

const Scenario kScenarios[] = {
    {"", 640, 1},
    {"", 900, 3},
    {"expandable_segments:True", 640, 1},
    {"expandable_segments:True", 900, 2},
    {"max_split_size_mb:40", 700, 1},
    {"max_split_size_mb:64", 900, 3},
    {"garbage_collection_threshold:0.6,per_process_memory_fraction:0.8", 800, 2},
    {"max_split_size_mb:30,roundup_power2_divisions:4", 700, 2},
    {"expandable_segments:True,max_split_size_mb:50", 800, 2},
    // PyTorch 2.0-2.5 returns a request unrounded under one division: sizes that are not
    // multiples of 512 reach the free sets (which then keep every block in one tree).
    {"roundup_power2_divisions:1", 700, 2, model::ConfigVersion::kV2},
};

std::uint64_t RunScenario(const Scenario& s, std::uint64_t seed, int ops) {
  auto config = model::ParseAllocatorConfig(s.conf, s.version);
  EXPECT_TRUE(config.ok()) << s.conf;
  if (!config.ok()) return 0;
  model::SimOptions options;
  options.config = *config;
  options.version = s.version;
  options.driver.capacity_bytes = s.capacity_mib << 20;
  options.driver.used_by_others_bytes = 3 << 20;
  model::CachingAllocatorSim sim(options);
  Digest d;
  sim.SetEventSink([&d](const Event& e) {
    d.Add(static_cast<std::uint64_t>(e.action));
    d.Add(e.addr);
    d.Add(e.size);
    d.Add(e.stream);
    d.Add(e.block_size);
    d.Add(static_cast<std::uint64_t>(e.pool));
    d.Add(e.device_free.value_or(~std::uint64_t{0}));
  });
  std::mt19937_64 rng(seed);
  std::vector<std::uint64_t> live;
  auto size = [&rng]() -> std::uint64_t {
    const auto r = rng() % 100;
    if (r < 50) return 1 + rng() % (1 << 20);  // small pool, many ties after rounding
    if (r < 60) return 512 * (1 + rng() % 8);  // a few exact sizes: long runs of equal keys
    if (r < 92) return (1 << 20) + rng() % (12 << 20);
    return (12 << 20) + rng() % (80 << 20);
  };
  for (int op = 0; op < ops; ++op) {
    const auto dice = rng() % 1000;
    const std::uint64_t stream = rng() % static_cast<std::uint64_t>(s.streams);
    if (dice < 490 || live.empty()) {
      auto addr = sim.Malloc(size(), stream);
      d.Add(addr.ok() ? *addr : 0);
      if (addr.ok()) live.push_back(*addr);
    } else if (dice < 960) {
      // Mostly recent blocks, sometimes any.
      const std::size_t i = rng() % 4 != 0 && live.size() > 8
                                ? live.size() - 1 - rng() % 8
                                : static_cast<std::size_t>(rng() % live.size());
      EXPECT_TRUE(sim.Free(live[i]).ok());
      live[i] = live.back();
      live.pop_back();
    } else if (dice < 980 && s.streams > 1) {
      const std::size_t i = static_cast<std::size_t>(rng() % live.size());
      EXPECT_TRUE(sim.RecordStream(live[i], rng() % static_cast<std::uint64_t>(s.streams)).ok());
    } else if (dice < 995) {
      sim.StreamSync(rng() % 3 == 0 ? std::nullopt : std::optional<std::uint64_t>(stream));
    } else {
      sim.EmptyCache();
    }
  }
  for (const auto& [key, value] : sim.stats().Flatten()) {
    d.Add(key);
    d.Add(static_cast<std::uint64_t>(value));
  }
  for (const model::SnapshotSegment& seg : sim.MemorySnapshot()) {
    d.Add(seg.address);
    d.Add(seg.total_size);
    d.Add(seg.stream);
    for (const model::SnapshotBlock& b : seg.blocks) {
      d.Add(b.address);
      d.Add(b.size);
      d.Add(b.requested_size);
      d.Add(b.state);
    }
  }
  EXPECT_TRUE(sim.CheckInvariants().ok()) << sim.CheckInvariants().message();
  if (std::getenv("FRAGSCOPE_PRINT_SIM_DIGESTS") != nullptr) {
    const model::MemoryStats& st = sim.stats();
    std::fprintf(stderr, "%s seed %llu: retries %lld ooms %lld device_free %lld syncs %lld\n",
                 s.conf, static_cast<unsigned long long>(seed),
                 static_cast<long long>(st.num_alloc_retries), static_cast<long long>(st.num_ooms),
                 static_cast<long long>(st.num_device_free),
                 static_cast<long long>(st.num_sync_all_streams));
  }
  return d.h;
}

constexpr int kSeeds = 3;
constexpr int kOps = 20000;

// Digests of the B+tree simulator (main at 096dbf5), kScenarios x seeds 1..kSeeds.
const std::uint64_t kExpected[std::size(kScenarios)][kSeeds] = {
    {0xd26d93f395008fa9ull, 0xacd80987d20e731eull, 0x88bdbd745c829d26ull},
    {0x903bbe288ff7b635ull, 0x196c92f40b382c45ull, 0x0d6395c197a38668ull},
    {0x88288136aa895828ull, 0x92f3dc08bae46fd7ull, 0xef72ac2a554d0972ull},
    {0xff13e152c0823bb3ull, 0x8e9c8a98090f62e7ull, 0x99679e31c1c9a0d0ull},
    {0xd74c939f22b91df9ull, 0xb3ae35be3e7c5caaull, 0x5818206370c171d2ull},
    {0x423bcb0f1f9a7abbull, 0x04d00a92a6717e5eull, 0x86744f84453d8384ull},
    {0x9b633376e687b564ull, 0xa8178ad707b1ab24ull, 0x0318325726c2e126ull},
    {0xfbddcbc034e379caull, 0x2559594322f79953ull, 0xfa8ad3c4b9448251ull},
    {0x7a4db3feb44543c3ull, 0x16158590ed89303eull, 0xf4d349c294896deaull},
    {0x0f95fc5268f74c1dull, 0xfd8ec544a09bff78ull, 0xd801c0ddfd3c0a10ull},
};

TEST(SimFreeSetRegressionTest, SameDecisionsAsTheBTreeSimulator) {
  const bool print = std::getenv("FRAGSCOPE_PRINT_SIM_DIGESTS") != nullptr;
  for (std::size_t i = 0; i < std::size(kScenarios); ++i) {
    if (print) std::printf("    {");
    for (int seed = 1; seed <= kSeeds; ++seed) {
      const std::uint64_t got = RunScenario(kScenarios[i], static_cast<std::uint64_t>(seed), kOps);
      if (print)
        std::printf("0x%016llxull%s", static_cast<unsigned long long>(got),
                    seed < kSeeds ? ", " : "},\n");
      if (print) continue;
      EXPECT_EQ(got, kExpected[i][seed - 1])
          << "scenario \"" << kScenarios[i].conf << "\" on " << kScenarios[i].capacity_mib
          << " MiB, " << kScenarios[i].streams << " streams, seed " << seed;
    }
  }
}

}  // namespace
}  // namespace fragscope
