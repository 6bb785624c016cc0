#include "model/allocator_rules.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <string_view>

#include <fmt/format.h>

#include "model/alloc_conf.h"

namespace fragscope::model {

std::uint64_t AllocatorRules::RoundSize(std::uint64_t request) const {
  if (request < kMinBlockSize) return kMinBlockSize;
  const int k = 63 - std::countl_zero(request);
  const int index = std::clamp(k - 20, 0, kRoundupIntervals - 1);
  const std::uint64_t divisions = roundup_power2_divisions[static_cast<std::size_t>(index)];
  if (divisions > 1 && request > kMinBlockSize * divisions) {
    if (std::has_single_bit(request)) return request;
    const std::uint64_t floor = std::bit_floor(request);
    const std::uint64_t step = floor >> (63 - std::countl_zero(divisions));
    if (step == 0) return floor << 1;
    const std::uint64_t rounded_down = request & ~(step - 1);
    return rounded_down == request ? request : rounded_down + step;
  }
  return kMinBlockSize * ((request + kMinBlockSize - 1) / kMinBlockSize);
}

std::uint64_t AllocatorRules::SegmentSize(std::uint64_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return kRoundLarge * ((rounded + kRoundLarge - 1) / kRoundLarge);
}

bool AllocatorRules::ShouldSplit(Pool pool, std::uint64_t block_size, std::uint64_t rounded) const {
  const std::uint64_t remaining = block_size - rounded;
  if (pool == Pool::kSmall || expandable_segments) return remaining >= kMinBlockSize;
  return rounded < max_split_size && remaining > kSmallSize;
}

std::uint64_t AllocatorRules::LargestRequestForNewSegment(std::uint64_t budget_bytes) {
  if (budget_bytes >= kMinLargeAlloc) return budget_bytes / kRoundLarge * kRoundLarge;
  if (budget_bytes >= kSmallBuffer) return kSmallSize;
  return 0;
}

namespace {

Result<std::uint64_t> ParseUnsigned(std::string_view key, std::string_view value) {
  std::uint64_t out = 0;
  auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), out);
  if (ec != std::errc() || ptr != value.data() + value.size()) {
    return Status::InvalidArgument(
        fmt::format("allocator setting {}: '{}' is not a non-negative integer", key, value));
  }
  return out;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '"')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '"')) s.remove_suffix(1);
  return s;
}

}  // namespace

Result<AllocatorRules> AllocatorRules::FromSettings(
    const std::vector<std::pair<std::string, std::string>>& settings) {
  AllocatorRules rules;
  for (const auto& [key, raw_value] : settings) {
    const std::string_view value = Trim(raw_value);
    if (key == "max_split_size_mb" || key == "max_split_size") {
      // Snapshots record max_split_size in bytes (-1 = unlimited); the conf string in MiB.
      if (value == "-1" || value.empty()) continue;
      auto parsed = ParseUnsigned(key, value);
      if (!parsed.ok()) return parsed.status();
      rules.max_split_size = key == "max_split_size" ? *parsed : *parsed * kMiB;
    } else if (key == "max_non_split_rounding_mb" || key == "max_non_split_rounding") {
      auto parsed = ParseUnsigned(key, value);
      if (!parsed.ok()) return parsed.status();
      rules.max_non_split_rounding = key == "max_non_split_rounding" ? *parsed : *parsed * kMiB;
    } else if (key == "expandable_segments") {
      if (value == "True" || value == "true" || value == "1") {
        rules.expandable_segments = true;
      } else if (value == "False" || value == "false" || value == "0") {
        rules.expandable_segments = false;
      } else {
        return Status::InvalidArgument(
            fmt::format("allocator setting expandable_segments: '{}' is not True or False", value));
      }
    } else if (key == "roundup_power2_divisions") {
      // A single value applies to every interval; a list ([1:2,...,>:4], the form snapshots
      // record) goes through the configuration parser.
      std::string_view v = value;
      if (!v.empty() && v.front() == '[') {
        Result<AllocatorConfig> config =
            ParseAllocatorConfig("roundup_power2_divisions:" + std::string(v));
        if (!config.ok()) {
          return Status::InvalidArgument("allocator setting " + config.status().message());
        }
        rules.roundup_power2_divisions = config->Rules().roundup_power2_divisions;
        continue;
      }
      auto parsed = ParseUnsigned(key, v);
      if (!parsed.ok()) return parsed.status();
      if (*parsed != 0 && !std::has_single_bit(*parsed)) {
        return Status::InvalidArgument(fmt::format(
            "allocator setting roundup_power2_divisions: {} is not a power of 2", *parsed));
      }
      rules.roundup_power2_divisions.fill(static_cast<std::uint32_t>(*parsed));
    }
  }
  return rules;
}

}  // namespace fragscope::model
