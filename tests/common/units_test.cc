#include "common/units.h"

#include <cmath>
#include <cstdint>
#include <string>

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

// Sizes as PyTorch and fragscope print them ("21.94 GiB") read back: the nearest byte.
TEST(ParseSizeTest, AcceptsFractionalSizesWithUnits) {
  EXPECT_EQ(*ParseSize("21.94GiB"), 23557895619u);   // 21.94 × 2^30 = 23557895618.56
  EXPECT_EQ(*ParseSize("11.03 GiB"), 11843372319u);  // 11.03 × 2^30 = 11843372318.72
  EXPECT_EQ(*ParseSize("20.00 MiB"), 20u * kMiB);
  EXPECT_EQ(*ParseSize("1024.00 KiB"), kMiB);
  EXPECT_EQ(*ParseSize("512 bytes"), 512u);
  EXPECT_EQ(*ParseSize("0.5KB"), 500u);
  // What FormatBytesLikePyTorch prints parses back to within half a unit of its last digit.
  for (std::uint64_t bytes :
       {std::uint64_t{3} * kGiB / 2 + 12345, 79u * kGiB + 777, 5u * kMiB + 1}) {
    const std::string printed = FormatBytesLikePyTorch(bytes);
    Result<std::uint64_t> back = ParseSize(printed);
    ASSERT_TRUE(back.ok()) << printed;
    const double unit = bytes > kGiB ? kGiB : kMiB;
    EXPECT_LE(std::abs(static_cast<double>(*back) - static_cast<double>(bytes)), 0.005 * unit)
        << printed;
  }
  // A bare number is a byte count: whole bytes only.
  EXPECT_FALSE(ParseSize("2.5").ok());
}

TEST(ParseCapacityTest, ABareNumberBelowOneMebibyteIsRefusedWithAHint) {
  Result<ParsedCapacity> c = ParseCapacity("40");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("40GiB"), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find("40 bytes"), std::string::npos) << c.status().message();
  EXPECT_EQ(ParseCapacity("1048576")->bytes, kMiB);        // a byte count of a plausible size
  EXPECT_EQ(ParseCapacity("512KiB")->bytes, 512u * kKiB);  // a unit says it is meant
  EXPECT_FALSE(ParseCapacity("nonsense").ok());
}

TEST(ParseCapacityTest, ADecimalUnitGetsANote) {
  Result<ParsedCapacity> c = ParseCapacity("40GB");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->bytes, 40'000'000'000u);
  EXPECT_NE(c->note.find("40GiB = 42949672960 bytes"), std::string::npos) << c->note;
  EXPECT_NE(c->note.find("decimal"), std::string::npos) << c->note;
  Result<ParsedCapacity> spaced = ParseCapacity("80 GB");
  ASSERT_TRUE(spaced.ok());
  EXPECT_NE(spaced->note.find("80GiB"), std::string::npos) << spaced->note;
  EXPECT_EQ(ParseCapacity("40GiB")->note, "");
  EXPECT_EQ(ParseCapacity("40g")->note, "");
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

namespace fragscope {
namespace {

// Issue 29, item 7: the figures of one sentence share FormatBytes' unit and rounding (half to
// even), and a difference taken in printed steps adds up.
TEST(SentenceBytesTest, OneUnitAndOneRoundingForASentence) {
  const SentenceBytes mib(67'000'000);  // 63.9 MiB: the sentence is in MiB, one decimal
  EXPECT_EQ(mib.Steps(67'000'000), 639u);
  EXPECT_EQ(mib.Steps(32'768'000), 312u);  // 31.25 MiB: a tie, to the even digit
  EXPECT_EQ(mib.Format(639 - 312), "32.7 MiB");
  EXPECT_EQ(mib.Format(mib.Steps(512 * kKiB)), "0.5 MiB");  // a smaller figure, same unit
  EXPECT_EQ(FormatBytes(32'768'000), mib.Format(mib.Steps(32'768'000)));  // FormatBytes agrees
  const SentenceBytes gib(3 * kGiB);
  EXPECT_EQ(gib.Format(gib.Steps(kGiB + kGiB / 100)), "1.01 GiB");
  EXPECT_EQ(gib.Format(gib.Steps(5 * kMiB)), "0.00 GiB");
  const SentenceBytes bytes(1000);
  EXPECT_EQ(bytes.Format(bytes.Steps(999)), "999 B");
}

}  // namespace
}  // namespace fragscope
