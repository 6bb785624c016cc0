#include "sinks/report/check_report.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/terminal_text.h"

namespace fragscope::sinks {
namespace {

using Json = nlohmann::ordered_json;
using analysis::CheckItem;
using analysis::CheckOutcome;

std::string Paint(std::string_view text, const char* code, bool color) {
  if (!color) return std::string(text);
  return fmt::format("\x1b[{}m{}\x1b[0m", code, text);
}

}  // namespace

std::string RenderCheckText(const analysis::CheckResult& result, bool color) {
  std::string out;
  const std::size_t failed = result.failed();
  std::size_t checked = 0;
  for (const CheckItem& i : result.items) checked += i.outcome != CheckOutcome::kSkipped;
  out += fmt::format("fragscope check: {} — {} ({}; {} of {} checks failed)\n",
                     failed == 0 ? Paint("PASS", "32;1", color) : Paint("FAIL", "31;1", color),
                     TerminalSafe(result.source), result.mode, failed, checked);
  std::int32_t device = -1;
  for (const CheckItem& i : result.items) {
    if (i.device != device) {
      device = i.device;
      out += fmt::format("device {}\n", device);
    }
    const std::string outcome = i.outcome == CheckOutcome::kFail   ? Paint("FAIL", "31;1", color)
                                : i.outcome == CheckOutcome::kPass ? Paint("pass", "32", color)
                                                                   : Paint("skip", "2", color);
    std::string line = fmt::format("  {}  {:<14}", outcome, i.name);
    if (i.outcome == CheckOutcome::kSkipped) {
      // What was measured (if anything), and why it was not checked.
      if (!i.measured.empty())
        line += fmt::format(" {}  (not checked: {})", i.measured, TerminalSafe(i.detail));
      else
        line += " " + TerminalSafe(i.detail);
      out += line + "\n";
      continue;
    }
    line += " " + i.measured;
    if (!i.limit.empty()) line += fmt::format("  [{}]", i.limit);
    out += line + "\n";
    // Failures say why; a passed baseline says how the run compares.
    if (!i.detail.empty() && (i.outcome == CheckOutcome::kFail || i.name == "baseline")) {
      out += fmt::format("        {}\n", TerminalSafe(i.detail));
    }
  }
  for (const std::string& n : result.notes) out += "note: " + TerminalSafe(n) + "\n";
  if (failed > 0) {
    out +=
        "exit status 1: a check failed (`fragscope check --help` lists the limits; "
        "`fragscope analyze`/`replay` show the whole run)\n";
  }
  return out;
}

std::string RenderCheckJson(const analysis::CheckResult& result) {
  Json j;
  j["schema"] = kCheckSchemaName;
  j["version"] = kCheckSchemaVersion;
  j["source"] = result.source;
  j["mode"] = result.mode;
  j["verdict"] = result.passed() ? "pass" : "fail";
  j["failed"] = result.failed();
  Json checks = Json::array();
  for (const CheckItem& i : result.items) {
    Json c;
    c["device"] = i.device;
    c["name"] = i.name;
    c["outcome"] = i.outcome == CheckOutcome::kFail   ? "fail"
                   : i.outcome == CheckOutcome::kPass ? "pass"
                                                      : "skipped";
    c["measured"] = i.measured;
    c["limit"] = i.limit;
    c["detail"] = i.detail;
    checks.push_back(std::move(c));
  }
  j["checks"] = std::move(checks);
  j["notes"] = result.notes;
  return j.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

}  // namespace fragscope::sinks
