#include "model/recorded_addresses.h"

#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/units.h"

namespace fragscope::model {
namespace {

constexpr std::uint64_t MiB = kMiB;

TEST(RecordedAddressesTest, HandsBackEachSizesAddressesInRecordedOrder) {
  RecordedAddresses plan;
  plan.Add(20 * MiB, 0x7000400000);
  plan.Add(2 * MiB, 0x7000000000);
  plan.Add(20 * MiB, 0x7000c00000);
  plan.Add(0, 0x7001000000);  // nothing to place: ignored
  plan.Add(20 * MiB, 0);      // no address: ignored
  EXPECT_EQ(plan.recorded(), 3u);
  DriverModel driver;
  plan.Attach(&driver);
  ASSERT_TRUE(driver.segment_address);
  EXPECT_EQ(driver.segment_address(20 * MiB), 0x7000400000u);
  EXPECT_EQ(driver.segment_address(20 * MiB), 0x7000c00000u);
  EXPECT_EQ(driver.segment_address(20 * MiB), 0u);  // used up
  EXPECT_EQ(driver.segment_address(4 * MiB), 0u);   // never recorded
  EXPECT_EQ(driver.segment_address(2 * MiB), 0x7000000000u);
}

TEST(RecordedAddressesTest, EveryAttachedDriverAndCopyHasItsOwnCursors) {
  RecordedAddresses plan;
  plan.Add(20 * MiB, 0x7000400000);
  plan.Add(20 * MiB, 0x7000c00000);
  DriverModel a;
  plan.Attach(&a);
  DriverModel copy = a;  // as each simulator copies its SimOptions
  EXPECT_EQ(a.segment_address(20 * MiB), 0x7000400000u);
  EXPECT_EQ(copy.segment_address(20 * MiB), 0x7000400000u);
  EXPECT_EQ(a.segment_address(20 * MiB), 0x7000c00000u);
  // Added after an attach: later attaches see it, the earlier driver does not.
  plan.Add(20 * MiB, 0x7001000000);
  EXPECT_EQ(a.segment_address(20 * MiB), 0u);
  DriverModel b;
  plan.Attach(&b);
  EXPECT_EQ(b.segment_address(20 * MiB), 0x7000400000u);
  EXPECT_EQ(b.segment_address(20 * MiB), 0x7000c00000u);
  EXPECT_EQ(b.segment_address(20 * MiB), 0x7001000000u);
  // Parallel simulators (tune) each walk the addresses from the first.
  std::vector<std::uint64_t> firsts(4);
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < firsts.size(); ++t) {
    threads.emplace_back([&plan, &firsts, t] {
      DriverModel d;
      plan.Attach(&d);
      firsts[t] = d.segment_address(20 * MiB);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(firsts, std::vector<std::uint64_t>(4, 0x7000400000u));
}

TEST(RecordedAddressesTest, TheBaseLiesAboveEveryRecordedSegment) {
  RecordedAddresses plan;
  EXPECT_EQ(plan.base(), 0u);
  DriverModel empty;
  plan.Attach(&empty);
  EXPECT_FALSE(empty.segment_address);
  plan.Add(20 * MiB, 0x7000c00000);  // ends at 0x7002000000
  plan.Add(3 * MiB, 0x7000500000);
  EXPECT_EQ(plan.base(), 0x7002000000u);
  plan.Add(3 * MiB, 0x7002000000);  // ends at 0x7002300000: next 2 MiB boundary 0x7002400000
  EXPECT_EQ(plan.base(), 0x7002400000u);
  DriverModel driver;
  plan.Attach(&driver);
  EXPECT_EQ(driver.address_base, 0x7002400000u);
}

TEST(RecordedAddressesTest, RangesReachingTwoToThe47KeepTheDefaultBase) {
  RecordedAddresses plan;
  plan.Add(20 * MiB, (std::uint64_t{1} << 47) - 10 * MiB);
  EXPECT_EQ(plan.base(), 0u);
  RecordedAddresses wrapping;
  wrapping.Add(std::uint64_t{1} << 62, UINT64_MAX - 100);  // a hostile file's figures
  EXPECT_EQ(wrapping.base(), 0u);
}

}  // namespace
}  // namespace fragscope::model
