// HookRunner: delivers alert notifications to hooks on its own thread, so that a slow hook
// never delays rule evaluation. Two kinds of hook (alert_config.h, docs/alerts.md):
//
//   exec     runs a program (posix_spawn of an argv array: no shell, nothing interpolated),
//            the notification as JSON on stdin and as FRAGSCOPE_ALERT_* variables; killed
//            (with its process group) after the timeout; stdout+stderr kept up to a bound and
//            logged; always reaped. The process is made a child subreaper
//            (PR_SET_CHILD_SUBREAPER), so what a hook detaches (setsid, double fork) stays
//            its descendant: whatever a hook leaves running is killed at the hook's timeout.
//            REQUIRES of the process: it starts no children of its own besides hooks (every
//            descendant is taken for a hook's; `fragscope serve` starts none).
//   webhook  POSTs the JSON to an http:// or https:// URL; the whole exchange is stopped at
//            the timeout (however the endpoint trickles); the response body is read up to
//            max_output_bytes and no further; non-2xx is logged.
//
// Rate limits apply when a notification is submitted: at most `per_rule_limit` per rule and
// `global_limit` overall in any `rate_window`; the excess is counted and summarized in the
// log. The queue is bounded; a notification that finds it full is dropped and counted.
// Dry-run logs what would be delivered and delivers nothing.
//
// Thread safety: Submit, Flush and stats may be called from any thread. The logger is called
// from the caller's thread and from the delivery thread, serialized by the runner.
#ifndef FRAGSCOPE_SINKS_ALERTS_HOOK_RUNNER_H_
#define FRAGSCOPE_SINKS_ALERTS_HOOK_RUNNER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "sinks/alerts/alert_config.h"
#include "sinks/alerts/alert_engine.h"

namespace fragscope::sinks {

/// What one hook invocation did.
struct HookOutcome {
  bool ok = false;
  std::string detail;  // "exit 0", "killed after 10s timeout", "HTTP 500", "connect failed"
  std::string output;  // exec: stdout+stderr (bounded); webhook: response body (bounded)
  std::size_t output_dropped_bytes = 0;
  bool output_cut = false;  // webhook: the body went on past the bound and was not read
};

/// Runs `hook.command` with `stdin_data` on its stdin and `env` (NAME=value) as its whole
/// environment; waits at most `hook.timeout`, then SIGKILLs its process group. Always reaps
/// the child. Blocking; the runner calls it on its thread.
HookOutcome RunExecHook(const HookSpec& hook, std::string_view stdin_data,
                        const std::vector<std::string>& env);
/// POSTs `body` as application/json to `hook.url`. Blocking, bounded by `hook.timeout`.
HookOutcome PostWebhook(const HookSpec& hook, const std::string& body);

struct HookRunnerStats {
  std::uint64_t submitted = 0;            // firing/resolved notifications offered
  std::uint64_t delivered = 0;            // hook invocations that succeeded
  std::uint64_t failed = 0;               // hook invocations that failed (exit != 0, non-2xx,
                                          // timeout, spawn or connect error)
  std::uint64_t dry_run = 0;              // hook invocations only logged (dry-run)
  std::uint64_t rate_limited_rule = 0;    // notifications over a rule's limit
  std::uint64_t rate_limited_global = 0;  // notifications over the global limit
  std::uint64_t queue_overflow = 0;       // notifications dropped because the queue was full
};

class HookRunner {
 public:
  using Clock = std::function<analysis::AlertTime()>;
  using Logger = std::function<void(std::string_view line)>;

  /// Starts the delivery thread. `clock` drives the rate limits (tests pass a fake one);
  /// `logger` receives one line per event worth a log entry.
  HookRunner(
      std::map<std::string, HookSpec> hooks, DeliveryOptions options, Logger logger,
      Clock clock = [] { return analysis::AlertClock::now(); });
  /// Delivers what is queued (each hook bounded by its timeout), logs the rate-limit summary,
  /// and joins the thread.
  ~HookRunner();
  HookRunner(const HookRunner&) = delete;
  HookRunner& operator=(const HookRunner&) = delete;

  /// Queues `n` for its hooks, unless it is a pending notification (never delivered), a
  /// resolved one of a rule with send_resolved = false, has no hooks (then it is only
  /// logged), is over a rate limit, or the queue is full. Never blocks on delivery. Returns
  /// whether it was queued.
  bool Submit(const AlertNotification& n);
  /// Blocks until everything queued so far has been delivered (for the CLI and tests).
  void Flush();
  HookRunnerStats stats() const;
  /// One line: counts of delivered, failed, suppressed and dropped notifications.
  std::string Summary() const;

 private:
  void Log(std::string_view line);
  void Loop();
  void Deliver(const AlertNotification& n);
  bool Admit(const std::string& rule, analysis::AlertTime now);  // REQUIRES: mu_ held

  const std::map<std::string, HookSpec> hooks_;
  const DeliveryOptions options_;
  const Logger logger_;
  const Clock clock_;

  std::mutex log_mu_;
  mutable std::mutex mu_;
  std::condition_variable cv_;       // work arrived or stopping
  std::condition_variable idle_cv_;  // queue drained and nothing in flight
  std::deque<AlertNotification> queue_;
  bool busy_ = false;
  bool stop_ = false;
  HookRunnerStats stats_;
  std::deque<analysis::AlertTime> global_sent_;  // admission times inside the window
  std::map<std::string, std::deque<analysis::AlertTime>> rule_sent_;
  std::map<std::string, std::uint64_t> suppressed_since_log_;  // rule -> count
  std::thread thread_;
};

}  // namespace fragscope::sinks

#endif  // FRAGSCOPE_SINKS_ALERTS_HOOK_RUNNER_H_
