#include "probe_command.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "common/terminal_text.h"
#include "common/units.h"
#include "fragscope/risk.h"
#include "http_get.h"

namespace fragscope::cli {
namespace {

// The most of a /metrics body the probe reads: ten times the documented worst page
// (docs/exporter.md, "Limits and safety"); an endpoint that sends more is not the daemon.
constexpr std::size_t kMaxBodyBytes = 64 << 20;

enum ProbeStatus { kOk = 0, kWarning = 1, kCritical = 2, kUnknown = 3 };
constexpr std::string_view kStatusName[] = {"OK", "WARNING", "CRITICAL", "UNKNOWN"};

struct ProbeFlags {
  std::string url = "http://127.0.0.1:9464/metrics";
  double timeout = 2.0;
  // The ratio alone says nothing about risk (a healthy job caches 80-90% of what it reserves
  // for reuse): it sets a level only when the user gives a threshold.
  std::optional<double> warning_fragmentation;
  std::optional<double> critical_fragmentation;
  bool json = false;
};

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

// One exposition line `name{a="x",b="y"} value [timestamp]`; nullopt for comments, blanks and
// anything malformed (skipped: the probe reports what it can read).
std::optional<Sample> ParseLine(std::string_view line) {
  if (line.empty() || line.front() == '#') return std::nullopt;
  Sample s;
  std::size_t i = 0;
  while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
  s.name = std::string(line.substr(0, i));
  if (i < line.size() && line[i] == '{') {
    ++i;
    while (i < line.size() && line[i] != '}') {
      const std::size_t eq = line.find('=', i);
      if (eq == std::string_view::npos || eq + 1 >= line.size() || line[eq + 1] != '"')
        return std::nullopt;
      std::string key(line.substr(i, eq - i));
      std::string value;
      std::size_t j = eq + 2;
      for (; j < line.size() && line[j] != '"'; ++j) {
        if (line[j] == '\\' && j + 1 < line.size()) {
          ++j;
          value += line[j] == 'n' ? '\n' : line[j];
        } else {
          value += line[j];
        }
      }
      if (j >= line.size()) return std::nullopt;
      s.labels[key] = value;
      i = j + 1;
      if (i < line.size() && line[i] == ',') ++i;
    }
    if (i >= line.size()) return std::nullopt;
    ++i;  // '}'
  }
  while (i < line.size() && line[i] == ' ') ++i;
  std::size_t end = line.find(' ', i);
  const std::string number(line.substr(i, end == std::string_view::npos ? end : end - i));
  try {
    std::size_t used = 0;
    s.value = std::stod(number, &used);
    if (used != number.size()) return std::nullopt;
  } catch (const std::exception&) {
    return std::nullopt;
  }
  return s;
}

// What the probe reports for one process series (pid, device).
struct Series {
  std::map<std::string, std::string> labels;
  std::optional<double> level, fragmentation, largest_free, largest_request, steps_to_oom,
      max_allocatable;
};

std::string Key(const std::map<std::string, std::string>& labels) {
  auto get = [&](const char* k) {
    auto it = labels.find(k);
    return it == labels.end() ? std::string() : it->second;
  };
  return get("pid") + " " + get("UUID") + " " + get("device_uuid");
}

std::string Where(const Series& s) {
  auto get = [&](const char* k) {
    auto it = s.labels.find(k);
    return it == s.labels.end() ? std::string("?") : it->second;
  };
  return fmt::format("rank {} pid {} gpu {}", get("rank"), get("pid"), get("gpu"));
}

std::string Fixed(double v) { return fmt::format("{:.3f}", v); }

int Finish(const ProbeFlags& flags, ProbeStatus status, const std::string& message,
           const std::vector<std::string>& perf, const nlohmann::json& details) {
  if (flags.json) {
    nlohmann::json out = details;
    out["status"] = kStatusName[status];
    out["code"] = static_cast<int>(status);
    out["message"] = message;
    out["perfdata"] = perf;
    WriteReport(out.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n",
                ReportForm::kJson);
  } else {
    // One status line: the daemon's labels and the URL are escaped, newlines included. A '|'
    // starts the performance data for Nagios, so one inside the text (a label value, the URL)
    // is written %7C: the perfdata stay the part after the one separator we write.
    std::string text;
    for (char ch : message) {
      if (ch == '|') {
        text += "%7C";
      } else {
        text += ch;
      }
    }
    std::string line = fmt::format("FRAGSCOPE {} - {}", kStatusName[status], text);
    if (!perf.empty()) line += " | " + fmt::format("{}", fmt::join(perf, " "));
    WriteReport(TerminalSafe(line) + "\n", ReportForm::kText);
  }
  return status;
}

int RunProbe(const ProbeFlags& flags) {
  // "http://host:port/path": httplib takes scheme and authority together, the path apart.
  const std::size_t scheme = flags.url.find("://");
  const std::size_t slash = flags.url.find('/', scheme == std::string::npos ? 0 : scheme + 3);
  if (scheme == std::string::npos || flags.url.compare(0, scheme, "http") != 0) {
    return Finish(flags, kUnknown,
                  fmt::format("--url '{}': expected http://HOST:PORT/metrics", flags.url), {}, {});
  }
  const std::string base = flags.url.substr(0, slash);
  const std::string path = slash == std::string::npos ? "/metrics" : flags.url.substr(slash);
  const HttpGetResult got = HttpGet(base, path, flags.timeout, kMaxBodyBytes);
  if (got.outcome == HttpGetResult::Outcome::kTooBig) {
    return Finish(flags, kUnknown,
                  fmt::format("{} sent more than {} MiB: not a fragscope daemon's page", flags.url,
                              kMaxBodyBytes >> 20),
                  {}, {});
  }
  if (got.outcome == HttpGetResult::Outcome::kTimedOut) {
    return Finish(flags, kUnknown,
                  fmt::format("cannot read {}: no whole answer within --timeout {} s (is "
                              "`fragscope serve` running?)",
                              flags.url, flags.timeout),
                  {}, {});
  }
  if (got.outcome == HttpGetResult::Outcome::kFailed) {
    return Finish(flags, kUnknown,
                  fmt::format("cannot read {}: {} (is `fragscope serve` "
                              "running?)",
                              flags.url, got.error),
                  {}, {});
  }
  if (got.status != 200) {
    return Finish(flags, kUnknown, fmt::format("{} answered HTTP {}", flags.url, got.status), {},
                  {});
  }
  const std::string& body = got.body;
  std::map<std::string, Series> series;
  bool daemon_seen = false;
  std::string_view rest = body;
  while (!rest.empty()) {
    const std::size_t nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    std::optional<Sample> s = ParseLine(line);
    if (!s) continue;
    if (s->name.rfind("fragscope_", 0) == 0) daemon_seen = true;
    std::optional<double> Series::*field = nullptr;
    if (s->name == "fragscope_process_forecast_level") field = &Series::level;
    if (s->name == "fragscope_process_fragmentation_ratio") field = &Series::fragmentation;
    if (s->name == "fragscope_process_largest_free_block_bytes") field = &Series::largest_free;
    if (s->name == "fragscope_process_largest_request_bytes") field = &Series::largest_request;
    if (s->name == "fragscope_process_steps_to_oom") field = &Series::steps_to_oom;
    if (s->name == "fragscope_process_max_allocatable_bytes") field = &Series::max_allocatable;
    if (field == nullptr) continue;
    Series& one = series[Key(s->labels)];
    if (one.labels.empty()) one.labels = s->labels;
    one.*field = s->value;
  }
  if (!daemon_seen) {
    return Finish(flags, kUnknown, fmt::format("{} has no fragscope metrics", flags.url), {}, {});
  }
  // The level comes from the risk of an OOM: the forecaster's level (the calibrated OOM risk),
  // and whether the largest request still fits at all (max allocatable below the largest
  // recent request: the next one fails). The fragmentation ratio is information; it sets a
  // level only against thresholds the user gave.
  const Series* worst = nullptr;
  double max_frag = 0;
  const Series* frag_worst = nullptr;
  const Series* no_fit = nullptr;  // the largest request no longer fits
  for (const auto& [key, s] : series) {
    if (worst == nullptr || s.level.value_or(0) > worst->level.value_or(0)) worst = &s;
    if (s.fragmentation && *s.fragmentation >= max_frag) {
      max_frag = *s.fragmentation;
      frag_worst = &s;
    }
    if (s.max_allocatable && s.largest_request && *s.largest_request > 0 &&
        *s.max_allocatable < *s.largest_request && no_fit == nullptr) {
      no_fit = &s;
    }
  }
  const int level = worst ? static_cast<int>(worst->level.value_or(0)) : 0;
  ProbeStatus status = kOk;
  if (level >= static_cast<int>(RiskLevel::kCritical))
    status = kCritical;
  else if (level >= static_cast<int>(RiskLevel::kWarning))
    status = kWarning;
  if (no_fit != nullptr) status = kCritical;
  const bool frag_critical =
      flags.critical_fragmentation && max_frag >= *flags.critical_fragmentation;
  const bool frag_warning = flags.warning_fragmentation && max_frag >= *flags.warning_fragmentation;
  if (frag_critical)
    status = kCritical;
  else if (frag_warning && status == kOk)
    status = kWarning;

  const std::string level_name(RiskLevelName(static_cast<RiskLevel>(std::clamp(level, 0, 4))));
  std::string message;
  if (series.empty()) {
    message = "no training process reports to the daemon";
  } else {
    message =
        fmt::format("{} process(es); worst risk {} ({})", series.size(), level_name, Where(*worst));
    if (worst->steps_to_oom) message += fmt::format(", ~{:.0f} steps to OOM", *worst->steps_to_oom);
    if (no_fit != nullptr) {
      message += fmt::format("; the largest request ({}) no longer fits: max allocatable {} ({})",
                             FormatBytes(static_cast<std::uint64_t>(*no_fit->largest_request)),
                             FormatBytes(static_cast<std::uint64_t>(*no_fit->max_allocatable)),
                             Where(*no_fit));
    }
    if (frag_worst) {
      message += fmt::format("; fragmentation {:.2f} ({}){}", max_frag, Where(*frag_worst),
                             frag_critical || frag_warning
                                 ? " over your threshold"
                                 : " (information: cached for reuse, not a risk by itself)");
    }
  }
  auto threshold = [](const std::optional<double>& t) { return t ? Fixed(*t) : std::string(); };
  std::vector<std::string> perf = {
      fmt::format("'risk'={};3;4;0;4", level),
      fmt::format("'fragmentation'={};{};{};0;1", Fixed(max_frag),
                  threshold(flags.warning_fragmentation), threshold(flags.critical_fragmentation)),
      fmt::format("'processes'={};;;0;", series.size())};
  nlohmann::json details = {{"url", flags.url},
                            {"processes", series.size()},
                            {"worst_level", level_name},
                            {"max_fragmentation", max_frag}};
  if (worst != nullptr && worst->largest_free && worst->largest_request) {
    perf.push_back(fmt::format("'largest_free_block'={:.0f}B;;;0;", *worst->largest_free));
    perf.push_back(fmt::format("'largest_request'={:.0f}B;;;0;", *worst->largest_request));
    details["largest_free_block_bytes"] = *worst->largest_free;
    details["largest_request_bytes"] = *worst->largest_request;
  }
  if (worst != nullptr) details["worst"] = worst->labels;
  return Finish(flags, status, message, perf, details);
}

constexpr std::string_view kProbeFooter =
    R"(Prints one line for a monitoring system's plugin, from the node daemon's /metrics:
  FRAGSCOPE WARNING - 8 process(es); worst risk warning (rank 3 pid 4242 gpu 3), ~120 steps to
  OOM; fragmentation 0.41 (rank 3 ...) (information: ...) | 'risk'=3;3;4;0;4 'fragmentation'=0.410;;;0;1 ...
Status comes from the risk of an OOM: CRITICAL when a process's forecast (its calibrated OOM
risk) is critical or its largest recent request no longer fits (max allocatable below it);
WARNING at a warning forecast; else OK. The fragmentation ratio is information: a healthy job
caches most of what it reserves. It sets a level only with --warning-fragmentation or
--critical-fragmentation.
Exit 0/1/2/3 = OK/WARNING/CRITICAL/UNKNOWN (UNKNOWN: the daemon cannot be read). Performance
data: 'label'=value[UOM];warn;crit;min;max. deploy/scout-plugin-fragscope.sh and
deploy/monitoring-examples.md use it. docs/live-monitoring.md.)";

}  // namespace

Command AddProbeCommand(CLI::App& app) {
  auto flags = std::make_shared<ProbeFlags>();
  CLI::App* sub =
      app.add_subcommand("probe", "One Nagios-style status line of the node daemon's state");
  sub->footer(std::string(kProbeFooter));
  sub->add_option("--url", flags->url,
                  "The daemon's metrics (default http://127.0.0.1:9464/metrics)")
      ->type_name("URL");
  sub->add_option("--timeout", flags->timeout,
                  "Seconds the whole exchange with the daemon may take (default 2)")
      ->check(CLI::Range(0.05, 60.0));
  sub->add_option("--warning-fragmentation", flags->warning_fragmentation,
                  "Fragmentation ratio that warns (default: none; the ratio alone is information)")
      ->transform(Fraction());
  sub->add_option("--critical-fragmentation", flags->critical_fragmentation,
                  "Fragmentation ratio that is critical (default: none)")
      ->transform(Fraction());
  sub->add_flag("--json", flags->json, "Print JSON instead of the status line (same exit code)");
  return Command{sub, [flags] { return RunProbe(*flags); }};
}

}  // namespace fragscope::cli
