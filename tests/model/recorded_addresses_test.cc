#include "model/recorded_addresses.h"

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
  EXPECT_EQ(plan.Take(20 * MiB), 0x7000400000u);
  EXPECT_EQ(plan.Take(20 * MiB), 0x7000c00000u);
  EXPECT_EQ(plan.Take(20 * MiB), 0u);  // used up
  EXPECT_EQ(plan.Take(4 * MiB), 0u);   // never recorded
  EXPECT_EQ(plan.Take(2 * MiB), 0x7000000000u);
}

TEST(RecordedAddressesTest, TheBaseLiesAboveEveryRecordedSegment) {
  RecordedAddresses plan;
  EXPECT_EQ(plan.base(), 0u);
  plan.Add(20 * MiB, 0x7000c00000);  // ends at 0x7002000000
  plan.Add(3 * MiB, 0x7000500000);
  EXPECT_EQ(plan.base(), 0x7002000000u);
  plan.Add(3 * MiB, 0x7002000000);  // ends at 0x7002300000: next 2 MiB boundary 0x7002400000
  EXPECT_EQ(plan.base(), 0x7002400000u);
  DriverModel driver;
  plan.Attach(&driver);
  EXPECT_EQ(driver.address_base, 0x7002400000u);
  ASSERT_TRUE(driver.segment_address);
  EXPECT_EQ(driver.segment_address(20 * MiB), 0x7000c00000u);
  EXPECT_EQ(plan.Take(3 * MiB), 0x7000500000u);  // the driver's call took the 20 MiB one only
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
