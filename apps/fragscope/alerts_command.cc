#include "alerts_command.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "sinks/alerts/alert_config.h"
#include "sinks/alerts/alert_engine.h"
#include "sinks/alerts/hook_runner.h"
#include "sources/agent/agent_protocol.h"
#include "sources/trace/input_stream.h"

namespace fragscope::cli {
namespace {

constexpr std::string_view kAlertsDescription =
    "Check the node daemon's alert rules, and try them and their hooks on a sample";

constexpr std::string_view kAlertsFooter =
    R"(The rules file is TOML: [[rules]] thresholds on the forecast level and on metrics,
with a `for` duration, labels and hooks; [hooks.NAME] programs to run (argv, no shell) or
URLs to POST to; [delivery] rate limits and dry-run. docs/alerts.md has the format and
deploy/fragscope.toml.example a complete file. The daemon reads it with
`fragscope serve --alerts FILE` (add --dry-run-hooks to only log deliveries).

Examples:
  fragscope alerts check /etc/fragscope/fragscope.toml
  fragscope alerts test /etc/fragscope/fragscope.toml --sample sample.json --dry-run
  fragscope alerts test rules.toml --sample '{"pid": 42, "device_uuid": "GPU-1",
      "forecast_level": "critical", "fragmentation_ratio": 0.6}'

Exit status: 0 valid (check) / every hook delivered (test); 1 a hook failed; 2 bad
config, sample or usage.)";

constexpr std::string_view kTestFooter =
    R"(SAMPLE is a file or inline JSON: one agent sample (the agent protocol's payload, docs/formats.md:
pid, rank, job, device_uuid, reserved_bytes, ..., forecast_level as "ok".."critical"), or
{"samples": [...], "gpus": [{"uuid": "GPU-1", "index": 0, "memory_total_bytes": N,
"memory_used_bytes": N, "memory_free_bytes": N}]}. Repeat --sample for successive
evaluations --interval apart (counter increases need two). After the last one the samples
are assumed to hold for the longest `for` of any rule, so every rule whose condition is met
fires; --resolve then evaluates once with no samples, which resolves every firing alert.
Firing and resolved alerts are delivered to the rules' hooks (or only logged: --dry-run).

Examples:
  fragscope alerts test rules.toml --sample sample.json --dry-run
  fragscope alerts test rules.toml --sample before.json --sample after.json --interval 1m)";

struct AlertsFlags {
  std::string config;
  std::vector<std::string> samples;
  std::string interval = "30s";
  bool dry_run = false;
  bool resolve = false;
};

// ---- Reading a sample --------------------------------------------------------------------

struct SampleSet {
  std::vector<agent::AgentSample> samples;
  gpu::NodeGpuInfo gpus;
};

Status FieldError(std::string_view where, std::string_view key, std::string_view message) {
  return Status::InvalidArgument(fmt::format("{}: \"{}\": {}", where, key, message));
}

template <typename T>
Status ReadInteger(const nlohmann::json& obj, std::string_view where, const char* key, T* out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return Status::Ok();
  if (!it->is_number_integer()) return FieldError(where, key, "expected an integer");
  if (it->is_number_unsigned()) {
    auto v = it->get<std::uint64_t>();
    if (v > static_cast<std::uint64_t>(std::numeric_limits<T>::max())) {
      return FieldError(where, key, "out of range");
    }
    *out = static_cast<T>(v);
    return Status::Ok();
  }
  auto v = it->get<std::int64_t>();
  if (v < static_cast<std::int64_t>(std::numeric_limits<T>::min()) ||
      (v > 0 &&
       static_cast<std::uint64_t>(v) > static_cast<std::uint64_t>(std::numeric_limits<T>::max()))) {
    return FieldError(where, key, "out of range");
  }
  *out = static_cast<T>(v);
  return Status::Ok();
}

Status ReadText(const nlohmann::json& obj, std::string_view where, const char* key,
                std::string* out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return Status::Ok();
  if (!it->is_string()) return FieldError(where, key, "expected a string");
  *out = it->get<std::string>();
  return Status::Ok();
}

Result<agent::AgentSample> ReadSample(const nlohmann::json& obj, const std::string& where) {
  if (!obj.is_object()) return Status::InvalidArgument(where + ": expected a JSON object");
  static const std::vector<std::string> kKnown = {"pid",
                                                  "rank",
                                                  "job",
                                                  "run",
                                                  "architecture",
                                                  "device_uuid",
                                                  "device_index",
                                                  "step",
                                                  "time_us",
                                                  "reserved_bytes",
                                                  "allocated_bytes",
                                                  "active_bytes",
                                                  "requested_bytes",
                                                  "peak_reserved_bytes",
                                                  "peak_allocated_bytes",
                                                  "num_alloc_retries",
                                                  "num_ooms",
                                                  "cached_free_bytes",
                                                  "largest_free_block",
                                                  "max_allocatable",
                                                  "stranded_bytes",
                                                  "largest_request_bytes",
                                                  "fragmentation_ratio",
                                                  "free_block_count",
                                                  "free_block_bytes",
                                                  "forecast_level",
                                                  "steps_to_oom",
                                                  "version"};
  for (const auto& [key, value] : obj.items()) {
    if (std::find(kKnown.begin(), kKnown.end(), key) == kKnown.end()) {
      return FieldError(where, key, "unknown field (a typo would silently test nothing)");
    }
  }
  agent::AgentSample s;
  FRAGSCOPE_RETURN_IF_ERROR(ReadInteger(obj, where, "pid", &s.pid));
  FRAGSCOPE_RETURN_IF_ERROR(ReadInteger(obj, where, "rank", &s.rank));
  FRAGSCOPE_RETURN_IF_ERROR(ReadText(obj, where, "job", &s.job));
  FRAGSCOPE_RETURN_IF_ERROR(ReadText(obj, where, "run", &s.run));
  FRAGSCOPE_RETURN_IF_ERROR(ReadText(obj, where, "architecture", &s.architecture));
  FRAGSCOPE_RETURN_IF_ERROR(ReadText(obj, where, "device_uuid", &s.device_uuid));
  FRAGSCOPE_RETURN_IF_ERROR(ReadInteger(obj, where, "device_index", &s.device_index));
  FRAGSCOPE_RETURN_IF_ERROR(ReadInteger(obj, where, "step", &s.step));
  FRAGSCOPE_RETURN_IF_ERROR(ReadInteger(obj, where, "time_us", &s.time_us));
  const std::pair<const char*, std::uint64_t*> kBytes[] = {
      {"reserved_bytes", &s.reserved_bytes},
      {"allocated_bytes", &s.allocated_bytes},
      {"active_bytes", &s.active_bytes},
      {"requested_bytes", &s.requested_bytes},
      {"peak_reserved_bytes", &s.peak_reserved_bytes},
      {"peak_allocated_bytes", &s.peak_allocated_bytes},
      {"num_alloc_retries", &s.num_alloc_retries},
      {"num_ooms", &s.num_ooms},
      {"largest_request_bytes", &s.largest_request_bytes}};
  for (const auto& [key, field] : kBytes) {
    FRAGSCOPE_RETURN_IF_ERROR(ReadInteger(obj, where, key, field));
  }
  const std::pair<const char*, std::optional<std::uint64_t>*> kSummary[] = {
      {"cached_free_bytes", &s.cached_free_bytes},
      {"largest_free_block", &s.largest_free_block},
      {"max_allocatable", &s.max_allocatable},
      {"stranded_bytes", &s.stranded_bytes}};
  for (const auto& [key, field] : kSummary) {  // absent: unknown, as on the agent socket
    if (!obj.contains(key)) continue;
    std::uint64_t v = 0;
    FRAGSCOPE_RETURN_IF_ERROR(ReadInteger(obj, where, key, &v));
    *field = v;
  }
  if (auto it = obj.find("fragmentation_ratio"); it != obj.end()) {
    if (!it->is_number()) return FieldError(where, "fragmentation_ratio", "expected a number");
    s.fragmentation_ratio = it->get<double>();
  }
  agent::DeriveAgentSummary(&s);
  if (auto it = obj.find("forecast_level"); it != obj.end()) {
    std::optional<RiskLevel> level;
    if (it->is_string()) level = ParseRiskLevel(it->get<std::string>());
    if (!level) {
      return FieldError(where, "forecast_level",
                        "expected \"unknown\", \"ok\", \"watch\", \"warning\" or \"critical\"");
    }
    s.forecast_level = *level;
  }
  if (auto it = obj.find("steps_to_oom"); it != obj.end() && !it->is_null()) {
    std::int64_t steps = 0;
    FRAGSCOPE_RETURN_IF_ERROR(ReadInteger(obj, where, "steps_to_oom", &steps));
    s.steps_to_oom = steps;
  }
  return s;
}

Result<gpu::GpuInfo> ReadGpu(const nlohmann::json& obj, const std::string& where) {
  if (!obj.is_object()) return Status::InvalidArgument(where + ": expected a JSON object");
  gpu::GpuInfo g;
  for (const auto& [key, value] : obj.items()) {
    if (key != "uuid" && key != "index" && key != "memory_total_bytes" &&
        key != "memory_used_bytes" && key != "memory_free_bytes") {
      return FieldError(where, key, "unknown field");
    }
  }
  FRAGSCOPE_RETURN_IF_ERROR(ReadText(obj, where, "uuid", &g.uuid));
  if (g.uuid.empty()) return FieldError(where, "uuid", "missing (required)");
  auto optional = [&](const char* key, auto* out) -> Status {
    using T = typename std::remove_reference_t<decltype(*out)>::value_type;
    if (!obj.contains(key)) return Status::Ok();
    T v{};
    FRAGSCOPE_RETURN_IF_ERROR(ReadInteger(obj, where, key, &v));
    *out = v;
    return Status::Ok();
  };
  FRAGSCOPE_RETURN_IF_ERROR(optional("index", &g.index));
  FRAGSCOPE_RETURN_IF_ERROR(optional("memory_total_bytes", &g.memory_total_bytes));
  FRAGSCOPE_RETURN_IF_ERROR(optional("memory_used_bytes", &g.memory_used_bytes));
  FRAGSCOPE_RETURN_IF_ERROR(optional("memory_free_bytes", &g.memory_free_bytes));
  g.from_nvml = true;
  return g;
}

Result<SampleSet> ReadSampleSet(const std::string& arg) {
  std::string text = arg;
  std::string name = "--sample";
  std::size_t first = arg.find_first_not_of(" \t\r\n");
  if (first == std::string::npos || (arg[first] != '{' && arg[first] != '[')) {
    // Read once, as every input (a FIFO or <(...) works; /dev/zero stops at the limit).
    Result<std::string> content = sources::ReadWholeInput(arg, 16u << 20, "a sample file");
    if (!content.ok()) {
      if (content.status().code() == StatusCode::kNotFound) {
        return Status::NotFound(fmt::format("{}: cannot open the sample file", arg));
      }
      return content.status();
    }
    text = std::move(*content);
    name = arg;
  }
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return Status::InvalidArgument(name + ": not valid JSON");
  SampleSet set;
  if (doc.is_object() && (doc.contains("samples") || doc.contains("gpus"))) {
    for (const auto& [key, value] : doc.items()) {
      if (key != "samples" && key != "gpus") return FieldError(name, key, "unknown field");
    }
    if (auto it = doc.find("samples"); it != doc.end()) {
      if (!it->is_array()) return FieldError(name, "samples", "expected an array");
      for (std::size_t i = 0; i < it->size(); ++i) {
        Result<agent::AgentSample> s =
            ReadSample((*it)[i], fmt::format("{}: samples[{}]", name, i));
        if (!s.ok()) return s.status();
        set.samples.push_back(std::move(*s));
      }
    }
    if (auto it = doc.find("gpus"); it != doc.end()) {
      if (!it->is_array()) return FieldError(name, "gpus", "expected an array");
      for (std::size_t i = 0; i < it->size(); ++i) {
        Result<gpu::GpuInfo> g = ReadGpu((*it)[i], fmt::format("{}: gpus[{}]", name, i));
        if (!g.ok()) return g.status();
        set.gpus.gpus.push_back(std::move(*g));
      }
    }
    return set;
  }
  Result<agent::AgentSample> s = ReadSample(doc, name);
  if (!s.ok()) return s.status();
  set.samples.push_back(std::move(*s));
  return set;
}

// ---- check -------------------------------------------------------------------------------

// The rules file's strings (names, summaries, commands, URLs) are printed field by field with
// their control characters escaped (common/terminal_text.h), and the whole text once more.
std::string ConfigText(const sinks::AlertConfig& config) {
  std::string out = fmt::format("{} rule(s):\n", config.rules.size());
  for (const analysis::AlertRule& rule : config.rules) {
    out += fmt::format("  {}\n", TerminalSafe(sinks::DescribeRule(rule)));
  }
  out += fmt::format("{} hook(s):\n", config.hooks.size());
  for (const auto& [name, hook] : config.hooks) {
    std::string what = hook.kind == sinks::HookSpec::Kind::kExec
                           ? fmt::format("exec {}", fmt::join(hook.command, " "))
                           : fmt::format("webhook POST {}", hook.url);
    out += fmt::format("  {}: {} (timeout {})\n", TerminalSafe(name), TerminalSafe(what),
                       sinks::FormatAlertDuration(hook.timeout));
    if (hook.kind == sinks::HookSpec::Kind::kExec && access(hook.command[0].c_str(), X_OK) != 0) {
      out += fmt::format("    note: {} is not an executable file on this machine\n",
                         TerminalSafe(hook.command[0]));
    }
  }
  const sinks::DeliveryOptions& d = config.delivery;
  out += fmt::format("delivery: at most {} per rule and {} in all per {}; queue {}{}\n",
                     d.per_rule_limit, d.global_limit, sinks::FormatAlertDuration(d.rate_window),
                     d.queue_capacity, d.dry_run ? "; dry-run" : "");
  return out;
}

int RunAlertsCheck(const AlertsFlags& flags) {
  Result<sinks::AlertConfig> config = sinks::LoadAlertConfig(flags.config);
  if (!config.ok()) return BadInput(config.status().message());
  return WriteReport(ConfigText(*config) + fmt::format("{}: OK\n", TerminalSafe(flags.config)),
                     ReportForm::kText);
}

// ---- test --------------------------------------------------------------------------------

void PrintNotification(const sinks::AlertNotification& n) {
  std::string series;
  for (const auto& [k, v] : n.series) {
    series +=
        fmt::format("{}{}=\"{}\"", series.empty() ? "" : ",", TerminalSafe(k), TerminalSafe(v));
  }
  PrintSafe(stdout, fmt::format("{:<8} {} {{{}}} value={}\n", analysis::AlertStateName(n.state),
                                TerminalSafe(n.rule), series,
                                n.value ? fmt::format("{}", *n.value) : std::string("none")));
}

int RunTest(const AlertsFlags& flags) {
  Result<sinks::AlertConfig> config = sinks::LoadAlertConfig(flags.config);
  if (!config.ok()) return BadInput(config.status().message());
  std::optional<analysis::AlertDuration> interval = sinks::ParseAlertDuration(flags.interval);
  if (!interval)
    return BadInput(
        fmt::format("--interval: expected a duration like \"30s\", got \"{}\"", flags.interval));
  std::vector<SampleSet> sets;
  for (const std::string& arg : flags.samples) {
    Result<SampleSet> set = ReadSampleSet(arg);
    if (!set.ok()) return BadInput(set.status().message());
    sets.push_back(std::move(*set));
  }
  analysis::AlertDuration longest_for{0};
  for (const analysis::AlertRule& r : config->rules)
    longest_for = std::max(longest_for, r.for_duration);

  sinks::DeliveryOptions delivery = config->delivery;
  delivery.dry_run = delivery.dry_run || flags.dry_run;
  std::mutex log_mu;
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  sinks::AlertEngine engine(config->rules, host);
  int exit_code = kExitOk;
  std::size_t fired = 0;
  {
    sinks::HookRunner runner(config->hooks, delivery, [&](std::string_view line) {
      std::lock_guard<std::mutex> lock(log_mu);
      PrintSafe(stderr, TerminalSafe(line) + "\n");  // one log line: its newlines escaped too
    });
    analysis::AlertTime now = analysis::AlertClock::now();
    auto evaluate = [&](analysis::AlertTime at, const SampleSet& set) {
      for (const sinks::AlertNotification& n : engine.Evaluate(at, set.samples, set.gpus)) {
        PrintNotification(n);
        if (n.state == analysis::AlertState::kFiring) ++fired;
        runner.Submit(n);
      }
    };
    for (std::size_t i = 0; i < sets.size(); ++i) {
      evaluate(now, sets[i]);
      if (i + 1 < sets.size()) now += *interval;
    }
    // The last sample held for the longest `for`: everything that would fire, fires.
    if (longest_for.count() > 0) evaluate(now + longest_for, sets.back());
    if (flags.resolve) evaluate(now + longest_for + std::chrono::seconds(1), SampleSet{});
    runner.Flush();
    if (fired == 0) PrintSafe(stdout, "no rule fires for this sample\n");
    sinks::HookRunnerStats stats = runner.stats();
    PrintSafe(stderr, runner.Summary() + "\n");
    if (stats.failed > 0) exit_code = kExitFailure;
  }
  return exit_code;
}

}  // namespace

Command AddAlertsCommand(CLI::App& app) {
  auto flags = std::make_shared<AlertsFlags>();
  CLI::App* alerts = app.add_subcommand("alerts", std::string(kAlertsDescription));
  alerts->footer(std::string(kAlertsFooter));
  alerts->require_subcommand(1);

  CLI::App* check = alerts->add_subcommand("check", "Validate a rules file and print its rules");
  check->add_option("CONFIG", flags->config, "The alert rules file (TOML)")->required();
  AddMaxInputBytesOption(*check);
  check->footer("Example:\n  fragscope alerts check deploy/fragscope.toml.example");

  CLI::App* test = alerts->add_subcommand(
      "test", "Evaluate the rules on a sample and run (or dry-run) the hooks of what fires");
  test->add_option("CONFIG", flags->config, "The alert rules file (TOML)")->required();
  AddMaxInputBytesOption(*test);
  test->add_option("--sample", flags->samples, "A sample: a JSON file or inline JSON (repeatable)")
      ->required();
  test->add_option("--interval", flags->interval,
                   "Time between successive --sample evaluations (default 30s)");
  test->add_flag("--dry-run", flags->dry_run, "Log what would be delivered; deliver nothing");
  test->add_flag(
      "--resolve", flags->resolve,
      "Afterwards, evaluate with no samples so firing alerts resolve (and deliver that)");
  test->footer(std::string(kTestFooter));

  Command command;
  command.app = alerts;
  command.run = [flags, check, test]() -> int {
    if (check->parsed()) return RunAlertsCheck(*flags);
    if (test->parsed()) return RunTest(*flags);
    return kExitBadInput;
  };
  return command;
}

}  // namespace fragscope::cli
