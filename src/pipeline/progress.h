// ProgressLine: a progress line on stderr for long reads (only on a terminal, only after a
// second, at most four times a second), shared by the pipeline's readers and the commands.
//
// Thread safety: none; one thread updates it.
#ifndef FRAGSCOPE_PIPELINE_PROGRESS_H_
#define FRAGSCOPE_PIPELINE_PROGRESS_H_

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "common/units.h"
#include "fragscope/trace.h"

namespace fragscope::pipeline {

/// Progress on stderr: only on a terminal, only after a second, at most four times a second.
class ProgressLine {
 public:
  ProgressLine() : start_(Clock::now()), last_(start_) {
    enabled_ = isatty(STDERR_FILENO) != 0;
    // Test hook: how long to wait before the first line (default 1000 ms).
    if (const char* delay = std::getenv("FRAGSCOPE_PROGRESS_DELAY_MS")) {
      delay_ = std::chrono::milliseconds(std::strtoll(delay, nullptr, 10));
    }
  }

  // Cheap enough to call every few thousand events.
  void Update(const TraceReader& reader, std::uint64_t events) {
    Show(reader.input_bytes_consumed(), reader.input_bytes_total(),
         fmt::format("{:.1f} M events", static_cast<double>(events) / 1e6));
  }
  // Bytes of a file read so far, for inputs read before their events (snapshots).
  void UpdateBytes(std::uint64_t done, std::uint64_t total, std::string_view what) {
    Show(done, total, what);
  }

  // Erases the line, if one was printed.
  void Clear() {
    if (!shown_) return;
    std::fputs("\r\x1b[K", stderr);
    std::fflush(stderr);
    shown_ = false;
  }

 private:
  void Show(std::uint64_t done, std::uint64_t total, std::string_view what) {
    if (!enabled_) return;
    const Clock::time_point now = Clock::now();
    if (now - start_ < delay_ || (shown_ && now - last_ < std::chrono::milliseconds(250))) return;
    last_ = now;
    shown_ = true;
    std::string line = "\rfragscope: ";
    if (total > 0) {
      line += fmt::format("{:3.0f}% of {}, ",
                          100.0 * static_cast<double>(done) / static_cast<double>(total),
                          FormatBytes(total));
    } else {
      line += fmt::format("{} read, ", FormatBytes(done));
    }
    line += what;
    line += "\x1b[K";
    std::fputs(line.c_str(), stderr);
    std::fflush(stderr);
  }

  using Clock = std::chrono::steady_clock;
  bool enabled_ = false;
  bool shown_ = false;
  std::chrono::milliseconds delay_{1000};
  Clock::time_point start_;
  Clock::time_point last_;
};

}  // namespace fragscope::pipeline

#endif  // FRAGSCOPE_PIPELINE_PROGRESS_H_
