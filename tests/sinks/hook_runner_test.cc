#include "sinks/alerts/hook_runner.h"

#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>

namespace fragscope::sinks {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;

std::string DataDir() {
  const char* dir = std::getenv("FRAGSCOPE_SOURCE_DIR");
  return std::string(dir != nullptr ? dir : ".") + "/tests/data/alerts";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "fragscope-hooks-XXXXXX");
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string path(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::map<std::string, std::string> ReadEnv(const std::string& path) {
  std::map<std::string, std::string> env;
  std::string text = ReadFile(path);
  std::size_t begin = 0;
  while (begin < text.size()) {
    std::size_t end = text.find('\0', begin);
    if (end == std::string::npos) end = text.size();
    std::string entry = text.substr(begin, end - begin);
    std::size_t eq = entry.find('=');
    if (eq != std::string::npos) env[entry.substr(0, eq)] = entry.substr(eq + 1);
    begin = end + 1;
  }
  return env;
}

AlertNotification Notification(std::string rule = "HighFragmentation",
                               analysis::AlertState state = analysis::AlertState::kFiring) {
  AlertNotification n;
  n.rule = std::move(rule);
  n.state = state;
  n.severity = "critical";
  n.summary = "fragmented";
  n.metric = "fragmentation_ratio";
  n.op = ">";
  n.threshold = 0.4;
  n.value = 0.625;
  n.for_duration = "5m";
  n.series = {{"device_uuid", "GPU-abc"}, {"pid", "4242"}, {"rank", "3"},
              {"job", "llama"},           {"run", "r1"},   {"gpu", "1"}};
  n.labels = n.series;
  n.labels["alertname"] = n.rule;
  n.labels["team"] = "ml infra";
  n.at = analysis::AlertTime(seconds(1'800'000'000));
  n.active_since = n.at - seconds(300);
  n.hooks = {"h"};
  n.hostname = "node-7";
  return n;
}

HookSpec ExecHook(std::vector<std::string> command, milliseconds timeout = seconds(10)) {
  HookSpec h;
  h.name = "h";
  h.kind = HookSpec::Kind::kExec;
  h.command = std::move(command);
  h.timeout = timeout;
  return h;
}

// No child of this test process is left unreaped.
void ExpectNoChildren() {
  int status = 0;
  EXPECT_EQ(waitpid(-1, &status, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
}

// ---- exec hooks --------------------------------------------------------------------------

TEST(RunExecHookTest, JsonOnStdinAndEnvironment) {
  TempDir dir;
  setenv("FRAGSCOPE_TEST_SECRET", "do-not-pass", 1);
  AlertNotification n = Notification();
  std::vector<std::string> env = NotificationEnvironment(n);
  HookOutcome out = RunExecHook(ExecHook({DataDir() + "/record_hook.sh", dir.path("out")}),
                                NotificationJson(n), env);
  unsetenv("FRAGSCOPE_TEST_SECRET");
  ASSERT_TRUE(out.ok) << out.detail << " " << out.output;
  EXPECT_EQ(out.detail, "exit 0");
  EXPECT_EQ(out.output, "recorded HighFragmentation firing\n");

  nlohmann::json j = nlohmann::json::parse(ReadFile(dir.path("out.json")));
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["alert"], "HighFragmentation");
  EXPECT_EQ(j["state"], "firing");
  EXPECT_EQ(j["severity"], "critical");
  EXPECT_EQ(j["value"], 0.625);
  EXPECT_EQ(j["threshold"], 0.4);
  EXPECT_EQ(j["series"]["device_uuid"], "GPU-abc");
  EXPECT_EQ(j["labels"]["team"], "ml infra");
  EXPECT_EQ(j["at"], "2027-01-15T08:00:00.000Z");
  EXPECT_EQ(j["active_since"], "2027-01-15T07:55:00.000Z");

  std::map<std::string, std::string> e = ReadEnv(dir.path("out.env"));
  EXPECT_EQ(e["FRAGSCOPE_ALERT_NAME"], "HighFragmentation");
  EXPECT_EQ(e["FRAGSCOPE_ALERT_SEVERITY"], "critical");
  EXPECT_EQ(e["FRAGSCOPE_ALERT_STATE"], "firing");
  EXPECT_EQ(e["FRAGSCOPE_ALERT_DEVICE_UUID"], "GPU-abc");
  EXPECT_EQ(e["FRAGSCOPE_ALERT_PID"], "4242");
  EXPECT_EQ(e["FRAGSCOPE_ALERT_RANK"], "3");
  EXPECT_EQ(e["FRAGSCOPE_ALERT_JOB"], "llama");
  EXPECT_EQ(e["FRAGSCOPE_ALERT_GPU"], "1");
  EXPECT_EQ(e["FRAGSCOPE_ALERT_VALUE"], "0.625");
  EXPECT_EQ(e["FRAGSCOPE_ALERT_THRESHOLD"], "0.4");
  EXPECT_EQ(e["FRAGSCOPE_ALERT_HOSTNAME"], "node-7");
  EXPECT_EQ(e["FRAGSCOPE_ALERT_LABEL_TEAM"], "ml infra");
  // RunExecHook passes exactly the environment it is given.
  EXPECT_FALSE(e.contains("FRAGSCOPE_TEST_SECRET"));
  EXPECT_FALSE(e.contains("HOME"));
  ExpectNoChildren();
}

TEST(RunExecHookTest, ShellMetacharactersArriveLiterally) {
  TempDir dir;
  const std::string evil =
      "x'; touch " + dir.path("pwned") + "; echo \"$(id)\" `id` | & > <\n$HOME";
  AlertNotification n = Notification();
  n.series["job"] = evil;
  n.labels["job"] = evil;
  n.labels["a b$c"] = evil;
  HookOutcome out = RunExecHook(ExecHook({DataDir() + "/record_hook.sh", dir.path("out")}),
                                NotificationJson(n), NotificationEnvironment(n));
  ASSERT_TRUE(out.ok) << out.detail;
  std::map<std::string, std::string> e = ReadEnv(dir.path("out.env"));
  EXPECT_EQ(e["FRAGSCOPE_ALERT_JOB"], evil);
  EXPECT_EQ(e["FRAGSCOPE_ALERT_LABEL_A_B_C"], evil);
  nlohmann::json j = nlohmann::json::parse(ReadFile(dir.path("out.json")));
  EXPECT_EQ(j["series"]["job"], evil);
  EXPECT_FALSE(std::filesystem::exists(dir.path("pwned")));
  // An argument with spaces and metacharacters is one argv entry, not a shell word list.
  HookOutcome out2 =
      RunExecHook(ExecHook({DataDir() + "/record_hook.sh", dir.path("o; touch x")}), "{}", {});
  ASSERT_TRUE(out2.ok) << out2.detail;
  EXPECT_TRUE(std::filesystem::exists(dir.path("o; touch x.json")));
  EXPECT_FALSE(std::filesystem::exists(dir.path("o.json")));
}

TEST(RunExecHookTest, HangingHookIsKilledWithItsProcessGroup) {
  TempDir dir;
  auto start = std::chrono::steady_clock::now();
  HookOutcome out =
      RunExecHook(ExecHook({DataDir() + "/hang_hook.sh", dir.path("pid")}, milliseconds(300)), "{}",
                  {"PATH=/usr/bin:/bin"});
  auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_FALSE(out.ok);
  EXPECT_EQ(out.detail, "killed after 300ms timeout");
  EXPECT_EQ(out.output, "hanging\n");
  EXPECT_LT(elapsed, seconds(5));
  ExpectNoChildren();
  // The background sleep it started is gone too (or a zombie waiting for init to reap it).
  pid_t sleeper = std::stoi(ReadFile(dir.path("pid")));
  for (int i = 0; i < 100; ++i) {
    std::string stat = ReadFile("/proc/" + std::to_string(sleeper) + "/stat");
    std::size_t paren = stat.rfind(')');
    if (stat.empty() || (paren != std::string::npos && stat.substr(paren + 2, 1) == "Z")) return;
    usleep(20'000);
  }
  ADD_FAILURE() << "background process " << sleeper << " still running";
  kill(sleeper, SIGKILL);
}

// A hook that detaches a process into a session of its own (setsid: out of the hook's
// process group), with its output closed, and exits at once: the detached process is still
// tracked and killed at the hook's timeout; nothing is left running or unreaped.
TEST(RunExecHookTest, DetachedProcessesAreKilledAtTheTimeout) {
  TempDir dir;
  const std::string pid_file = dir.path("pid");
  HookSpec hook = ExecHook({"/bin/sh", "-c",
                            "setsid /bin/sh -c 'echo $$ > " + pid_file +
                                "; exec sleep 30' </dev/null >/dev/null 2>&1 &"},
                           milliseconds(500));
  auto start = std::chrono::steady_clock::now();
  HookOutcome out = RunExecHook(hook, "{}", {"PATH=/usr/bin:/bin"});
  auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_TRUE(out.ok) << out.detail;  // the hook itself exited 0
  EXPECT_THAT(out.detail, HasSubstr("1 process(es) it left running killed at the 500ms timeout"));
  EXPECT_LT(elapsed, seconds(5));
  std::string pid_text;
  for (int i = 0; i < 100 && pid_text.empty(); ++i) {
    pid_text = ReadFile(pid_file);
    if (pid_text.empty()) usleep(10'000);
  }
  ASSERT_FALSE(pid_text.empty());
  const pid_t detached = std::stoi(pid_text);
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    const std::string stat = ReadFile("/proc/" + std::to_string(detached) + "/stat");
    const std::size_t paren = stat.rfind(')');
    gone = stat.empty() || (paren != std::string::npos && stat.substr(paren + 2, 1) == "Z");
    if (!gone) usleep(20'000);
  }
  EXPECT_TRUE(gone) << "the detached process " << detached << " is still running";
  if (!gone) kill(detached, SIGKILL);
  ExpectNoChildren();
}

TEST(RunExecHookTest, OutputIsBoundedAndUnreadStdinDoesNotBlock) {
  HookSpec hook = ExecHook({DataDir() + "/noisy_hook.sh"});
  hook.max_output_bytes = 1000;
  std::string big(4 << 20, 'x');  // more than a socket buffer; the hook never reads it
  HookOutcome out = RunExecHook(hook, big, {"PATH=/usr/bin:/bin"});
  EXPECT_FALSE(out.ok);
  EXPECT_EQ(out.detail, "exit 3");
  EXPECT_EQ(out.output.size(), 1000u);
  EXPECT_EQ(out.output_dropped_bytes, 2u * 1048576 - 1000);
  ExpectNoChildren();
}

TEST(RunExecHookTest, FailuresAreReported) {
  TempDir dir;
  HookOutcome missing = RunExecHook(ExecHook({"/nonexistent/hook"}), "{}", {});
  EXPECT_FALSE(missing.ok);
  EXPECT_THAT(missing.detail, HasSubstr("cannot run /nonexistent/hook"));
  HookOutcome exit7 =
      RunExecHook(ExecHook({DataDir() + "/record_hook.sh", dir.path("o"), "7"}), "{}", {});
  EXPECT_FALSE(exit7.ok);
  EXPECT_EQ(exit7.detail, "exit 7");
  ExpectNoChildren();
}

// ---- webhooks ----------------------------------------------------------------------------

// A loopback HTTP server for the duration of a test.
class TestServer {
 public:
  TestServer() {
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    // httplib 0.11 has no wait_until_ready(); stop() before the loop runs would be lost.
    while (!server_.is_running()) std::this_thread::sleep_for(milliseconds(1));
  }
  ~TestServer() {
    server_.stop();
    thread_.join();
  }
  httplib::Server& server() { return server_; }
  std::string url(const std::string& path) const {
    return "http://127.0.0.1:" + std::to_string(port_) + path;
  }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

HookSpec Webhook(std::string url, milliseconds timeout = seconds(5)) {
  HookSpec h;
  h.name = "h";
  h.kind = HookSpec::Kind::kWebhook;
  h.url = std::move(url);
  h.timeout = timeout;
  return h;
}

TEST(PostWebhookTest, PostsJsonAndReportsStatus) {
  TestServer server;
  std::mutex mu;
  std::string body, content_type, team;
  server.server().Post("/hook", [&](const httplib::Request& req, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mu);
    body = req.body;
    content_type = req.get_header_value("Content-Type");
    team = req.get_header_value("X-Team");
    res.set_content("thanks", "text/plain");
  });
  server.server().Post("/broken", [&](const httplib::Request&, httplib::Response& res) {
    res.status = 503;
    res.set_content("down for maintenance", "text/plain");
  });
  HookSpec hook = Webhook(server.url("/hook"));
  hook.headers["X-Team"] = "ml-infra";
  std::string json = NotificationJson(Notification());
  HookOutcome ok = PostWebhook(hook, json);
  EXPECT_TRUE(ok.ok) << ok.detail;
  EXPECT_EQ(ok.detail, "HTTP 200");
  EXPECT_EQ(ok.output, "thanks");
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(body, json);
    EXPECT_EQ(content_type, "application/json");
    EXPECT_EQ(team, "ml-infra");
  }
  HookOutcome broken = PostWebhook(Webhook(server.url("/broken")), json);
  EXPECT_FALSE(broken.ok);
  EXPECT_EQ(broken.detail, "HTTP 503");
  EXPECT_EQ(broken.output, "down for maintenance");
}

// A hostile or broken endpoint: an endless response body is read up to max_output_bytes and
// no further, and a body trickled forever ends at the hook's timeout (a read timeout that
// restarts with every byte would wait for ever).
TEST(PostWebhookTest, EndlessOrTrickledBodiesAreBounded) {
  TestServer server;
  std::atomic<std::uint64_t> served{0};
  std::atomic<bool> stop_trickle{false};
  server.server().Post("/endless", [&](const httplib::Request&, httplib::Response& res) {
    res.set_chunked_content_provider("text/plain", [&](std::size_t, httplib::DataSink& sink) {
      const std::string chunk(64 * 1024, 'x');
      if (served.load() >= (std::uint64_t{1} << 30)) {  // 1 GiB: bounded even when unbounded
        sink.done();
        return true;
      }
      served += chunk.size();
      return sink.write(chunk.data(), chunk.size());
    });
  });
  server.server().Post("/trickle", [&](const httplib::Request&, httplib::Response& res) {
    res.set_chunked_content_provider("text/plain", [&](std::size_t, httplib::DataSink& sink) {
      if (stop_trickle) {
        sink.done();
        return true;
      }
      std::this_thread::sleep_for(milliseconds(50));
      return sink.write("x", 1);
    });
  });
  HookSpec endless = Webhook(server.url("/endless"));
  endless.max_output_bytes = 4096;
  HookOutcome big = PostWebhook(endless, "{}");
  EXPECT_TRUE(big.ok) << big.detail;  // the status was 200; only the body was cut
  EXPECT_EQ(big.output.size(), 4096u);
  EXPECT_TRUE(big.output_cut);
  EXPECT_LT(served.load(), std::uint64_t{64} << 20) << "the client kept reading the body";

  const auto start = std::chrono::steady_clock::now();
  HookOutcome slow = PostWebhook(Webhook(server.url("/trickle"), milliseconds(500)), "{}");
  const auto took = std::chrono::steady_clock::now() - start;
  stop_trickle = true;
  EXPECT_FALSE(slow.ok);
  EXPECT_NE(slow.detail.find("timeout"), std::string::npos) << slow.detail;
  EXPECT_LT(took, milliseconds(2500));  // slack for a busy CI
}

TEST(PostWebhookTest, SlowServerTimesOutAndClosedPortFails) {
  TestServer server;
  server.server().Post("/slow", [&](const httplib::Request&, httplib::Response& res) {
    std::this_thread::sleep_for(milliseconds(3000));
    res.set_content("late", "text/plain");
  });
  auto start = std::chrono::steady_clock::now();
  HookOutcome slow = PostWebhook(Webhook(server.url("/slow"), milliseconds(200)), "{}");
  EXPECT_FALSE(slow.ok);
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(2500));  // slack for a busy CI
  // A port nobody listens on (bound, then released).
  int port = 0;
  {
    httplib::Server s;
    port = s.bind_to_any_port("127.0.0.1");
  }
  HookOutcome refused =
      PostWebhook(Webhook("http://127.0.0.1:" + std::to_string(port) + "/x", seconds(2)), "{}");
  EXPECT_FALSE(refused.ok);
  EXPECT_THAT(refused.detail, HasSubstr("POST http://127.0.0.1:"));
}

// ---- the runner --------------------------------------------------------------------------

struct LogCapture {
  std::mutex mu;
  std::vector<std::string> lines;
  HookRunner::Logger logger() {
    return [this](std::string_view line) {
      std::lock_guard<std::mutex> lock(mu);
      lines.emplace_back(line);
    };
  }
  std::string all() {
    std::lock_guard<std::mutex> lock(mu);
    std::string out;
    for (const auto& l : lines) out += l + "\n";
    return out;
  }
};

TEST(HookRunnerTest, DeliversFiringAndResolvedButNotPending) {
  TempDir dir;
  LogCapture log;
  {
    HookRunner runner({{"h", ExecHook({DataDir() + "/record_hook.sh", dir.path("out")})}}, {},
                      log.logger());
    EXPECT_FALSE(runner.Submit(Notification("A", analysis::AlertState::kPending)));
    EXPECT_TRUE(runner.Submit(Notification("A", analysis::AlertState::kFiring)));
    runner.Flush();
    EXPECT_EQ(ReadEnv(dir.path("out.env"))["FRAGSCOPE_ALERT_STATE"], "firing");
    AlertNotification resolved = Notification("A", analysis::AlertState::kResolved);
    EXPECT_TRUE(runner.Submit(resolved));
    runner.Flush();
    EXPECT_EQ(ReadEnv(dir.path("out.env"))["FRAGSCOPE_ALERT_STATE"], "resolved");
    resolved.send_resolved = false;
    EXPECT_FALSE(runner.Submit(resolved));
    EXPECT_EQ(runner.stats().delivered, 2u);
    EXPECT_EQ(runner.stats().failed, 0u);
  }
  EXPECT_THAT(log.all(), HasSubstr("alerts: A firing -> hook h (run "));
  EXPECT_THAT(log.all(), HasSubstr("exit 0; output: recorded A firing"));
  ExpectNoChildren();
}

TEST(HookRunnerTest, DryRunLogsAndDeliversNothing) {
  TempDir dir;
  LogCapture log;
  HookSpec webhook = Webhook("http://127.0.0.1:1/never");
  webhook.name = "w";
  DeliveryOptions options;
  options.dry_run = true;
  {
    HookRunner runner(
        {{"h", ExecHook({DataDir() + "/record_hook.sh", dir.path("out")})}, {"w", webhook}},
        options, log.logger());
    AlertNotification n = Notification();
    n.hooks = {"h", "w"};
    EXPECT_TRUE(runner.Submit(n));
    runner.Flush();
    EXPECT_EQ(runner.stats().dry_run, 2u);
    EXPECT_EQ(runner.stats().delivered, 0u);
  }
  EXPECT_FALSE(std::filesystem::exists(dir.path("out.json")));
  EXPECT_THAT(log.all(), HasSubstr("dry-run: HighFragmentation firing -> hook h: would run "));
  EXPECT_THAT(log.all(), HasSubstr("hook w: would POST http://127.0.0.1:1/never with {"));
}

TEST(HookRunnerTest, RateLimitsPerRuleAndGlobalWithFakeClock) {
  LogCapture log;
  analysis::AlertTime now(seconds(1'000'000));
  DeliveryOptions options;
  options.dry_run = true;  // counts deliveries without running anything
  options.per_rule_limit = 2;
  options.global_limit = 3;
  options.rate_window = seconds(60);
  HookRunner runner({{"h", ExecHook({"/bin/true"})}}, options, log.logger(), [&] { return now; });
  EXPECT_TRUE(runner.Submit(Notification("A")));
  EXPECT_TRUE(runner.Submit(Notification("A")));
  EXPECT_FALSE(runner.Submit(Notification("A")));  // over A's limit
  EXPECT_TRUE(runner.Submit(Notification("B")));
  EXPECT_FALSE(runner.Submit(Notification("C")));  // over the global limit
  EXPECT_FALSE(runner.Submit(Notification("A")));
  HookRunnerStats s = runner.stats();
  EXPECT_EQ(s.submitted, 6u);
  EXPECT_EQ(s.rate_limited_rule, 2u);
  EXPECT_EQ(s.rate_limited_global, 1u);
  // A minute later the window has moved on; the suppressed count is reported once.
  now += seconds(60);
  EXPECT_TRUE(runner.Submit(Notification("A")));
  runner.Flush();
  EXPECT_EQ(runner.stats().dry_run, 4u);
  EXPECT_THAT(log.all(), HasSubstr("rate limit: 2 notification(s) of rule A were not delivered"));
  EXPECT_THAT(runner.Summary(),
              HasSubstr("2 over a rule's rate limit, 1 over the global rate limit, 0 queue full"));
}

TEST(HookRunnerTest, FullQueueDropsAndCountsWithoutBlocking) {
  TestServer server;
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false, release = false;
  server.server().Post("/block", [&](const httplib::Request&, httplib::Response& res) {
    std::unique_lock<std::mutex> lock(mu);
    entered = true;
    cv.notify_all();
    cv.wait(lock, [&] { return release; });
    res.status = 200;
  });
  LogCapture log;
  DeliveryOptions options;
  options.queue_capacity = 1;
  {
    HookRunner runner({{"h", Webhook(server.url("/block"))}}, options, log.logger());
    EXPECT_TRUE(runner.Submit(Notification("A")));
    {
      std::unique_lock<std::mutex> lock(mu);
      ASSERT_TRUE(cv.wait_for(lock, seconds(10), [&] { return entered; }));
    }
    // The delivery thread is busy with A: B waits in the queue, C finds it full.
    EXPECT_TRUE(runner.Submit(Notification("B")));
    EXPECT_FALSE(runner.Submit(Notification("C")));
    EXPECT_EQ(runner.stats().queue_overflow, 1u);
    {
      std::lock_guard<std::mutex> lock(mu);
      release = true;
    }
    cv.notify_all();
    runner.Flush();
    EXPECT_EQ(runner.stats().delivered, 2u);
  }
  EXPECT_THAT(log.all(), HasSubstr("delivery queue full (1), dropped C firing"));
  EXPECT_THAT(log.all(), HasSubstr("1 queue full"));
}

TEST(HookRunnerTest, RuleWithoutHooksIsOnlyLogged) {
  LogCapture log;
  {
    HookRunner runner({}, {}, log.logger());
    AlertNotification n = Notification("Quiet");
    n.hooks.clear();
    n.series = {{"pid", "9"}};
    EXPECT_FALSE(runner.Submit(n));
    EXPECT_EQ(runner.stats().submitted, 0u);
  }
  EXPECT_THAT(log.all(), HasSubstr("alerts: Quiet firing {pid=\"9\"} (no hooks)"));
}

TEST(HookRunnerTest, FailedHookIsLoggedWithItsOutput) {
  TempDir dir;
  LogCapture log;
  {
    HookRunner runner({{"h", ExecHook({DataDir() + "/record_hook.sh", dir.path("o"), "2"})}}, {},
                      log.logger());
    EXPECT_TRUE(runner.Submit(Notification()));
    runner.Flush();
    EXPECT_EQ(runner.stats().failed, 1u);
  }
  EXPECT_THAT(log.all(), HasSubstr("exit 2; output: recorded HighFragmentation firing"));
}

}  // namespace
}  // namespace fragscope::sinks
