#include "common/keyed_hash.h"

#include <string>

#include <gtest/gtest.h>

namespace fragscope {
namespace {

std::string Bytes(std::size_t n) {
  std::string s;
  for (std::size_t i = 0; i < n; ++i) s.push_back(static_cast<char>(i));
  return s;
}

// SipHash-2-4's published example (Aumasson and Bernstein, appendix A): key 00..0f, the 15
// bytes 00..0e.
TEST(KeyedHashTest, SipHash24MatchesThePublishedExample) {
  const std::uint64_t k0 = 0x0706050403020100ULL, k1 = 0x0f0e0d0c0b0a0908ULL;
  EXPECT_EQ(SipHash(k0, k1, Bytes(15), 2, 4), 0xa129ca6149be45e5ULL);
}

// The reference's vectors for the empty message and for 8 bytes (one whole word, so the
// length-only last block), which exercise both ends of the message loop.
TEST(KeyedHashTest, SipHash24MatchesTheReferenceVectors) {
  const std::uint64_t k0 = 0x0706050403020100ULL, k1 = 0x0f0e0d0c0b0a0908ULL;
  EXPECT_EQ(SipHash(k0, k1, "", 2, 4), 0x726fdb47dd0e0e31ULL);
  EXPECT_EQ(SipHash(k0, k1, Bytes(8), 2, 4), 0x93f5f5799a932462ULL);
}

TEST(KeyedHashTest, TheKeyChangesTheHashAndAMapFindsByView) {
  EXPECT_NE(SipHash(1, 2, "fragscope"), SipHash(1, 3, "fragscope"));
  EXPECT_EQ(ProcessKeyedHash("abc"), ProcessKeyedHash(std::string("abc")));
  KeyedStringMap<int> map;
  map["a"] = 1;
  map["b"] = 2;
  ASSERT_NE(map.find(std::string_view("b")), map.end());
  EXPECT_EQ(map.find(std::string_view("b"))->second, 2);
  EXPECT_EQ(map.find(std::string_view("c")), map.end());
}

}  // namespace
}  // namespace fragscope
