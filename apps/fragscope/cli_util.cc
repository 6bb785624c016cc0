#include "cli_util.h"

#include <charconv>

#include "command.h"

namespace fragscope::cli {

// An integer >= min (CLI11's own PositiveNumber prints its range as a 300-digit double).
CLI::Validator IntegerAtLeast(std::int64_t min) {
  return CLI::Validator(
      [min](std::string& text) -> std::string {
        std::int64_t value = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, value);
        if (ec != std::errc() || ptr != end) return fmt::format("'{}' is not an integer", text);
        if (value < min) return fmt::format("{} is less than {}", value, min);
        return "";
      },
      fmt::format("INT>={}", min));
}

// A byte size as ParseSize reads it ("2MiB", "1.5GiB", "4096"), at least `min` bytes.
CLI::Validator ByteSize(std::uint64_t min) {
  return CLI::Validator(
      [min](std::string& text) -> std::string {
        Result<std::uint64_t> size = ParseSize(text);
        if (!size.ok()) return size.status().message();
        if (*size < min) return fmt::format("'{}' is less than {} bytes", text, min);
        return "";
      },
      "");
}

int BadInput(std::string_view message) {
  std::fputs(fmt::format("fragscope: {}\n", message).c_str(), stderr);
  return kExitBadInput;
}

bool UseColor(const std::string& mode) {
  if (mode == "always") return true;
  if (mode == "never") return false;
  const char* term = std::getenv("TERM");
  return isatty(STDOUT_FILENO) != 0 && std::getenv("NO_COLOR") == nullptr &&
         !(term != nullptr && std::string_view(term) == "dumb");
}

int WriteReport(const std::string& report) {
  if (std::fwrite(report.data(), 1, report.size(), stdout) != report.size() ||
      std::fflush(stdout) != 0) {
    std::fputs("fragscope: cannot write the report to stdout\n", stderr);
    return kExitFailure;
  }
  return kExitOk;
}

Result<std::uint64_t> ReadAllEvents(TraceReader& reader,
                                    const std::function<Status(const Event&)>& consume,
                                    Status* status_out) {
  ProgressLine progress;
  Event event;
  std::uint64_t events = 0;
  while (true) {
    Result<bool> next = reader.Next(&event);
    if (!next.ok()) {
      progress.Clear();
      return next.status();
    }
    if (!*next) break;
    if (Status s = consume(event); !s.ok()) {
      progress.Clear();
      if (status_out != nullptr) *status_out = s;
      return Status(s.code(), fmt::format("{}: {}", reader.Where(), s.message()));
    }
    if ((++events & 0xfff) == 0) progress.Update(reader, events);
  }
  progress.Clear();
  return events;
}

}  // namespace fragscope::cli
