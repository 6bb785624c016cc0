// JsonScanner: a small, allocation-free JSON tokenizer for one line of text.
//
// The trace reader parses event lines with it instead of a DOM library: it validates any value
// (nested arrays/objects iteratively, with a depth limit; strings including escapes and UTF-8)
// and reports what it found as a JsonToken — a span of the line plus, for numbers, the integer
// value. Nothing is copied unless a string with escapes is decoded.
//
// Thread safety: a scanner is used by one thread at a time.
#ifndef FRAGSCOPE_SOURCES_TRACE_JSON_SCAN_H_
#define FRAGSCOPE_SOURCES_TRACE_JSON_SCAN_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fragscope/status.h"

// The scanner's one-line helpers run ~20 times per event line; GCC stops inlining them into
// the reader's (large) line parser, which costs more than the helpers themselves.
#if defined(__GNUC__)
#define FRAGSCOPE_SCAN_INLINE [[gnu::always_inline]] inline
#else
#define FRAGSCOPE_SCAN_INLINE inline
#endif

namespace fragscope::sources {

/// Arrays/objects may nest this deep below a line's top-level object. PyTorch's trace
/// entries nest 2 deep (frames: [{...}]); the limit keeps hostile input from costing much.
inline constexpr int kMaxJsonDepth = 64;

enum class JsonType : std::uint8_t { kString, kNumber, kTrue, kFalse, kNull, kObject, kArray };

/// A scanned value: where it lies in the text and what the scan learned about it.
struct JsonToken {
  JsonType type = JsonType::kNull;
  std::size_t begin = 0;  // offset of its first byte (a string's opening quote)
  std::size_t end = 0;    // offset one past its last byte
  // kString: the string holds backslash escapes, so its body must be decoded before use.
  bool has_escapes = false;
  // kNumber: sign, whether it is a plain integer (no fraction or exponent), and the integer
  // part's magnitude (valid unless `overflow`, i.e. it does not fit in 64 bits).
  bool negative = false;
  bool is_integer = false;
  bool overflow = false;
  std::uint64_t magnitude = 0;
};

/// Tokenizes `text` from left to right. The Scan* functions return false on an error and leave
/// it in error(): kCorruption (kLimitExceeded for the depth limit) with a message that starts
/// "column N: " (1-based byte column) and says what was expected and what was found. (bool
/// rather than Status on this path: building a Status per token costs more than the token.)
class JsonScanner {
 public:
  explicit JsonScanner(std::string_view text) : text_(text) {}

  std::size_t pos() const { return pos_; }
  FRAGSCOPE_SCAN_INLINE bool AtEnd() const { return pos_ == text_.size(); }
  /// The next byte, or '\0' at the end.
  FRAGSCOPE_SCAN_INLINE char Peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  FRAGSCOPE_SCAN_INLINE void SkipWhitespace() {
    // Compact lines have none: keep that test inline and the loop out of line.
    if (pos_ < text_.size() && IsJsonSpace(text_[pos_])) SkipWhitespaceRun();
  }
  /// Consumes `c` if it is the next byte.
  FRAGSCOPE_SCAN_INLINE bool Consume(char c) {
    if (pos_ == text_.size() || text_[pos_] != c) return false;
    ++pos_;
    return true;
  }

  /// Scans a string. REQUIRES: Peek() == '"'.
  bool ScanString(JsonToken* token);
  /// Scans any value at the current position (no leading whitespace), validating nested
  /// content without recursion. Arrays/objects may nest `max_depth` deep, the value itself
  /// counting as one level if it is one.
  bool ScanValue(JsonToken* token, int max_depth = kMaxJsonDepth);

  /// Records "column N: expected <what>, found <the next byte or end of line>"; returns false.
  bool Expected(std::string_view what);
  /// Records "column <at + 1>: <what>" as kCorruption; returns false.
  bool Error(std::size_t at, std::string_view what);

  /// The error of the last Scan*/Expected/Error call that returned false.
  const Status& error() const { return error_; }

  /// The token's text as it appears in the line (strings with their quotes).
  std::string_view Text(const JsonToken& token) const {
    return text_.substr(token.begin, token.end - token.begin);
  }
  /// A string token's text between the quotes, still escaped.
  std::string_view StringBody(const JsonToken& token) const {
    return text_.substr(token.begin + 1, token.end - token.begin - 2);
  }

  FRAGSCOPE_SCAN_INLINE static bool IsJsonSpace(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
  }

 private:
  void SkipWhitespaceRun();
  bool ScanNumber(JsonToken* token);
  bool ScanLiteral(std::string_view word, JsonType type, JsonToken* token);
  bool ScanContainer(JsonToken* token, int max_depth);
  bool ScanKeyColon();  // inside an object: a key string, whitespace, ':'

  std::string_view text_;
  std::size_t pos_ = 0;
  Status error_;
};

/// Decodes the body of a string that ScanString accepted (escapes, \uXXXX and surrogate pairs
/// to UTF-8) into *out, replacing its content.
void DecodeJsonString(std::string_view body, std::string* out);

/// Appends `text` to *out as a JSON string (with quotes), escaping '"', '\\' and control
/// characters. Returns false if `text` is not valid UTF-8 (JSON text must be).
bool AppendJsonString(std::string_view text, std::string* out);

/// Whether `text` is valid UTF-8 (RFC 3629: no overlongs, no surrogates, at most U+10FFFF).
bool IsValidUtf8(std::string_view text);
/// `text` with each byte that starts no valid UTF-8 sequence replaced by U+FFFD.
std::string ToValidUtf8(std::string_view text);

}  // namespace fragscope::sources

#endif  // FRAGSCOPE_SOURCES_TRACE_JSON_SCAN_H_
