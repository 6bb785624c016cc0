#include "sinks/html/packed_ints.h"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace fragscope::sinks {
namespace {

TEST(PackedIntsTest, DigitsFollowTheDocumentedLayout) {
  // docs/report.md: 5 bits a digit, least significant first, digits 32..63 continue.
  PackedInts p;
  p.Put(0);
  p.Put(31);
  p.Put(32);    // 0 with "more", then 1
  p.Put(1025);  // 1 with "more", 0 with "more", then 1
  EXPECT_EQ(p.text(), "AfgBhgB");
  const auto back = UnpackInts(p.text());
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(*back, (std::vector<std::uint64_t>{0, 31, 32, 1025}));
}

TEST(PackedIntsTest, RoundTripsAtTheEdges) {
  const std::uint64_t address = (std::uint64_t{1} << 47) + 12345;
  const std::uint64_t exact_in_js = (std::uint64_t{1} << 53) - 1;
  const std::uint64_t most = std::numeric_limits<std::uint64_t>::max();
  const std::vector<std::uint64_t> values = {0,    1,       31,      32,          1023,
                                             1024, 2097152, address, exact_in_js, most};
  PackedInts p;
  for (const std::uint64_t v : values) p.Put(v);
  EXPECT_EQ(UnpackInts(p.text()), values);
  for (const char c : p.text()) {
    EXPECT_NE(c, '<');
    EXPECT_NE(c, '"');
    EXPECT_NE(c, '\\');
  }
}

TEST(PackedIntsTest, SignedNumbersZigzag) {
  const std::vector<std::int64_t> values = {0,
                                            -1,
                                            1,
                                            -2,
                                            2,
                                            -1234567,
                                            1234567,
                                            std::numeric_limits<std::int64_t>::min(),
                                            std::numeric_limits<std::int64_t>::max()};
  PackedInts p;
  for (const std::int64_t v : values) p.PutSigned(v);
  const auto back = UnpackInts(p.text());
  ASSERT_TRUE(back.has_value());
  ASSERT_EQ(back->size(), values.size());
  for (std::size_t i = 0; i < values.size(); ++i) EXPECT_EQ(Unzigzag((*back)[i]), values[i]);
  EXPECT_EQ(Zigzag(0), 0u);
  EXPECT_EQ(Zigzag(-1), 1u);
  EXPECT_EQ(Zigzag(1), 2u);
}

TEST(PackedIntsTest, ReaderRefusesBadText) {
  EXPECT_FALSE(UnpackInts("g").has_value());                         // a number cut short
  EXPECT_FALSE(UnpackInts("A<A").has_value());                       // not a digit
  EXPECT_FALSE(UnpackInts(std::string(14, 'g') + "A").has_value());  // beyond 64 bits
  EXPECT_EQ(UnpackInts(""), std::vector<std::uint64_t>{});
}

}  // namespace
}  // namespace fragscope::sinks
