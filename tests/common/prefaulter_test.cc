// Prefaulter: pages it is asked for become resident, their contents never change, and memory
// freed under it does no harm.
#include "common/prefaulter.h"

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>
#include <sys/mman.h>

namespace fragscope {
namespace {

constexpr std::size_t kPage = 4096;

// Pages of [p, p + bytes) that are resident (mincore), for an anonymous mapping.
std::size_t ResidentPages(void* p, std::size_t bytes) {
  std::vector<unsigned char> vec(bytes / kPage);
  if (mincore(p, bytes, vec.data()) != 0) return 0;
  std::size_t n = 0;
  for (unsigned char v : vec) n += v & 1;
  return n;
}

void* Map(std::size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

TEST(PrefaulterTest, PopulatedPagesBecomeResident) {
  ASSERT_EQ(static_cast<std::size_t>(sysconf(_SC_PAGESIZE)), kPage);
  constexpr std::size_t kBytes = std::size_t{8} << 20;
  void* p = Map(kBytes);
  ASSERT_NE(p, nullptr);
  ASSERT_EQ(ResidentPages(p, kBytes), 0u) << "a fresh anonymous mapping has no pages yet";
  Prefaulter prefaulter;
  prefaulter.Populate(p, kBytes / 2);
  prefaulter.Drain();
  if (!prefaulter.supported()) {
    GTEST_SKIP() << "this kernel has no MADV_POPULATE_WRITE (Linux < 5.14): Populate is a no-op";
  }
  EXPECT_EQ(ResidentPages(p, kBytes / 2), kBytes / 2 / kPage);
  EXPECT_EQ(ResidentPages(static_cast<char*>(p) + kBytes / 2, kBytes / 2), 0u)
      << "only the pages asked for";
  munmap(p, kBytes);
}

TEST(PrefaulterTest, ContentsAreKept) {
  constexpr std::size_t kBytes = std::size_t{4} << 20;
  auto* p = static_cast<unsigned char*>(Map(kBytes));
  ASSERT_NE(p, nullptr);
  // Every other page written before; the request covers the written and the fresh ones.
  for (std::size_t i = 0; i < kBytes; i += 2 * kPage) std::memset(p + i, 0xab, kPage);
  Prefaulter prefaulter;
  prefaulter.Populate(p + 100, kBytes - 200);  // partial pages at the ends are left alone
  prefaulter.Drain();
  for (std::size_t i = 0; i < kBytes; ++i) {
    const unsigned char want = (i / kPage) % 2 == 0 ? 0xab : 0;
    ASSERT_EQ(p[i], want) << "byte " << i;
  }
  munmap(p, kBytes);
}

TEST(PrefaulterTest, MemoryUnmappedUnderARequestIsHarmless) {
  Prefaulter prefaulter;
  for (int round = 0; round < 20; ++round) {
    constexpr std::size_t kBytes = std::size_t{16} << 20;
    void* p = Map(kBytes);
    ASSERT_NE(p, nullptr);
    prefaulter.Populate(p, kBytes);
    munmap(p, kBytes);  // maybe before, during or after the worker gets to it
  }
  prefaulter.Drain();
  // Destroying with requests queued drops them.
  void* p = Map(std::size_t{64} << 20);
  ASSERT_NE(p, nullptr);
  {
    Prefaulter short_lived;
    for (std::size_t i = 0; i < 8; ++i) {
      short_lived.Populate(static_cast<char*>(p) + (i << 23), std::size_t{8} << 20);
    }
  }
  munmap(p, std::size_t{64} << 20);
}

TEST(PrefaulterTest, TinyAndEmptyRequestsAreIgnored) {
  Prefaulter prefaulter;
  char local[64] = {};
  prefaulter.Populate(local, sizeof local);  // no whole page inside
  prefaulter.Populate(nullptr, 0);
  prefaulter.Drain();
  EXPECT_EQ(local[0], 0);
}

}  // namespace
}  // namespace fragscope
