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

/// Parses "123", "512MiB", "1.5GiB", "40GB", "2 KiB", "80g" (k/m/g/t = binary units, KB/MB/GB/TB
/// = decimal, KiB.. binary). Errors name the text and say what was expected.
Result<std::uint64_t> ParseSize(std::string_view text);

/// PyTorch's format_size: "<n> bytes" up to 1024, then KiB up to 1 MiB, MiB up to 1 GiB, else
/// GiB, with two decimals ("20.00 MiB").
std::string FormatBytesLikePyTorch(std::uint64_t bytes);

/// Compact human form for tables: "0 B", "512 B", "1.5 KiB", "20.0 MiB", "1.25 GiB".
std::string FormatBytes(std::uint64_t bytes);

/// "0x7f3a00000000".
std::string FormatAddress(std::uint64_t addr);

}  // namespace fragscope

#endif  // FRAGSCOPE_COMMON_UNITS_H_
