#include "sinks/html/packed_ints.h"

namespace fragscope::sinks {
namespace {

constexpr std::string_view kDigits =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
constexpr std::uint64_t kMore = 32;  // a digit >= kMore: more digits follow

int DigitValue(char c) {
  const std::size_t at = kDigits.find(c);
  return at == std::string_view::npos ? -1 : static_cast<int>(at);
}

}  // namespace

void PackedInts::Put(std::uint64_t value) {
  while (value >= kMore) {
    text_ += kDigits[kMore + (value & (kMore - 1))];
    value >>= 5;
  }
  text_ += kDigits[value];
}

std::uint64_t Zigzag(std::int64_t value) {
  // Without signed overflow: -1 - value is >= 0 for a negative value.
  return value >= 0 ? 2 * static_cast<std::uint64_t>(value)
                    : 2 * static_cast<std::uint64_t>(-1 - value) + 1;
}

void PackedInts::PutSigned(std::int64_t value) { Put(Zigzag(value)); }

std::optional<std::vector<std::uint64_t>> UnpackInts(std::string_view text) {
  std::vector<std::uint64_t> out;
  std::uint64_t value = 0;
  int shift = 0;
  for (const char c : text) {
    const int d = DigitValue(c);
    if (d < 0 || shift > 60) return std::nullopt;
    const auto bits = static_cast<std::uint64_t>(d) & (kMore - 1);
    if (shift == 60 && bits > 0xF) return std::nullopt;  // past bit 63
    value |= bits << shift;
    if (static_cast<std::uint64_t>(d) >= kMore) {
      shift += 5;
      continue;
    }
    out.push_back(value);
    value = 0;
    shift = 0;
  }
  if (shift != 0) return std::nullopt;
  return out;
}

std::int64_t Unzigzag(std::uint64_t value) {
  const auto half = static_cast<std::int64_t>(value >> 1);
  return (value & 1) != 0 ? -1 - half : half;
}

}  // namespace fragscope::sinks
