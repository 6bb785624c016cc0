// `fragscope top` (top_command.h): fetch, read keys, draw. The frame itself is
// sinks/live/top_frame.h, a pure function; this file owns the terminal (raw mode, the
// alternate screen, signals) and the daemon's answers.
#include "top_command.h"

#include <fcntl.h>
#include <langinfo.h>
#include <poll.h>
#include <signal.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <clocale>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <sys/ioctl.h>

#include "cli_util.h"
#include "common/terminal_text.h"
#include "http_get.h"
#include "sinks/live/process_api.h"
#include "sinks/live/top_frame.h"
#include "sinks/live/unix_http_get.h"

namespace fragscope::cli {
namespace {

namespace live = sinks::live;

// The most of an answer `top` reads: the daemon's list at its largest --max-series with full
// histories is a few MiB; beyond this the endpoint is not the daemon.
constexpr std::size_t kMaxAnswerBytes = 32 << 20;

struct TopFlags {
  std::string url = "http://127.0.0.1:9464";
  std::string socket;  // set: the daemon's API socket instead of --url
  bool once = false;
  std::string sort = "level";
  std::string job;
  bool no_color = false;
  double interval_seconds = 2;
};

// ---- The daemon -------------------------------------------------------------------------

// Where the daemon answers: its HTTP address (--url), or its API socket (--socket), where it
// serves the same HTTP API (serve --api-socket).
struct Endpoint {
  std::string base;    // "http://host:port" when socket is empty
  std::string socket;  // the API socket's path

  std::string Where(const std::string& path) const {
    return socket.empty() ? base + path : fmt::format("{} on {}", path, socket);
  }
  HttpGetResult Get(const std::string& path, double timeout) const {
    return socket.empty() ? HttpGet(base, path, timeout, kMaxAnswerBytes)
                          : live::UnixHttpGet(socket, path, timeout, kMaxAnswerBytes);
  }
};

// What one fetch gave: the answer parsed, or a sentence saying what went wrong.
template <typename T>
struct Fetched {
  std::optional<T> value;
  std::string problem;
};

template <typename T, typename Parse>
Fetched<T> Fetch(const Endpoint& daemon, const std::string& path, double timeout, Parse parse) {
  Fetched<T> out;
  const std::string where = daemon.Where(path);
  const HttpGetResult got = daemon.Get(path, timeout);
  switch (got.outcome) {
    case HttpGetResult::Outcome::kTooBig:
      out.problem = fmt::format("not a fragscope daemon: {} sent more than {} MiB", where,
                                kMaxAnswerBytes >> 20);
      return out;
    case HttpGetResult::Outcome::kTimedOut:
      out.problem =
          fmt::format("daemon unreachable: no answer from {} within {} s", where, timeout);
      return out;
    case HttpGetResult::Outcome::kFailed:
      out.problem = fmt::format("daemon unreachable: {}: {} (is `fragscope serve` running?)", where,
                                got.error);
      return out;
    case HttpGetResult::Outcome::kOk:
      break;
  }
  if (got.status == 404) {
    out.problem =
        fmt::format("no process API: {} answered 404 (a fragscope serve older than `top`?)", where);
    return out;
  }
  if (got.status != 200) {
    out.problem = fmt::format("daemon error: {} answered HTTP {}", where, got.status);
    return out;
  }
  Result<T> parsed = parse(got.body);
  if (!parsed.ok()) {
    out.problem =
        fmt::format("not the daemon's process API: {}: {}", where, parsed.status().message());
    return out;
  }
  out.value = std::move(*parsed);
  return out;
}

Fetched<live::ProcessList> FetchList(const Endpoint& daemon, double timeout) {
  return Fetch<live::ProcessList>(daemon, "/api/v1/processes", timeout, live::ParseProcessesJson);
}

Fetched<live::ProcessRow> FetchMap(const Endpoint& daemon, const std::string& id, double timeout) {
  return Fetch<live::ProcessRow>(daemon, fmt::format("/api/v1/processes/{}/map", id), timeout,
                                 live::ParseProcessMapJson);
}

// "http://host:port" from --url; a path of "/" or "/metrics" (the URL `probe` takes) is
// accepted and dropped. Empty on anything else.
std::string BaseUrl(const std::string& url) {
  const std::size_t scheme = url.find("://");
  if (scheme == std::string::npos || url.compare(0, scheme, "http") != 0) return "";
  const std::size_t slash = url.find('/', scheme + 3);
  if (slash == scheme + 3) return "";
  if (slash == std::string::npos) return url;
  const std::string path = url.substr(slash);
  if (path != "/" && path != "/metrics") return "";
  return url.substr(0, slash);
}

std::string ClockNow() {
  const time_t now = time(nullptr);
  tm local{};
  localtime_r(&now, &local);
  char buf[16];
  std::strftime(buf, sizeof(buf), "%H:%M:%S", &local);
  return buf;
}

bool LocaleIsUtf8() {
  const char* old = std::setlocale(LC_CTYPE, nullptr);
  const std::string saved = old ? old : "C";
  std::setlocale(LC_CTYPE, "");
  const bool utf8 = std::string_view(nl_langinfo(CODESET)) == "UTF-8";
  std::setlocale(LC_CTYPE, saved.c_str());
  return utf8;
}

// ---- --once -------------------------------------------------------------------------------

int RunOnce(const TopFlags& flags, const Endpoint& daemon, live::TopView view) {
  const Fetched<live::ProcessList> got = FetchList(daemon, 5.0);
  if (!got.value) return Failure(got.problem);
  live::FrameOptions options;
  options.color = !flags.no_color && UseColor("auto");
  options.utf8 = LocaleIsUtf8();
  options.height = 0;
  winsize ws{};
  if (isatty(STDOUT_FILENO) && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) {
    options.width = ws.ws_col;
  } else if (const char* columns = std::getenv("COLUMNS"); columns != nullptr) {
    options.width = std::clamp(std::atoi(columns), 20, 1000);
  }
  view.interactive = false;
  view.clock = ClockNow();
  std::string text;
  for (std::string& line : live::RenderTopFrame(*got.value, view, options)) {
    // The padding that clears a screen line is noise in a file.
    while (!line.empty() && line.back() == ' ') line.pop_back();
    text += line;
    text += '\n';
  }
  return WriteReport(text, TextForm(options.color));
}

// ---- The terminal ---------------------------------------------------------------------------

int g_signal_pipe[2] = {-1, -1};

extern "C" void OnSignal(int sig) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(sig);
  [[maybe_unused]] const ssize_t n = ::write(g_signal_pipe[1], &byte, 1);
  errno = saved;
}

// Raw keys, the alternate screen and a hidden cursor while it lives; everything restored when
// it goes (q, SIGINT, SIGTERM, an error). Ctrl-Z is disabled: a stopped `top` would leave the
// shell in raw mode.
class Terminal {
 public:
  bool Enter() {
    if (tcgetattr(STDIN_FILENO, &saved_) != 0) return false;
    termios raw = saved_;
    raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);
    raw.c_cc[VMIN] = 0;
    raw.c_cc[VTIME] = 0;
    raw.c_cc[VSUSP] = _POSIX_VDISABLE;
    if (tcsetattr(STDIN_FILENO, TCSAFLUSH, &raw) != 0) return false;
    entered_ = true;
    Write("\x1b[?1049h\x1b[?25l");
    return true;
  }
  ~Terminal() {
    if (!entered_) return;
    Write("\x1b[0m\x1b[?25h\x1b[?1049l");
    tcsetattr(STDIN_FILENO, TCSAFLUSH, &saved_);
  }
  static void Write(std::string_view text) {
    while (!text.empty()) {
      const ssize_t n = ::write(STDOUT_FILENO, text.data(), text.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      text.remove_prefix(static_cast<std::size_t>(n));
    }
  }

 private:
  termios saved_{};
  bool entered_ = false;
};

enum class Key { kNone, kQuit, kUp, kDown, kEnter, kEscape, kBackspace, kChar };

struct KeyPress {
  Key key = Key::kNone;
  char ch = 0;
};

// Splits what stdin gave into keys: arrows arrive as ESC [ A / ESC O A, a lone ESC is Escape.
std::vector<KeyPress> Keys(std::string_view bytes) {
  std::vector<KeyPress> keys;
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    const char c = bytes[i];
    if (c == '\x1b') {
      if (i + 2 < bytes.size() && (bytes[i + 1] == '[' || bytes[i + 1] == 'O')) {
        const char final = bytes[i + 2];
        i += 2;
        if (final == 'A') keys.push_back({Key::kUp, 0});
        if (final == 'B') keys.push_back({Key::kDown, 0});
        // Other sequences (other keys, e.g. ESC [ 5 ~) are skipped to their final byte.
        while (i < bytes.size() && (bytes[i] >= '0' && bytes[i] <= '9')) ++i;
        continue;
      }
      keys.push_back({Key::kEscape, 0});
    } else if (c == '\r' || c == '\n') {
      keys.push_back({Key::kEnter, 0});
    } else if (c == 0x7f || c == 0x08) {
      keys.push_back({Key::kBackspace, 0});
    } else if (c == 0x03 || c == 0x04) {
      keys.push_back({Key::kQuit, 0});
    } else {
      keys.push_back({Key::kChar, c});
    }
  }
  return keys;
}

int RunInteractive(const TopFlags& flags, const Endpoint& daemon, live::TopView view) {
  if (!isatty(STDIN_FILENO) || !isatty(STDOUT_FILENO)) {
    return BadInput("top needs a terminal on stdin and stdout; use --once for one frame");
  }
  if (pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    return Failure(fmt::format("pipe(): {}", std::strerror(errno)));
  }
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGWINCH, SIGHUP}) sigaction(sig, &sa, nullptr);
  live::FrameOptions options;
  options.color = !flags.no_color && UseColor("auto");
  options.utf8 = LocaleIsUtf8();
  const double timeout = std::min(2.0, std::max(0.2, flags.interval_seconds));
  const auto interval = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(flags.interval_seconds));

  Terminal terminal;
  if (!terminal.Enter()) return Failure("cannot set the terminal's mode (tcsetattr)");
  live::ProcessList list;
  std::string saved_filter;  // the filter before '/', for Escape
  auto next_fetch = std::chrono::steady_clock::now();
  bool fetch_map = false;
  int exit_signal = 0;
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= next_fetch || fetch_map) {
      if (now >= next_fetch) {
        Fetched<live::ProcessList> got = FetchList(daemon, timeout);
        if (got.value) {
          list = std::move(*got.value);
          view.status.clear();
          view.clock = ClockNow();
        } else {
          // What matters first (the line is cut at the terminal's width): that the data is
          // not live, that top keeps trying, how old the rows are; then the details.
          const std::size_t colon = got.problem.find(": ");
          view.status = fmt::format(
              "{}, retrying every {} s{}: {}", got.problem.substr(0, colon), flags.interval_seconds,
              view.clock.empty() ? "" : " (rows as of " + view.clock + ")",
              colon == std::string::npos ? "" : got.problem.substr(colon + 2));
        }
        next_fetch = now + interval;
      }
      bool listed = false;
      for (const live::ProcessRow& r : list.processes)
        listed = listed || (view.map && r.id == view.map->id);
      if (view.map && view.status.empty() && !listed) {
        // It exited, or went silent past the daemon's --expiry: its last map stays on screen.
        view.status = fmt::format(
            "process {} no longer reports to the daemon (its last state "
            "is shown); Esc for the list",
            view.map->pid);
      } else if (view.map) {
        Fetched<live::ProcessRow> got = FetchMap(daemon, view.map->id, timeout);
        if (got.value) {
          view.map = std::move(*got.value);
        } else if (view.status.empty()) {
          view.status = got.problem;
        }
      }
      fetch_map = false;
    }
    winsize ws{};
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 && ws.ws_row > 0) {
      options.width = ws.ws_col;
      options.height = ws.ws_row;
    }
    std::string screen = "\x1b[H";
    const std::vector<std::string> lines = live::RenderTopFrame(list, view, options);
    for (std::size_t i = 0; i < lines.size(); ++i) {
      screen += lines[i];
      screen += "\x1b[K";
      if (i + 1 < lines.size()) screen += "\r\n";
    }
    screen += "\x1b[J";
    Terminal::Write(screen);

    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(
        next_fetch - std::chrono::steady_clock::now());
    pollfd fds[2] = {{STDIN_FILENO, POLLIN, 0}, {g_signal_pipe[0], POLLIN, 0}};
    const int ready = poll(fds, 2, static_cast<int>(std::max<std::int64_t>(0, wait.count())));
    if (ready <= 0) continue;
    if (fds[1].revents & POLLIN) {
      unsigned char sigs[16];
      const ssize_t n = ::read(g_signal_pipe[0], sigs, sizeof(sigs));
      for (ssize_t i = 0; i < n; ++i) {
        if (sigs[i] != SIGWINCH) exit_signal = sigs[i];
      }
      if (exit_signal != 0) break;
    }
    if (!(fds[0].revents & (POLLIN | POLLHUP))) continue;
    char buf[256];
    const ssize_t n = ::read(STDIN_FILENO, buf, sizeof(buf));
    if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) break;  // the terminal went away
    if (n < 0) continue;
    bool quit = false;
    const std::vector<std::size_t> rows = live::VisibleRows(list, view);
    std::size_t selected = 0;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      if (list.processes[rows[i]].id == view.selected_id) selected = i;
    }
    for (const KeyPress& k : Keys(std::string_view(buf, static_cast<std::size_t>(n)))) {
      if (view.editing_filter) {
        if (k.key == Key::kEnter) {
          view.editing_filter = false;
        } else if (k.key == Key::kEscape) {
          view.editing_filter = false;
          view.job_filter = saved_filter;
        } else if (k.key == Key::kBackspace) {
          if (!view.job_filter.empty()) view.job_filter.pop_back();
        } else if (k.key == Key::kChar && static_cast<unsigned char>(k.ch) >= 0x20 &&
                   view.job_filter.size() < 256) {
          view.job_filter += k.ch;
        } else if (k.key == Key::kQuit) {
          quit = true;
        }
        continue;
      }
      if (k.key == Key::kQuit || (k.key == Key::kChar && k.ch == 'q')) {
        quit = true;
      } else if (view.map) {
        if (k.key == Key::kEnter || k.key == Key::kEscape) view.map.reset();
      } else if (k.key == Key::kUp || (k.key == Key::kChar && k.ch == 'k')) {
        if (selected > 0) --selected;
      } else if (k.key == Key::kDown || (k.key == Key::kChar && k.ch == 'j')) {
        if (selected + 1 < rows.size()) ++selected;
      } else if (k.key == Key::kEnter) {
        if (selected < rows.size()) {
          view.map = list.processes[rows[selected]];
          view.map->free_blocks.clear();
          fetch_map = true;
        }
      } else if (k.key == Key::kChar) {
        switch (k.ch) {
          case 'l':
            view.sort = live::TopSort::kLevel;
            break;
          case 'r':
            view.sort = live::TopSort::kReserved;
            break;
          case 'a':
            view.sort = live::TopSort::kAllocated;
            break;
          case 'f':
            view.sort = live::TopSort::kFragmentation;
            break;
          case 'p':
            view.sort = live::TopSort::kRisk;
            break;
          case '/':
            saved_filter = view.job_filter;
            view.editing_filter = true;
            break;
          default:
            break;
        }
      }
      if (!view.map && selected < rows.size()) view.selected_id = list.processes[rows[selected]].id;
    }
    if (quit) break;
  }
  for (int sig : {SIGINT, SIGTERM, SIGWINCH, SIGHUP}) signal(sig, SIG_DFL);
  return exit_signal != 0 ? 128 + exit_signal : kExitOk;
}

int RunTop(const TopFlags& flags) {
  const std::optional<live::TopSort> sort = live::ParseTopSort(flags.sort);
  if (!sort) {
    return BadInput(fmt::format(
        "--sort {}: expected level, reserved, allocated, fragmentation or risk", flags.sort));
  }
  Endpoint daemon;
  if (!flags.socket.empty()) {
    daemon.socket = flags.socket;
  } else {
    daemon.base = BaseUrl(flags.url);
    if (daemon.base.empty()) {
      return BadInput(fmt::format(
          "--url {}: expected http://HOST:PORT (the daemon's --listen address)", flags.url));
    }
  }
  live::TopView view;
  view.sort = *sort;
  view.job_filter = flags.job;
  view.source = daemon.socket.empty() ? daemon.base : daemon.socket;
  return flags.once ? RunOnce(flags, daemon, view) : RunInteractive(flags, daemon, view);
}

constexpr std::string_view kTopFooter =
    R"(Shows every training process that reports to the node daemon (`fragscope serve`), one row
per process and device, worst first, refreshed every --interval seconds:

  JOB RANK PID   the process (job name and rank as its agent or Monitor sent them)
  RESV ALLOC     reserved and allocated bytes of its caching allocator
  FRAG           (reserved - allocated) / reserved: cache kept for reuse, not a risk alone
  FREE/REQ       largest free block / largest request since the previous sample; "!" when
                 the request would not fit in that block
  P100           P(an OOM within the next 100 steps), the daemon's calibrated OOM risk
  LEVEL STEPS    the forecast's level and the steps it expects until an OOM
  TREND          allocated bytes over the last samples (against the most reserved)
Wider terminals add HOST, GPU (CUDA index) and STEP; narrower ones drop columns, the least
important first. docs/live-monitoring.md, "fragscope top", explains each column.

Keys: up/down (or j/k) select a row; Enter shows that process's memory (reserved as a bar,
free blocks by size) and Enter or Esc goes back; / filters by job (a substring; Enter applies,
Esc cancels, an empty filter shows all); sort with l (level: worst first), r (reserved),
a (allocated), f (fragmentation), p (P(OOM)); q quits. Ctrl-C and SIGTERM quit too, and the
terminal is restored.

The data comes from the daemon's process API: GET /api/v1/processes on its --listen address
(--url), or, with --socket, the same HTTP API on its Unix API socket (serve --api-socket;
by default next to the agent socket, /run/fragscope/agent.api.sock). Over the socket only
the users its file mode admits (0660: the daemon's user and group) can read. A daemon that
goes away is said on the second line; top keeps the last rows and retries every --interval.
Colour follows the terminal: none with --no-color, NO_COLOR set, or output that is not a
terminal.

Examples:
  fragscope top                                  # the daemon on 127.0.0.1:9464
  fragscope top --url http://gpu-node-7:9464 --job llama --sort risk
  fragscope top --socket /run/fragscope/agent.api.sock   # no TCP port needed
  fragscope top --once --no-color                # one frame on stdout, for scripts
  curl -s http://127.0.0.1:9464/api/v1/processes # the same data as JSON
  curl -s --unix-socket /run/fragscope/agent.api.sock http://localhost/api/v1/processes

Exit status: 0 after q (or one frame printed with --once); 1 --once could not read the daemon;
2 bad usage; 130/143 after SIGINT/SIGTERM.)";

}  // namespace

Command AddTopCommand(CLI::App& app) {
  auto flags = std::make_shared<TopFlags>();
  CLI::App* sub = app.add_subcommand(
      "top", "Live terminal view of the node daemon's processes, worst OOM risk first");
  sub->footer(std::string(kTopFooter));
  CLI::Option* url =
      sub->add_option("--url", flags->url, "The daemon's HTTP address (its serve --listen)")
          ->type_name("URL")
          ->capture_default_str();
  sub->add_option("--socket", flags->socket,
                  "Read the daemon on its API socket (its serve --api-socket) instead of --url")
      ->type_name("PATH")
      ->excludes(url);
  sub->add_flag("--once", flags->once, "Print one frame to stdout and exit (for scripts)");
  sub->add_option("--sort", flags->sort,
                  "Order of the rows: level (worst first), reserved, allocated, fragmentation, "
                  "risk (P(OOM))")
      ->capture_default_str();
  sub->add_option("--job", flags->job, "Show only processes whose job name contains NAME")
      ->type_name("NAME");
  sub->add_flag("--no-color", flags->no_color, "No colour (NO_COLOR in the environment too)");
  sub->add_option("--interval", flags->interval_seconds, "Seconds between refreshes")
      ->capture_default_str()
      ->check(CLI::Range(0.2, 3600.0));
  return {sub, [flags] { return RunTop(*flags); }};
}

}  // namespace fragscope::cli
