#include "common/units.h"

#include <cctype>
#include <cmath>
#include <string>

#include <fmt/format.h>

namespace fragscope {

Result<std::uint64_t> ParseSize(std::string_view text) {
  auto bad = [&](std::string_view why) {
    return Status::InvalidArgument(
        fmt::format("size '{}': {} (examples: 1048576, 512MiB, 1.5GiB, 40GB)", text, why));
  };
  std::size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  const std::size_t number_begin = i;
  bool seen_digit = false, seen_dot = false;
  while (i < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[i])) || (text[i] == '.' && !seen_dot))) {
    if (text[i] == '.')
      seen_dot = true;
    else
      seen_digit = true;
    ++i;
  }
  if (!seen_digit) return bad("expected a number");
  const std::string number(text.substr(number_begin, i - number_begin));
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  std::string unit;
  for (; i < text.size(); ++i) {
    if (std::isspace(static_cast<unsigned char>(text[i]))) break;
    unit.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(text[i]))));
  }
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  if (i != text.size()) return bad("unexpected text after the unit");

  long double multiplier = 1;
  if (unit.empty() || unit == "b" || unit == "bytes")
    multiplier = 1;
  else if (unit == "k" || unit == "kib")
    multiplier = 1024.0L;
  else if (unit == "m" || unit == "mib")
    multiplier = 1024.0L * 1024;
  else if (unit == "g" || unit == "gib")
    multiplier = 1024.0L * 1024 * 1024;
  else if (unit == "t" || unit == "tib")
    multiplier = 1024.0L * 1024 * 1024 * 1024;
  else if (unit == "kb")
    multiplier = 1e3L;
  else if (unit == "mb")
    multiplier = 1e6L;
  else if (unit == "gb")
    multiplier = 1e9L;
  else if (unit == "tb")
    multiplier = 1e12L;
  else
    return bad(fmt::format("unknown unit '{}'", unit));

  const long double value = std::strtold(number.c_str(), nullptr) * multiplier;
  if (!std::isfinite(static_cast<double>(value)) || value >= 18446744073709551615.0L) {
    return bad("too large");
  }
  const long double rounded = std::floor(value);
  if (rounded != value) return bad("not a whole number of bytes");
  return static_cast<std::uint64_t>(rounded);
}

std::string FormatBytesLikePyTorch(std::uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes <= 1024) return fmt::format("{} bytes", bytes);
  if (bytes <= kMiB) return fmt::format("{:.2f} KiB", b / 1024.0);
  if (bytes <= kGiB) return fmt::format("{:.2f} MiB", b / (1024.0 * 1024.0));
  return fmt::format("{:.2f} GiB", b / (1024.0 * 1024.0 * 1024.0));
}

std::string FormatBytes(std::uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes < kKiB) return fmt::format("{} B", bytes);
  if (bytes < kMiB) return fmt::format("{:.1f} KiB", b / 1024.0);
  if (bytes < kGiB) return fmt::format("{:.1f} MiB", b / (1024.0 * 1024.0));
  return fmt::format("{:.2f} GiB", b / (1024.0 * 1024.0 * 1024.0));
}

std::string FormatAddress(std::uint64_t addr) { return fmt::format("{:#x}", addr); }

}  // namespace fragscope
