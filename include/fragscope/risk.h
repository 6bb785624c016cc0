// RiskLevel: how close a device is to an out-of-memory failure, as the forecaster judges it
// (docs/forecast.md). Shared by the forecaster, the agent protocol, the exporter and alerts.
//
// Thread safety: plain values.
#ifndef FRAGSCOPE_RISK_H_
#define FRAGSCOPE_RISK_H_

#include <cstdint>
#include <optional>
#include <string_view>

namespace fragscope {

/// The horizon of the OOM risk that the live views, /api/v1/processes and the daemon's alert
/// rules quote: P(an OOM within this many steps).
inline constexpr std::uint64_t kHeadlineRiskHorizonSteps = 100;

/// Ordered: a larger value is a worse level. kUnknown: no forecast available (yet).
enum class RiskLevel { kUnknown = 0, kOk = 1, kWatch = 2, kWarning = 3, kCritical = 4 };

/// "unknown", "ok", "watch", "warning", "critical".
constexpr std::string_view RiskLevelName(RiskLevel level) {
  switch (level) {
    case RiskLevel::kOk:
      return "ok";
    case RiskLevel::kWatch:
      return "watch";
    case RiskLevel::kWarning:
      return "warning";
    case RiskLevel::kCritical:
      return "critical";
    case RiskLevel::kUnknown:
      break;
  }
  return "unknown";
}

/// The level named `name` (as RiskLevelName prints it); nullopt for anything else.
constexpr std::optional<RiskLevel> ParseRiskLevel(std::string_view name) {
  for (RiskLevel level : {RiskLevel::kUnknown, RiskLevel::kOk, RiskLevel::kWatch,
                          RiskLevel::kWarning, RiskLevel::kCritical}) {
    if (RiskLevelName(level) == name) return level;
  }
  return std::nullopt;
}

}  // namespace fragscope

#endif  // FRAGSCOPE_RISK_H_
