// Differential test of model::BfcAllocatorSim against the naive testing::BfcReference on random
// request sequences and random settings (growth or not, garbage collection, a device smaller
// than the limit so the 0.9 back-off runs, a fragmentation fraction, every version): after every
// request both must agree on the address or the failure, and at the end (and every 50 requests)
// on every region and chunk: address, size, requested size, in use.
#include <random>

#include <gtest/gtest.h>

#include "common/units.h"
#include "model/bfc_allocator_sim.h"
#include "testing/bfc_reference.h"

namespace fragscope {
namespace {

std::string Describe(const std::vector<model::BfcRegion>& regions) {
  std::string out;
  for (const auto& r : regions) {
    out += "region " + std::to_string(r.address) + "+" + std::to_string(r.size) + ":";
    for (const auto& c : r.chunks) {
      out += " " + std::to_string(c.address - r.address) + "/" + std::to_string(c.size) +
             (c.in_use ? "*" : "");
    }
    out += "\n";
  }
  return out;
}

// Runs one random sequence; returns the number of failed requests, or -1 on a mismatch.
int RunSequence(std::uint64_t seed, int ops) {
  std::mt19937_64 rng(seed * 104729 + 17);
  model::BfcSettings s;
  const auto pick = rng() % 6;
  s.version = pick == 0 ? model::BfcVersion::kTf0
                        : (pick == 1 ? model::BfcVersion::kTf2 : model::BfcVersion::kNewest);
  s.allow_growth = rng() % 4 != 0;
  s.garbage_collection = s.version != model::BfcVersion::kTf0 && rng() % 2 == 0;
  if (s.version == model::BfcVersion::kNewest && rng() % 4 == 0) {
    s.fragmentation_fraction = 0.01 * static_cast<double>(1 + rng() % 20);
  }
  // One sequence in four works in sizes 64 times larger, where a remainder reaches 128 MiB.
  const std::uint64_t scale = rng() % 4 == 0 ? 64 : 1;
  s.memory_limit = (4 + rng() % 60) * kMiB * scale + 256 * (rng() % 16);
  s.descending_regions = rng() % 2 == 0;
  model::BfcDevice d;
  if (rng() % 3 == 0) d.capacity_bytes = *s.memory_limit * (5 + rng() % 6) / 10;  // back-off
  model::BfcAllocatorSim sim(s, d, 0);
  testing::BfcReference ref(s, d);
  std::vector<std::uint64_t> live;
  int failures = 0;
  for (int op = 0; op < ops; ++op) {
    if (live.empty() || rng() % 100 < 58) {
      const auto kind = rng() % 10;
      const std::uint64_t size = kind < 4   ? 1 + rng() % 4096
                                 : kind < 8 ? 1 + rng() % (512 * 1024)
                                            : 1 + rng() % (6 * kMiB * scale);
      const std::uint64_t want = ref.Malloc(size);
      Result<std::uint64_t> got = sim.Malloc(size);
      EXPECT_EQ(want == 0, !got.ok()) << "seed " << seed << " op " << op << " size " << size;
      if ((want == 0) != !got.ok()) return -1;
      if (want == 0) {
        ++failures;
        continue;
      }
      EXPECT_EQ(*got, want) << "seed " << seed << " op " << op;
      if (*got != want) return -1;
      live.push_back(want);
    } else {
      const std::size_t i = rng() % live.size();
      ref.Free(live[i]);
      EXPECT_TRUE(sim.Free(live[i]).ok());
      live[i] = live.back();
      live.pop_back();
    }
    if (op % 50 == 49 || op == ops - 1) {
      const auto a = sim.Regions(), b = ref.Regions();
      EXPECT_EQ(a, b) << "seed " << seed << " op " << op << "\nsim:\n"
                      << Describe(a) << "reference:\n"
                      << Describe(b);
      if (a != b) return -1;
      const Status inv = sim.CheckInvariants();
      EXPECT_TRUE(inv.ok()) << inv.ToString();
      if (!inv.ok()) return -1;
    }
  }
  return failures;
}

TEST(BfcPropertyTest, SimulatorAgreesWithTheReferenceOnRandomSequences) {
  int with_failures = 0;
  for (std::uint64_t seed = 1; seed <= 300; ++seed) {
    const int failures = RunSequence(seed, 400);
    ASSERT_GE(failures, 0) << "seed " << seed;
    with_failures += failures > 0 ? 1 : 0;
  }
  // The sequences must exercise the failure path (limits, back-off, garbage collection).
  EXPECT_GT(with_failures, 30);
}

}  // namespace
}  // namespace fragscope
