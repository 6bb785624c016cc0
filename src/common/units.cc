#include "common/units.h"

#include <algorithm>
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
  // With a unit, a fraction is a rounded figure ("21.94GiB"): the nearest byte. Bare, it is a
  // byte count and must be whole.
  if (multiplier == 1 && std::floor(value) != value) return bad("not a whole number of bytes");
  const long double rounded = std::floor(value + 0.5L);
  if (rounded >= 18446744073709551615.0L) return bad("too large");
  return static_cast<std::uint64_t>(rounded);
}

Result<ParsedCapacity> ParseCapacity(std::string_view text) {
  Result<std::uint64_t> bytes = ParseSize(text);
  if (!bytes.ok()) return bytes.status();
  ParsedCapacity out;
  out.bytes = *bytes;
  // The unit as written: the letters after the number.
  std::string unit;
  for (char c : text) {
    if (std::isalpha(static_cast<unsigned char>(c))) {
      unit.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
    }
  }
  if (unit.empty() && out.bytes < kMiB) {
    return Status::InvalidArgument(fmt::format(
        "size '{}': {} bytes is not a GPU's memory; write a unit: {}GiB (binary, as GPUs are "
        "sold and PyTorch prints) or {}GB (decimal); a bare number is a byte count",
        text, out.bytes, out.bytes, out.bytes));
  }
  if (unit == "kb" || unit == "mb" || unit == "gb" || unit == "tb") {
    std::string binary = unit;
    binary.insert(1, "i");
    binary[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(binary[0])));
    binary.back() = 'B';
    std::string trimmed(text);
    trimmed.erase(std::remove_if(trimmed.begin(), trimmed.end(),
                                 [](unsigned char c) { return std::isspace(c) != 0; }),
                  trimmed.end());
    const std::string number = trimmed.substr(0, trimmed.size() - unit.size());
    std::string binary_text = number + binary;
    Result<std::uint64_t> binary_bytes = ParseSize(binary_text);
    out.note = fmt::format(
        "'{}' is decimal: {} bytes ({}); a GPU sold as \"{} {}\" has {} = {} bytes, as "
        "PyTorch counts",
        text, out.bytes, FormatBytes(out.bytes), number,
        unit == "kb"   ? "KB"
        : unit == "mb" ? "MB"
        : unit == "gb" ? "GB"
                       : "TB",
        binary_text, binary_bytes.ok() ? std::to_string(*binary_bytes) : std::string("?"));
  }
  return out;
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

SentenceBytes::SentenceBytes(std::uint64_t largest) {
  // FormatBytes' choice: B; KiB and MiB with one decimal; GiB with two.
  if (largest >= kGiB) {
    unit_ = kGiB, scale_ = 100, name_ = "GiB";
  } else if (largest >= kMiB) {
    unit_ = kMiB, scale_ = 10, name_ = "MiB";
  } else if (largest >= kKiB) {
    unit_ = kKiB, scale_ = 10, name_ = "KiB";
  }
}

std::uint64_t SentenceBytes::Steps(std::uint64_t bytes) const {
  // round(bytes * scale / unit), half to even, without overflow for any uint64 below 2^57.
  const std::uint64_t whole = bytes / unit_;
  const std::uint64_t rest = bytes % unit_;
  const std::uint64_t num = rest * scale_;
  std::uint64_t steps = whole * scale_ + num / unit_;
  const std::uint64_t frac = num % unit_;
  if (frac * 2 > unit_ || (frac * 2 == unit_ && steps % 2 == 1)) ++steps;
  return steps;
}

std::string SentenceBytes::Format(std::uint64_t steps) const {
  if (scale_ == 1) return fmt::format("{} {}", steps, name_);
  const int decimals = scale_ == 100 ? 2 : 1;
  return fmt::format("{}.{:0{}} {}", steps / scale_, steps % scale_, decimals, name_);
}

std::string FormatAddress(std::uint64_t addr) { return fmt::format("{:#x}", addr); }

std::string FormatCount(std::uint64_t n) {
  const std::string digits = std::to_string(n);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i != 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

}  // namespace fragscope
