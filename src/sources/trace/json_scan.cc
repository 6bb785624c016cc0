#include "sources/trace/json_scan.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdio>
#include <cstring>

#include "common/utf8.h"

namespace fragscope::sources {

namespace {

// Bytes that end the fast path of a string scan: '"', '\\', control characters and non-ASCII.
constexpr std::array<bool, 256> MakeStringSpecial() {
  std::array<bool, 256> special{};
  for (int c = 0; c < 0x20; ++c) special[c] = true;
  for (int c = 0x80; c < 0x100; ++c) special[c] = true;
  special['"'] = true;
  special['\\'] = true;
  return special;
}
constexpr std::array<bool, 256> kStringSpecial = MakeStringSpecial();

// Eight bytes at a time (SWAR), as simdjson and fast_float do: event lines are mostly short
// keys and 13-16 digit numbers, and byte-at-a-time loops spend most of the parse there.
// Little-endian only (the first byte in memory is the lowest); other hosts take the byte loops.
constexpr bool kSwar = std::endian::native == std::endian::little;
constexpr std::uint64_t kOnes = 0x0101010101010101;
constexpr std::uint64_t kHighBits = 0x8080808080808080;

std::uint64_t Load8(const char* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// Index of the first marked byte of a mask with only high bits set (the lowest, on
// little-endian). The bit tricks below may also mark bytes after the first true one (a borrow
// carries upward), never before, so this is exact.
std::size_t FirstMarked(std::uint64_t mask) {
  return static_cast<std::size_t>(std::countr_zero(mask)) >> 3;
}

// Marks the bytes that end the fast path of a string scan: '"', '\\', < 0x20, >= 0x80.
std::uint64_t StringSpecialBytes(std::uint64_t v) {
  auto zero_bytes = [](std::uint64_t x) { return (x - kOnes) & ~x & kHighBits; };
  std::uint64_t quote = zero_bytes(v ^ (kOnes * '"'));
  std::uint64_t backslash = zero_bytes(v ^ (kOnes * '\\'));
  std::uint64_t control = (v - kOnes * 0x20) & ~v & kHighBits;
  return quote | backslash | control | (v & kHighBits);
}

// Marks the bytes that are not ASCII digits. A byte is a digit iff its high nibble is 3 and
// adding 6 does not carry into the high nibble.
std::uint64_t NonDigitBytes(std::uint64_t v) {
  std::uint64_t x =
      (v & 0xF0F0F0F0F0F0F0F0) | (((v + 0x0606060606060606) & 0xF0F0F0F0F0F0F0F0) >> 4);
  // Digit bytes are now 0x33; make every other byte have its high bit set.
  x ^= 0x3333333333333333;
  return ((x | (x + 0x7F7F7F7F7F7F7F7F)) & kHighBits);
}

// The value of eight ASCII digits, the first one most significant.
std::uint64_t EightDigitsValue(std::uint64_t v) {
  v -= 0x3030303030303030;
  v = (v * 10) + (v >> 8);  // pairs: each 16-bit lane holds a 2-digit value in its low byte
  constexpr std::uint64_t kMask = 0x000000FF000000FF;
  constexpr std::uint64_t kMul1 = 100 + (std::uint64_t{1000000} << 32);
  constexpr std::uint64_t kMul2 = 1 + (std::uint64_t{10000} << 32);
  return (((v & kMask) * kMul1) + (((v >> 16) & kMask) * kMul2)) >> 32;
}

// The index of the first byte at or after i that ends a run of plain string bytes (or the
// end of the text).
std::size_t SkipPlainStringBytes(std::string_view text, std::size_t i) {
  const std::size_t n = text.size();
  if constexpr (kSwar) {
    for (; n - i >= 8; i += 8) {
      std::uint64_t special = StringSpecialBytes(Load8(text.data() + i));
      if (special != 0) return i + FirstMarked(special);
    }
  }
  while (i < n && !kStringSpecial[static_cast<unsigned char>(text[i])]) ++i;
  return i;
}

constexpr std::uint64_t kPow10[8] = {1, 10, 100, 1000, 10000, 100000, 1000000, 10000000};

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Reads 4 hex digits at text[i..i+4); -1 if they are not all hex (or missing).
int Hex4(std::string_view text, std::size_t i) {
  if (text.size() - i < 4 || i > text.size()) return -1;
  int value = 0;
  for (std::size_t k = 0; k < 4; ++k) {
    int h = HexValue(text[i + k]);
    if (h < 0) return -1;
    value = value * 16 + h;
  }
  return value;
}

// Length of the valid UTF-8 sequence starting at text[i] (a byte >= 0x80), or 0 if invalid.
std::size_t Utf8SequenceLength(std::string_view text, std::size_t i) {
  auto byte = [&](std::size_t k) -> unsigned {
    return i + k < text.size() ? static_cast<unsigned char>(text[i + k]) : 0u;
  };
  auto cont = [](unsigned b) { return (b & 0xC0u) == 0x80u; };
  unsigned b0 = byte(0);
  if (b0 >= 0xC2 && b0 <= 0xDF) return cont(byte(1)) ? 2 : 0;
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    unsigned b1 = byte(1);
    // E0: no overlongs (A0..BF); ED: no UTF-16 surrogates (80..9F).
    unsigned lo = b0 == 0xE0 ? 0xA0 : 0x80;
    unsigned hi = b0 == 0xED ? 0x9F : 0xBF;
    return (b1 >= lo && b1 <= hi && cont(byte(2))) ? 3 : 0;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    unsigned b1 = byte(1);
    // F0: no overlongs (90..BF); F4: nothing above U+10FFFF (80..8F).
    unsigned lo = b0 == 0xF0 ? 0x90 : 0x80;
    unsigned hi = b0 == 0xF4 ? 0x8F : 0xBF;
    return (b1 >= lo && b1 <= hi && cont(byte(2)) && cont(byte(3))) ? 4 : 0;
  }
  return 0;
}

}  // namespace

// ---- Errors ---------------------------------------------------------------------------------

bool JsonScanner::Error(std::size_t at, std::string_view what) {
  error_ = Status::Corruption("column " + std::to_string(at + 1) + ": " + std::string(what));
  return false;
}

bool JsonScanner::Expected(std::string_view what) {
  std::string found;
  if (AtEnd()) {
    found = "end of line";
  } else {
    unsigned char c = static_cast<unsigned char>(text_[pos_]);
    if (c >= 0x20 && c < 0x7F) {
      found = std::string("'") + static_cast<char>(c) + "'";
    } else {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "0x%02x", c);
      found = std::string("byte ") + hex;
    }
  }
  return Error(pos_, "expected " + std::string(what) + ", found " + found);
}

void JsonScanner::SkipWhitespaceRun() {
  while (pos_ < text_.size() && IsJsonSpace(text_[pos_])) ++pos_;
}

// ---- Scalars --------------------------------------------------------------------------------

bool JsonScanner::ScanString(JsonToken* token) {
  const std::size_t begin = pos_;
  const std::size_t n = text_.size();
  bool escapes = false;
  std::size_t i = pos_ + 1;  // past the opening quote
  for (;;) {
    i = SkipPlainStringBytes(text_, i);
    if (i >= n) return Error(begin, "string is not terminated before the end of the line");
    unsigned char c = static_cast<unsigned char>(text_[i]);
    if (c == '"') break;
    if (c == '\\') {
      escapes = true;
      char e = i + 1 < n ? text_[i + 1] : '\0';
      switch (e) {
        case '"':
        case '\\':
        case '/':
        case 'b':
        case 'f':
        case 'n':
        case 'r':
        case 't':
          i += 2;
          continue;
        case 'u': {
          int cp = Hex4(text_, i + 2);
          if (cp < 0) return Error(i, "\\u must be followed by 4 hex digits");
          if (cp >= 0xDC00 && cp <= 0xDFFF) {
            return Error(i, "unpaired UTF-16 low surrogate in \\u escape");
          }
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            // A high surrogate must be followed by an escaped low surrogate.
            int low = (i + 7 < n && text_[i + 6] == '\\' && text_[i + 7] == 'u')
                          ? Hex4(text_, i + 8)
                          : -1;
            if (low < 0xDC00 || low > 0xDFFF) {
              return Error(i, "unpaired UTF-16 high surrogate in \\u escape");
            }
            i += 12;
          } else {
            i += 6;
          }
          continue;
        }
        default:
          return Error(i, "invalid escape sequence in string");
      }
    }
    if (c < 0x20) return Error(i, "control character in string (must be escaped)");
    std::size_t len = Utf8SequenceLength(text_, i);
    if (len == 0) return Error(i, "invalid UTF-8 in string");
    i += len;
  }
  pos_ = i + 1;
  token->type = JsonType::kString;
  token->begin = begin;
  token->end = pos_;
  token->has_escapes = escapes;
  return true;
}

bool JsonScanner::ScanNumber(JsonToken* token) {
  const std::size_t begin = pos_;
  const std::size_t n = text_.size();
  std::size_t i = pos_;
  bool negative = false;
  if (text_[i] == '-') {
    negative = true;
    ++i;
  }
  if (i >= n || !IsAsciiDigit(text_[i])) return Error(begin, "invalid number: no digits");
  std::uint64_t magnitude = 0;
  bool overflow = false;
  if (text_[i] == '0') {
    ++i;
    if (i < n && IsAsciiDigit(text_[i])) return Error(begin, "invalid number: leading zero");
  } else {
    // Up to 16 digits (8 at a time; a shorter run in one step) need no overflow check.
    if constexpr (kSwar) {
      for (int chunk = 0; chunk < 2 && n - i >= 8; ++chunk) {
        std::uint64_t v = Load8(text_.data() + i);
        std::uint64_t non_digits = NonDigitBytes(v);
        if (non_digits == 0) {
          magnitude = magnitude * 100000000 + EightDigitsValue(v);
          i += 8;
          continue;
        }
        std::size_t k = FirstMarked(non_digits);  // digits before the first non-digit
        if (k > 0) {
          // Move the k digits to the end (the least significant places) and pad with '0's.
          unsigned shift = static_cast<unsigned>(8 * (8 - k));
          v = (v << shift) | (0x3030303030303030 >> (64 - shift));
          magnitude = magnitude * kPow10[k] + EightDigitsValue(v);
          i += k;
        }
        break;
      }
    }
    // UINT64_MAX = 18446744073709551615: the last step that still fits.
    constexpr std::uint64_t kMaxDiv10 = UINT64_MAX / 10;
    constexpr std::uint64_t kMaxLastDigit = UINT64_MAX % 10;
    while (i < n && IsAsciiDigit(text_[i])) {
      std::uint64_t d = static_cast<std::uint64_t>(text_[i] - '0');
      if (overflow || magnitude > kMaxDiv10 || (magnitude == kMaxDiv10 && d > kMaxLastDigit)) {
        overflow = true;
      } else {
        magnitude = magnitude * 10 + d;
      }
      ++i;
    }
  }
  bool is_integer = true;
  if (i < n && text_[i] == '.') {
    is_integer = false;
    ++i;
    if (i >= n || !IsAsciiDigit(text_[i])) return Error(i, "invalid number: no digits after '.'");
    while (i < n && IsAsciiDigit(text_[i])) ++i;
  }
  if (i < n && (text_[i] == 'e' || text_[i] == 'E')) {
    is_integer = false;
    ++i;
    if (i < n && (text_[i] == '+' || text_[i] == '-')) ++i;
    if (i >= n || !IsAsciiDigit(text_[i])) return Error(i, "invalid number: no digits in exponent");
    while (i < n && IsAsciiDigit(text_[i])) ++i;
  }
  pos_ = i;
  token->type = JsonType::kNumber;
  token->begin = begin;
  token->end = i;
  token->negative = negative;
  token->is_integer = is_integer;
  token->overflow = overflow;
  token->magnitude = magnitude;
  return true;
}

bool JsonScanner::ScanLiteral(std::string_view word, JsonType type, JsonToken* token) {
  if (text_.substr(pos_, word.size()) != word) {
    return Error(pos_, "invalid literal (expected " + std::string(word) + ")");
  }
  token->type = type;
  token->begin = pos_;
  pos_ += word.size();
  token->end = pos_;
  return true;
}

// ---- Values and containers ------------------------------------------------------------------

bool JsonScanner::ScanValue(JsonToken* token, int max_depth) {
  switch (Peek()) {
    case '"':
      return ScanString(token);
    case '{':
    case '[':
      return ScanContainer(token, max_depth);
    case 't':
      return ScanLiteral("true", JsonType::kTrue, token);
    case 'f':
      return ScanLiteral("false", JsonType::kFalse, token);
    case 'n':
      return ScanLiteral("null", JsonType::kNull, token);
    default:
      if (Peek() == '-' || IsAsciiDigit(Peek())) return ScanNumber(token);
      if (AtEnd()) return Expected("a value");
      return Expected("a value (string, number, object, array, true, false or null)");
  }
}

bool JsonScanner::ScanKeyColon() {
  SkipWhitespace();
  if (Peek() != '"' || AtEnd()) return Expected("a key string");
  JsonToken key;
  if (!ScanString(&key)) return false;
  SkipWhitespace();
  if (!Consume(':')) return Expected("':' after the key");
  return true;
}

// Validates a nested array/object with an explicit stack (no recursion), so hostile nesting
// costs a bounded amount of memory and no stack depth.
bool JsonScanner::ScanContainer(JsonToken* token, int max_depth) {
  const std::size_t begin = pos_;
  // The open containers, innermost last: true for an object. The stack is fixed-size, so a
  // caller may go at most one level beyond kMaxJsonDepth (the header's own object).
  std::array<bool, kMaxJsonDepth + 1> is_object{};
  max_depth = std::min(max_depth, kMaxJsonDepth + 1);
  int depth = 0;
  JsonToken scalar;
  for (;;) {
    // Here a value is expected at pos_ (the container itself on the first turn).
    SkipWhitespace();
    char c = Peek();
    bool closed_empty = false;
    if ((c == '{' || c == '[') && !AtEnd()) {
      if (depth == max_depth) {
        error_ = Status::LimitExceeded("column " + std::to_string(pos_ + 1) +
                                       ": arrays/objects nested deeper than " +
                                       std::to_string(kMaxJsonDepth) + " levels");
        return false;
      }
      is_object[depth++] = c == '{';
      ++pos_;
      SkipWhitespace();
      if (Consume(c == '{' ? '}' : ']')) {
        --depth;
        closed_empty = true;
      } else if (c == '{') {
        if (!ScanKeyColon()) return false;
        continue;  // the member's value
      } else {
        continue;  // the first element
      }
    }
    if (!closed_empty && !ScanValue(&scalar)) return false;
    // After a value: ',' for the next member/element, or close containers.
    for (;;) {
      if (depth == 0) {
        token->type = text_[begin] == '{' ? JsonType::kObject : JsonType::kArray;
        token->begin = begin;
        token->end = pos_;
        return true;
      }
      SkipWhitespace();
      bool object = is_object[depth - 1];
      if (Consume(',')) {
        if (object && !ScanKeyColon()) return false;
        break;  // the next value
      }
      if (Consume(object ? '}' : ']')) {
        --depth;
        continue;
      }
      return Expected(object ? "',' or '}'" : "',' or ']'");
    }
  }
}

// ---- Decoding and encoding ------------------------------------------------------------------

void DecodeJsonString(std::string_view body, std::string* out) {
  out->clear();
  out->reserve(body.size());
  for (std::size_t i = 0; i < body.size(); ++i) {
    char c = body[i];
    if (c != '\\' || i + 1 >= body.size()) {
      out->push_back(c);
      continue;
    }
    char e = body[++i];
    switch (e) {
      case 'b':
        out->push_back('\b');
        break;
      case 'f':
        out->push_back('\f');
        break;
      case 'n':
        out->push_back('\n');
        break;
      case 'r':
        out->push_back('\r');
        break;
      case 't':
        out->push_back('\t');
        break;
      case 'u': {
        int cp = Hex4(body, i + 1);
        if (cp < 0) return;  // not reached for bodies ScanString accepted
        i += 4;
        std::uint32_t code = static_cast<std::uint32_t>(cp);
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          int low = Hex4(body, i + 3);
          if (low < 0) return;
          code = 0x10000 + ((code - 0xD800) << 10) + (static_cast<std::uint32_t>(low) - 0xDC00);
          i += 6;
        }
        AppendUtf8(code, out);
        break;
      }
      default:
        out->push_back(e);
        break;  // '"', '\\', '/'
    }
  }
}

bool IsValidUtf8(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    std::size_t len = Utf8SequenceLength(text, i);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

std::string ToValidUtf8(std::string_view text) {
  if (IsValidUtf8(text)) return std::string(text);
  std::string out;
  out.reserve(text.size() + text.size() / 2);
  for (std::size_t i = 0; i < text.size();) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      out.push_back(text[i++]);
      continue;
    }
    const std::size_t len = Utf8SequenceLength(text, i);
    if (len == 0) {
      out.append("\xef\xbf\xbd");  // U+FFFD for the byte that starts no valid sequence
      ++i;
    } else {
      out.append(text.substr(i, len));
      i += len;
    }
  }
  return out;
}

bool AppendJsonString(std::string_view text, std::string* out) {
  if (!IsValidUtf8(text)) return false;
  out->push_back('"');
  for (char c : text) {
    unsigned char u = static_cast<unsigned char>(c);
    if (u >= 0x20 && c != '"' && c != '\\') {
      out->push_back(c);
      continue;
    }
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      case '\b':
        out->append("\\b");
        break;
      case '\f':
        out->append("\\f");
        break;
      default: {
        char esc[8];
        std::snprintf(esc, sizeof(esc), "\\u%04x", u);
        out->append(esc);
      }
    }
  }
  out->push_back('"');
  return true;
}

}  // namespace fragscope::sources
