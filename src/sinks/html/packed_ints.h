// PackedInts: integers written as a string of base-64 digits for the HTML report's data (issue
// 33 item 1: a page of hundreds of thousands of blocks stays small). Each digit holds 5 bits of
// the number, least significant first; digits 32..63 say "more follows", 0..31 end the number,
// so numbers need no separators (0..31 take one digit, an address of 2^47 ten). Signed numbers
// are zigzagged (0, -1, 1, -2 … → 0, 1, 2, 3 …). The digits are A–Z a–z 0–9 - _ (base64url):
// none needs escaping in JSON, and none is '<'. report.js (unpackInts) reads them back.
//
// Thread safety: none; a writer belongs to one thread.
#ifndef FRAGSCOPE_SINKS_HTML_PACKED_INTS_H_
#define FRAGSCOPE_SINKS_HTML_PACKED_INTS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fragscope::sinks {

class PackedInts {
 public:
  void Put(std::uint64_t value);
  /// Zigzag: 0 → 0, -1 → 1, 1 → 2, -2 → 3, …
  void PutSigned(std::int64_t value);
  const std::string& text() const { return text_; }
  std::string Take() { return std::move(text_); }

 private:
  std::string text_;
};

/// The numbers of `text` as written by PackedInts::Put (a reference reader for tests and
/// tools; the page reads them in report.js). nullopt: a digit outside the alphabet, a number
/// cut short, or one beyond 64 bits.
std::optional<std::vector<std::uint64_t>> UnpackInts(std::string_view text);

/// PackedInts::PutSigned's zigzag: 0 → 0, -1 → 1, 1 → 2, -2 → 3, …
std::uint64_t Zigzag(std::int64_t value);
/// Its inverse.
std::int64_t Unzigzag(std::uint64_t value);

}  // namespace fragscope::sinks

#endif  // FRAGSCOPE_SINKS_HTML_PACKED_INTS_H_
