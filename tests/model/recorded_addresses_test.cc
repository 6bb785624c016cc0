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

TEST(RecordedAddressesTest, TheBaseIsTheLowestAddressOnA2MiBBoundary) {
  RecordedAddresses plan;
  EXPECT_EQ(plan.base(), 0u);
  plan.Add(20 * MiB, 0x7000500000);  // 2 MiB boundary below it: 0x7000400000
  plan.Add(20 * MiB, 0x7000c00000);
  EXPECT_EQ(plan.base(), 0x7000400000u);
  DriverModel driver;
  plan.Attach(&driver);
  EXPECT_EQ(driver.address_base, 0x7000400000u);
  ASSERT_TRUE(driver.segment_address);
  EXPECT_EQ(driver.segment_address(20 * MiB), 0x7000500000u);
  EXPECT_EQ(plan.Take(20 * MiB), 0x7000c00000u);  // the driver's call took the first
}

}  // namespace
}  // namespace fragscope::model
