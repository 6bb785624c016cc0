#include "sinks/alerts/hook_runner.h"

#include <dirent.h>
#include <fcntl.h>
#include <httplib.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include "sinks/http_error.h"

namespace fragscope::sinks {

using SteadyClock = std::chrono::steady_clock;

// ---- exec hooks --------------------------------------------------------------------------

namespace {

// Closes a descriptor once.
struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { Close(); }
  void Close() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

void AppendBounded(std::string* out, std::size_t* dropped, std::size_t max, const char* data,
                   std::size_t n) {
  std::size_t room = max > out->size() ? max - out->size() : 0;
  std::size_t keep = std::min(room, n);
  out->append(data, keep);
  *dropped += n - keep;
}

// The processes descended from this one (by their parent in /proc/PID/stat), with whether
// each is a zombie. With this process a child subreaper (below), that is every process a hook
// started, however it detached (setsid, double fork): orphans are reparented here, not to init.
struct Descendant {
  pid_t pid;
  pid_t parent;
  bool zombie;
};
std::vector<Descendant> Descendants() {
  std::map<pid_t, std::vector<Descendant>> children;
  if (DIR* proc = ::opendir("/proc")) {
    while (const dirent* e = ::readdir(proc)) {
      char* end = nullptr;
      const long pid = std::strtol(e->d_name, &end, 10);
      if (pid <= 0 || *end != '\0') continue;
      char path[64];
      std::snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
      const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
      if (fd < 0) continue;
      char buf[512];
      const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
      ::close(fd);
      if (n <= 0) continue;
      buf[n] = '\0';
      const char* paren = std::strrchr(buf, ')');  // the command name may hold anything
      char state = 0;
      long parent = 0;
      if (paren == nullptr || std::sscanf(paren + 1, " %c %ld", &state, &parent) != 2) continue;
      children[static_cast<pid_t>(parent)].push_back(
          {static_cast<pid_t>(pid), static_cast<pid_t>(parent), state == 'Z'});
    }
    ::closedir(proc);
  }
  std::vector<Descendant> out;
  std::vector<pid_t> todo = {::getpid()};
  while (!todo.empty()) {
    const pid_t p = todo.back();
    todo.pop_back();
    for (const Descendant& d : children[p]) {
      out.push_back(d);
      todo.push_back(d.pid);
    }
  }
  return out;
}

bool AnyAlive(const std::vector<Descendant>& ds) {
  return std::any_of(ds.begin(), ds.end(), [](const Descendant& d) { return !d.zombie; });
}

// Kills every descendant (SIGKILL) and reaps those that are (or become) this process's
// children, until none is left or a bounded number of rounds has passed. Returns how many
// live processes it killed.
std::size_t KillDescendants() {
  std::size_t killed = 0;
  for (int round = 0; round < 100; ++round) {
    const std::vector<Descendant> ds = Descendants();
    if (ds.empty()) break;
    for (const Descendant& d : ds) {
      if (!d.zombie) {
        ::kill(d.pid, SIGKILL);
        ++killed;
      }
    }
    for (const Descendant& d : ds) {
      if (d.parent == ::getpid()) {
        int status = 0;
        ::waitpid(d.pid, &status, d.zombie ? 0 : WNOHANG);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return killed;
}

std::string Describe(int status) {
  if (WIFEXITED(status)) return fmt::format("exit {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("killed by signal {}", WTERMSIG(status));
  return fmt::format("wait status {}", status);
}

}  // namespace

HookOutcome RunExecHook(const HookSpec& hook, std::string_view stdin_data,
                        const std::vector<std::string>& env) {
  HookOutcome outcome;
  if (hook.command.empty()) {
    outcome.detail = "no command";
    return outcome;
  }
  // stdin is a socket, not a pipe, so that writing to a hook that exits without reading
  // fails with EPIPE (MSG_NOSIGNAL) instead of raising SIGPIPE in the daemon.
  int in_pair[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, in_pair) != 0) {
    outcome.detail = fmt::format("socketpair: {}", std::strerror(errno));
    return outcome;
  }
  Fd in_parent(in_pair[0]), in_child(in_pair[1]);
  int out_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) {
    outcome.detail = fmt::format("pipe: {}", std::strerror(errno));
    return outcome;
  }
  Fd out_parent(out_pipe[0]), out_child(out_pipe[1]);
  // The child can only shut down its writing direction of stdin; it never writes to it.
  shutdown(in_child.fd, SHUT_WR);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in_child.fd, STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out_child.fd, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out_child.fd, STDERR_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Its own process group, so the timeout kills whatever it started too; default signal
  // dispositions and an empty mask, whatever the daemon's threads have.
  sigset_t empty, defaults;
  sigemptyset(&empty);
  sigemptyset(&defaults);
  for (int sig : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGQUIT}) sigaddset(&defaults, sig);
  posix_spawnattr_setsigmask(&attr, &empty);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);

  std::vector<char*> argv;
  for (const std::string& a : hook.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  // Orphans of the hook (a process it detached with setsid or a double fork) are reparented
  // to this process rather than to init, so they can still be found and killed.
  static const bool subreaper = ::prctl(PR_SET_CHILD_SUBREAPER, 1) == 0;
  pid_t pid = -1;
  int rc = posix_spawn(&pid, hook.command[0].c_str(), &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    outcome.detail = fmt::format("cannot run {}: {}", hook.command[0], std::strerror(rc));
    return outcome;
  }
  in_child.Close();
  out_child.Close();
  fcntl(in_parent.fd, F_SETFL, fcntl(in_parent.fd, F_GETFL) | O_NONBLOCK);

  const auto deadline = SteadyClock::now() + hook.timeout;
  std::size_t written = 0;
  if (stdin_data.empty()) in_parent.Close();
  bool exited = false;
  int status = 0;
  bool timed_out = false;
  char buffer[4096];
  while (true) {
    if (!exited) {
      pid_t w = waitpid(pid, &status, WNOHANG);
      if (w == pid) exited = true;
    }
    if (exited && out_parent.fd < 0) break;
    auto now = SteadyClock::now();
    if (now >= deadline) {
      timed_out = true;
      break;
    }
    pollfd fds[2];
    nfds_t nfds = 0;
    if (out_parent.fd >= 0) fds[nfds++] = {out_parent.fd, POLLIN, 0};
    if (in_parent.fd >= 0) fds[nfds++] = {in_parent.fd, POLLOUT, 0};
    // Short slices: the child's exit is noticed by waitpid, not by a descriptor.
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count();
    int slice = static_cast<int>(std::min<std::int64_t>(left + 1, 20));
    int ready = poll(fds, nfds, slice);
    if (ready < 0 && errno != EINTR) break;
    for (nfds_t i = 0; i < nfds && ready > 0; ++i) {
      if (fds[i].revents == 0) continue;
      if (fds[i].fd == out_parent.fd) {
        ssize_t n = read(out_parent.fd, buffer, sizeof(buffer));
        if (n > 0) {
          AppendBounded(&outcome.output, &outcome.output_dropped_bytes, hook.max_output_bytes,
                        buffer, static_cast<std::size_t>(n));
        } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
          out_parent.Close();
        }
      } else if (fds[i].fd == in_parent.fd) {
        ssize_t n = send(in_parent.fd, stdin_data.data() + written, stdin_data.size() - written,
                         MSG_NOSIGNAL);
        if (n > 0) written += static_cast<std::size_t>(n);
        if ((n < 0 && errno != EAGAIN && errno != EINTR) || written == stdin_data.size()) {
          in_parent.Close();  // done, or the hook closed its stdin: it gets what it read
        }
      }
    }
  }
  if (!exited) {
    // Timed out (or poll failed): kill the whole group, then reap so no zombie is left.
    kill(-pid, SIGKILL);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  } else if (timed_out) {
    // The hook exited but something it started still holds its output open.
    kill(-pid, SIGKILL);
  }
  // Whatever the hook left running (detached from its group, or not), it gets the rest of the
  // hook's time and is then killed: nothing a hook starts outlives its timeout.
  std::size_t left_running = 0;
  if (subreaper) {
    while (!timed_out && AnyAlive(Descendants()) && SteadyClock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    left_running = KillDescendants();
  }
  if (timed_out && !exited) {
    outcome.detail = fmt::format("killed after {} timeout", FormatAlertDuration(hook.timeout));
    return outcome;
  }
  outcome.detail = Describe(status);
  if (left_running > 0) {
    outcome.detail += fmt::format("; {} process(es) it left running killed at the {} timeout",
                                  left_running, FormatAlertDuration(hook.timeout));
  }
  outcome.ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  return outcome;
}

// ---- webhooks ----------------------------------------------------------------------------

HookOutcome PostWebhook(const HookSpec& hook, const std::string& body) {
  HookOutcome outcome;
  // "scheme://authority/path": httplib takes the first two together and the path apart.
  std::string_view url = hook.url;
  std::size_t scheme_end = url.find("://");
  if (scheme_end == std::string_view::npos) {
    outcome.detail = "bad URL";
    return outcome;
  }
  std::size_t path_begin = url.find('/', scheme_end + 3);
  std::string base(url.substr(0, path_begin));
  std::string path =
      path_begin == std::string_view::npos ? "/" : std::string(url.substr(path_begin));
  httplib::Client client(base);
  if (!client.is_valid()) {
    outcome.detail = fmt::format("cannot use {}", base);
    return outcome;
  }
  auto seconds = std::chrono::duration_cast<std::chrono::seconds>(hook.timeout);
  auto micros = std::chrono::duration_cast<std::chrono::microseconds>(hook.timeout - seconds);
  client.set_connection_timeout(static_cast<time_t>(seconds.count()),
                                static_cast<time_t>(micros.count()));
  client.set_read_timeout(static_cast<time_t>(seconds.count()),
                          static_cast<time_t>(micros.count()));
  client.set_write_timeout(static_cast<time_t>(seconds.count()),
                           static_cast<time_t>(micros.count()));
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  for (const auto& [name, value] : hook.headers) req.headers.emplace(name, value);
  req.headers.emplace("User-Agent", "fragscope-alerts/1");
  req.headers.emplace("Content-Type", "application/json");
  req.body = body;
  // The response body is read up to max_output_bytes and no further: the endpoint may be
  // broken or hostile, and httplib would otherwise hold all of it in memory.
  bool body_cut = false;
  req.content_receiver = [&](const char* data, std::size_t size, std::uint64_t, std::uint64_t) {
    const std::size_t room = hook.max_output_bytes - outcome.output.size();
    outcome.output.append(data, std::min(room, size));
    if (size <= room) return true;
    body_cut = true;
    return false;  // cancels the transfer; the status line is already in
  };
  // httplib's timeouts restart with every byte, so an endpoint that trickles its answer would
  // hold the delivery thread for ever: a watchdog stops the client at the hook's timeout.
  std::mutex mu;
  std::condition_variable cv;
  bool finished = false;
  bool timed_out = false;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, hook.timeout, [&] { return finished; })) {
      timed_out = true;
      client.stop();
    }
  });
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  const bool sent = client.send(req, res, error);
  {
    std::lock_guard<std::mutex> lock(mu);
    finished = true;
  }
  cv.notify_all();
  watchdog.join();
  if (timed_out) {
    outcome.ok = false;
    outcome.detail = fmt::format("POST {}: stopped after {} timeout", hook.url,
                                 FormatAlertDuration(hook.timeout));
    return outcome;
  }
  if (!sent && !(body_cut && res.status > 0)) {
    outcome.detail = fmt::format("POST {}: {}", hook.url, HttpErrorText(error));
    return outcome;
  }
  outcome.output_cut = body_cut;
  outcome.detail = fmt::format("HTTP {}", res.status);
  outcome.ok = res.status >= 200 && res.status < 300;
  return outcome;
}

// ---- the runner --------------------------------------------------------------------------

namespace {

// PATH, HOME, LANG, LC_ALL and TZ pass through from the daemon's environment; nothing else
// does (the hook gets a predictable environment, and none of the daemon's secrets).
std::vector<std::string> HookEnvironment(const AlertNotification& n) {
  std::vector<std::string> env;
  for (const char* name : {"PATH", "HOME", "LANG", "LC_ALL", "TZ"}) {
    if (const char* value = std::getenv(name)) env.push_back(fmt::format("{}={}", name, value));
  }
  if (std::getenv("PATH") == nullptr) env.emplace_back("PATH=/usr/local/bin:/usr/bin:/bin");
  std::vector<std::string> alert = NotificationEnvironment(n);
  env.insert(env.end(), alert.begin(), alert.end());
  return env;
}

std::string OneLine(std::string_view text, std::size_t max) {
  std::string out;
  for (char c : text.substr(0, max)) out += (c == '\n' || c == '\r') ? ' ' : c;
  if (text.size() > max) out += "…";
  return out;
}

}  // namespace

HookRunner::HookRunner(std::map<std::string, HookSpec> hooks, DeliveryOptions options,
                       Logger logger, Clock clock)
    : hooks_(std::move(hooks)),
      options_(options),
      logger_(std::move(logger)),
      clock_(std::move(clock)) {
  thread_ = std::thread([this] { Loop(); });
}

HookRunner::~HookRunner() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  std::uint64_t suppressed = 0;
  for (const auto& [rule, count] : suppressed_since_log_) suppressed += count;
  if (suppressed > 0 || stats_.queue_overflow > 0) Log(Summary());
}

void HookRunner::Log(std::string_view line) {
  std::lock_guard<std::mutex> lock(log_mu_);
  if (logger_) logger_(line);
}

bool HookRunner::Admit(const std::string& rule, analysis::AlertTime now) {
  auto expire = [&](std::deque<analysis::AlertTime>& sent) {
    while (!sent.empty() && sent.front() <= now - options_.rate_window) sent.pop_front();
  };
  std::deque<analysis::AlertTime>& per_rule = rule_sent_[rule];
  expire(per_rule);
  expire(global_sent_);
  if (options_.per_rule_limit > 0 && per_rule.size() >= options_.per_rule_limit) {
    ++stats_.rate_limited_rule;
    ++suppressed_since_log_[rule];
    return false;
  }
  if (options_.global_limit > 0 && global_sent_.size() >= options_.global_limit) {
    ++stats_.rate_limited_global;
    ++suppressed_since_log_[rule];
    return false;
  }
  per_rule.push_back(now);
  global_sent_.push_back(now);
  return true;
}

bool HookRunner::Submit(const AlertNotification& n) {
  if (n.state == analysis::AlertState::kPending || n.state == analysis::AlertState::kInactive) {
    return false;
  }
  if (n.state == analysis::AlertState::kResolved && !n.send_resolved) return false;
  if (n.hooks.empty()) {
    // A rule without hooks is only logged.
    std::string series;
    for (const auto& [key, value] : n.series) {
      series += fmt::format("{}{}=\"{}\"", series.empty() ? "" : ",", key, value);
    }
    Log(fmt::format("alerts: {} {} {{{}}} (no hooks)", n.rule, analysis::AlertStateName(n.state),
                    series));
    return false;
  }
  analysis::AlertTime now = clock_();
  std::uint64_t suppressed = 0;
  bool overflow = false;
  {
    // The logger runs outside mu_, so a slow logger never holds up the delivery thread.
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.submitted;
    if (!Admit(n.rule, now)) return false;
    overflow = queue_.size() >= options_.queue_capacity;
    if (overflow) {
      ++stats_.queue_overflow;
    } else {
      auto it = suppressed_since_log_.find(n.rule);
      if (it != suppressed_since_log_.end()) {
        suppressed = it->second;
        suppressed_since_log_.erase(it);
      }
      queue_.push_back(n);
    }
  }
  if (overflow) {
    Log(fmt::format("alerts: delivery queue full ({}), dropped {} {}", options_.queue_capacity,
                    n.rule, analysis::AlertStateName(n.state)));
    return false;
  }
  if (suppressed > 0) {
    Log(fmt::format("alerts: rate limit: {} notification(s) of rule {} were not delivered",
                    suppressed, n.rule));
  }
  cv_.notify_one();
  return true;
}

void HookRunner::Flush() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
}

HookRunnerStats HookRunner::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

std::string HookRunner::Summary() const {
  HookRunnerStats s = stats();
  return fmt::format(
      "alerts: {} notification(s) submitted; hook runs: {} delivered, {} failed, {} dry-run; "
      "not delivered: {} over a rule's rate limit, {} over the global rate limit, {} queue full",
      s.submitted, s.delivered, s.failed, s.dry_run, s.rate_limited_rule, s.rate_limited_global,
      s.queue_overflow);
}

void HookRunner::Loop() {
  while (true) {
    AlertNotification n;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything was delivered
      n = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    Deliver(n);
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy_ = false;
      if (queue_.empty()) idle_cv_.notify_all();
    }
  }
}

void HookRunner::Deliver(const AlertNotification& n) {
  std::string json = NotificationJson(n);
  for (const std::string& name : n.hooks) {
    auto it = hooks_.find(name);
    if (it == hooks_.end()) {
      Log(fmt::format("alerts: {} {}: no hook named {}", n.rule, analysis::AlertStateName(n.state),
                      name));
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.failed;
      continue;
    }
    const HookSpec& hook = it->second;
    std::string what = hook.kind == HookSpec::Kind::kExec
                           ? fmt::format("run {}", fmt::join(hook.command, " "))
                           : fmt::format("POST {}", hook.url);
    if (options_.dry_run) {
      Log(fmt::format("alerts: dry-run: {} {} -> hook {}: would {} with {}", n.rule,
                      analysis::AlertStateName(n.state), name, what, json));
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.dry_run;
      continue;
    }
    HookOutcome outcome = hook.kind == HookSpec::Kind::kExec
                              ? RunExecHook(hook, json, HookEnvironment(n))
                              : PostWebhook(hook, json);
    std::string line = fmt::format("alerts: {} {} -> hook {} ({}): {}", n.rule,
                                   analysis::AlertStateName(n.state), name, what, outcome.detail);
    if (!outcome.output.empty()) line += fmt::format("; output: {}", OneLine(outcome.output, 2000));
    if (outcome.output_dropped_bytes > 0) {
      line += fmt::format(" (+{} bytes not kept)", outcome.output_dropped_bytes);
    }
    if (outcome.output_cut) line += " (the rest of the body was not read)";
    Log(line);
    std::lock_guard<std::mutex> lock(mu_);
    ++(outcome.ok ? stats_.delivered : stats_.failed);
  }
}

}  // namespace fragscope::sinks
