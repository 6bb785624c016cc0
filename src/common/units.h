// Byte sizes as people write them ("80GiB", "40GB", "512MiB") and as PyTorch prints them.
#ifndef FRAGSCOPE_COMMON_UNITS_H_
#define FRAGSCOPE_COMMON_UNITS_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "fragscope/status.h"

namespace fragscope {

inline constexpr std::uint64_t kKiB = std::uint64_t{1} << 10;
inline constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
inline constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;

/// Parses "123", "512MiB", "1.5GiB", "40GB", "2 KiB", "80g", "11.03 GiB" (k/m/g/t = binary
/// units, KB/MB/GB/TB = decimal, KiB.. binary; "bytes"/"B" = 1, as PyTorch prints). A number with
/// a unit may have a fraction and is rounded to the nearest byte (the form PyTorch and fragscope
/// print, "21.94GiB", is itself rounded); a bare number must be whole bytes. Errors name the
/// text and say what was expected.
Result<std::uint64_t> ParseSize(std::string_view text);

/// A device's memory size as a user writes it: ParseSize's grammar, plus what such a size
/// means.
struct ParsedCapacity {
  std::uint64_t bytes = 0;
  /// Set when the text used a decimal unit (KB/MB/GB/TB): GPUs sold as "40 GB" have 40 GiB,
  /// so the note says what was read and how to write the other ("40GB is 40000000000 bytes
  /// (37.25 GiB); a GPU sold as "40 GB" has 40GiB = 42949672960 bytes").
  std::string note;
};
/// ParseSize for a device capacity. A bare number below 1 MiB (`--capacity 40`) is refused with
/// a hint to write a unit: no GPU is that small, and it was meant as GiB.
Result<ParsedCapacity> ParseCapacity(std::string_view text);

/// PyTorch's format_size: "<n> bytes" up to 1024, then KiB up to 1 MiB, MiB up to 1 GiB, else
/// GiB, with two decimals ("20.00 MiB").
std::string FormatBytesLikePyTorch(std::uint64_t bytes);

/// Compact human form for tables: "0 B", "512 B", "1.5 KiB", "20.0 MiB", "1.25 GiB".
std::string FormatBytes(std::uint64_t bytes);

/// Figures of one sentence that must add up ("63.9 MiB was free, 32.7 MiB more than the
/// 31.2 MiB block"): all in the unit and decimals FormatBytes gives the sentence's largest
/// figure, each rounded half to even, and a sum or difference taken from the rounded values
/// (Steps), so the printed words add up whatever the rounding.
class SentenceBytes {
 public:
  explicit SentenceBytes(std::uint64_t largest);
  /// `bytes` in steps of the last printed digit, rounded half to even.
  std::uint64_t Steps(std::uint64_t bytes) const;
  /// "31.2 MiB" for a count of steps.
  std::string Format(std::uint64_t steps) const;

 private:
  std::uint64_t unit_ = 1;   // bytes per unit
  std::uint64_t scale_ = 1;  // 10^decimals
  const char* name_ = "B";
};

/// A count with thousands separators: 1234567 -> "1,234,567" (event counts, indices, steps).
std::string FormatCount(std::uint64_t n);

/// "0x7f3a00000000".
std::string FormatAddress(std::uint64_t addr);

}  // namespace fragscope

#endif  // FRAGSCOPE_COMMON_UNITS_H_
