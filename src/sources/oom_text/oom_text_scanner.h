// OomTextScanner: finds PyTorch's out-of-memory error messages in arbitrary text (a job's log,
// a pasted traceback) and reads their figures into OomMessage values. Line based and bounded:
// it holds one message at a time (capped), never the input, and every search is a plain
// substring scan (no regular expressions, no backtracking).
//
// What it copes with (docs/explain.md): every wording since 1.x (classic "(GPU 0; ... reserved
// in total by PyTorch)" and "GPU 0 has a total capacity of ..."), CUDA/HIP/XPU, messages
// wrapped over several lines, line prefixes added by loggers ("[rank3]:", "[default0]:",
// timestamps, level names, "# ", "> "), "\n" escapes of JSON logs, exception names before the
// message, and repeats of the same message (folded into one).
//
// Thread safety: none; one scanner per input.
#ifndef FRAGSCOPE_SOURCES_OOM_TEXT_OOM_TEXT_SCANNER_H_
#define FRAGSCOPE_SOURCES_OOM_TEXT_OOM_TEXT_SCANNER_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/keyed_hash.h"
#include "fragscope/oom_message.h"
#include "fragscope/status.h"

namespace fragscope::sources {

struct OomTextLimits {
  /// Longer lines are cut (the rest of the line is not searched); a real message line is
  /// < 1 KiB, but JSON logs put whole messages, tracebacks included, on one line.
  std::size_t max_line_bytes = std::size_t{1} << 20;
  /// One message's joined text; PyTorch's longest is ~700 bytes plus process lines.
  std::size_t max_message_bytes = 16 * 1024;
  /// Lines a wrapped message may span (80-column wrapping of the longest text: ~12).
  std::size_t max_message_lines = 24;
  /// Distinct messages kept; later ones are only counted.
  std::size_t max_messages = 1000;
};

/// What a scan found.
struct OomTextScan {
  std::vector<OomMessage> messages;    // in input order, repeats folded
  std::uint64_t lines = 0;             // lines read
  std::uint64_t bytes = 0;             // bytes read
  std::uint64_t cut_lines = 0;         // lines longer than max_line_bytes
  std::uint64_t dropped_messages = 0;  // distinct messages beyond max_messages
};

class OomTextScanner {
 public:
  explicit OomTextScanner(OomTextLimits limits = {}) : limits_(limits) {}

  /// Feeds one line, without its '\n' (a trailing '\r' is ignored).
  void AddLine(std::string_view line);
  /// Ends the input (a message still open is finished, marked truncated if it was cut short)
  /// and returns what was found. The scanner is spent afterwards.
  OomTextScan Finish();

 private:
  struct Open {
    // Declared so that std::optional<Open> sees a complete, constructible type inside this
    // class (clang evaluates is_constructible before the member initializers are parsed).
    Open() {}
    OomMessage message;
    std::string raw;  // joined text so far
    std::size_t lines = 0;
    bool complete = false;  // an end marker was seen
    bool may_end = false;   // "reserved in total by PyTorch)" seen: pre-1.10 ends here
  };
  void Start(std::string_view line, std::size_t trigger, std::string_view backend);
  void Append(std::string_view text);
  void Close(bool truncated);

  OomTextLimits limits_;
  OomTextScan scan_;
  std::optional<Open> open_;
  KeyedStringMap<std::size_t> seen_;  // rank + text -> index in messages
};

/// Scans a whole text in memory (tests, the fuzzer).
OomTextScan ScanOomText(std::string_view text, const OomTextLimits& limits = {});

/// Scans a file, or standard input for "-", reading it in chunks (OpenFileSource: a FIFO or a
/// pipe is read once, and at most --max-input-bytes of it). Errors: kNotFound / kIoError
/// naming the path (or "standard input"), kLimitExceeded for a stream beyond its limit.
/// `also` (optional) sees every line too, as the scanner does (cut at max_line_bytes + 1):
/// another scanner of the same input (the BFC log scanner) reads it in the same pass.
Result<OomTextScan> ReadOomText(const std::string& path, const OomTextLimits& limits = {},
                                const std::function<void(std::string_view)>& also = {});

/// Parses one figure as PyTorch prints it ("20.00 MiB", "0 bytes", "1.5 GiB", "512 B"), at
/// the start of `text`; sets *used to the characters read. nullopt if it is not a size or is
/// 1 EiB or more.
std::optional<std::uint64_t> ParsePrintedSize(std::string_view text, std::size_t* used);

}  // namespace fragscope::sources

#endif  // FRAGSCOPE_SOURCES_OOM_TEXT_OOM_TEXT_SCANNER_H_
