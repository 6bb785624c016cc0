#include "common/units.h"

#include <gtest/gtest.h>

namespace fragscope {
namespace {

TEST(ParseSizeTest, AcceptsBytesAndUnits) {
  EXPECT_EQ(*ParseSize("1048576"), 1048576u);
  EXPECT_EQ(*ParseSize("512MiB"), 512u * kMiB);
  EXPECT_EQ(*ParseSize("80GiB"), 80u * kGiB);
  EXPECT_EQ(*ParseSize("40GB"), 40'000'000'000u);
  EXPECT_EQ(*ParseSize("1.5GiB"), 3u * kGiB / 2);
  EXPECT_EQ(*ParseSize(" 2 KiB "), 2048u);
  EXPECT_EQ(*ParseSize("80g"), 80u * kGiB);
}

TEST(ParseSizeTest, RejectsMalformedText) {
  for (const char* bad :
       {"", "GiB", "12XB", "1.2.3", "-5", "0.3", "99999999999999999999TiB", "5 MiB extra"}) {
    auto r = ParseSize(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find("size '"), std::string::npos) << bad;
    }
  }
}

TEST(FormatTest, MatchesPyTorchFormatSize) {
  // PyTorch's format_size: <= 1024 in bytes, then KiB/MiB/GiB with two decimals.
  EXPECT_EQ(FormatBytesLikePyTorch(1024), "1024 bytes");
  EXPECT_EQ(FormatBytesLikePyTorch(1048576), "1024.00 KiB");
  EXPECT_EQ(FormatBytesLikePyTorch(20 * kMiB), "20.00 MiB");
  EXPECT_EQ(FormatBytesLikePyTorch(kGiB), "1024.00 MiB");
  EXPECT_EQ(FormatBytesLikePyTorch(3 * kGiB / 2), "1.50 GiB");
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(20 * kMiB), "20.0 MiB");
  EXPECT_EQ(FormatAddress(0x7f0000000000), "0x7f0000000000");
}

}  // namespace
}  // namespace fragscope
