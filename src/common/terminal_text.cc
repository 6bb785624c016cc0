#include "common/terminal_text.h"

#include <cstddef>

namespace fragscope {
namespace {

unsigned char ByteAt(std::string_view text, std::size_t i) {
  return static_cast<unsigned char>(text[i]);
}

// Length (2-4) of the well-formed UTF-8 sequence that starts with the non-ASCII byte at
// text[i], or 0 when none does (Unicode's table of well-formed byte sequences: no overlong
// forms, no surrogates, nothing above U+10FFFF, nothing cut short).
std::size_t Utf8SequenceLength(std::string_view text, std::size_t i) {
  const unsigned char lead = ByteAt(text, i);
  std::size_t length = 0;
  unsigned char low = 0x80;  // the range of the second byte
  unsigned char high = 0xbf;
  if (lead >= 0xc2 && lead <= 0xdf) {
    length = 2;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    length = 3;
    if (lead == 0xe0) low = 0xa0;   // overlong below U+0800
    if (lead == 0xed) high = 0x9f;  // surrogates U+D800-U+DFFF
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4;
    if (lead == 0xf0) low = 0x90;   // overlong below U+10000
    if (lead == 0xf4) high = 0x8f;  // above U+10FFFF
  } else {
    return 0;  // a continuation byte, C0/C1 (overlong), or F5-FF
  }
  if (text.size() - i < length) return 0;
  const unsigned char second = ByteAt(text, i + 1);
  if (second < low || second > high) return 0;
  for (std::size_t k = 2; k < length; ++k) {
    if ((ByteAt(text, i + k) & 0xc0) != 0x80) return 0;
  }
  return length;
}

// The code point of the well-formed `length`-byte UTF-8 sequence at text[i].
char32_t DecodeUtf8(std::string_view text, std::size_t i, std::size_t length) {
  static constexpr unsigned char kLeadMask[] = {0, 0x7f, 0x1f, 0x0f, 0x07};
  char32_t cp = ByteAt(text, i) & kLeadMask[length];
  for (std::size_t k = 1; k < length; ++k) cp = (cp << 6) | (ByteAt(text, i + k) & 0x3f);
  return cp;
}

// The invisible bidirectional controls: they reorder how the text around them is shown (the
// "Trojan Source" trick, CVE-2021-42574), so a label or path could display as another one.
// U+061C ALM, U+200E LRM, U+200F RLM, U+202A-U+202E embeddings and overrides, U+2066-U+2069
// isolates.
bool IsBidiControl(char32_t cp) {
  return cp == 0x061c || cp == 0x200e || cp == 0x200f || (cp >= 0x202a && cp <= 0x202e) ||
         (cp >= 0x2066 && cp <= 0x2069);
}

// Length of the SGR sequence ESC '[' (digits and ';')* 'm' at text[i], or 0.
std::size_t SgrLength(std::string_view text, std::size_t i) {
  if (i + 2 >= text.size() || text[i + 1] != '[') return 0;
  for (std::size_t k = i + 2; k < text.size(); ++k) {
    const char c = text[k];
    if (c == 'm') return k + 1 - i;
    if (!((c >= '0' && c <= '9') || c == ';')) return 0;
  }
  return 0;
}

constexpr char kHex[] = "0123456789abcdef";

void AppendHex2(unsigned char c, std::string* out) {
  out->push_back(kHex[c >> 4]);
  out->push_back(kHex[c & 0xf]);
}

// "\xNN" for one byte; in JSON "\u00NN" for the code point NN.
void AppendEscape(unsigned char c, TerminalEscape mode, std::string* out) {
  out->append(mode == TerminalEscape::kJson ? "\\u00" : "\\x");
  AppendHex2(c, out);
}

// How many bytes at text[i] pass unchanged (0: the byte there must be escaped).
std::size_t KeptLength(std::string_view text, std::size_t i, TerminalEscape mode,
                       std::string_view also_escape) {
  const unsigned char c = ByteAt(text, i);
  if (c >= 0x20 && c < 0x7f) {
    return also_escape.find(static_cast<char>(c)) == std::string_view::npos ? 1 : 0;
  }
  if (c == '\n' || c == '\t') return mode == TerminalEscape::kField ? 0 : 1;
  if (c == 0x1b && mode == TerminalEscape::kColoredLines) return SgrLength(text, i);
  if (c < 0x80) return 0;  // other C0 controls and DEL
  const std::size_t length = Utf8SequenceLength(text, i);
  if (length == 2 && c == 0xc2 && ByteAt(text, i + 1) < 0xa0) return 0;  // C1: U+0080-U+009F
  if (length > 0 && (c == 0xd8 || c == 0xe2) && IsBidiControl(DecodeUtf8(text, i, length))) {
    return 0;
  }
  return length;
}

}  // namespace

void AppendTerminalSafe(std::string_view text, TerminalEscape mode, std::string* out,
                        std::string_view also_escape) {
  std::size_t kept_from = 0;  // runs of bytes that pass are appended in one piece
  std::size_t i = 0;
  while (i < text.size()) {
    if (also_escape.empty()) {  // the common case first: a run of printable ASCII
      while (i < text.size() && ByteAt(text, i) >= 0x20 && ByteAt(text, i) < 0x7f) ++i;
      if (i == text.size()) break;
    }
    const std::size_t kept = KeptLength(text, i, mode, also_escape);
    if (kept > 0) {
      i += kept;
      continue;
    }
    out->append(text.substr(kept_from, i - kept_from));
    const unsigned char c = ByteAt(text, i);
    const std::size_t length = Utf8SequenceLength(text, i);
    if (length > 0) {
      // A well-formed C1 or bidirectional control (the only sequences KeptLength escapes):
      // every byte as \xNN, or in JSON the code point.
      if (mode == TerminalEscape::kJson) {
        const char32_t cp = DecodeUtf8(text, i, length);
        out->append("\\u");
        AppendHex2(static_cast<unsigned char>(cp >> 8), out);
        AppendHex2(static_cast<unsigned char>(cp & 0xff), out);
      } else {
        for (std::size_t k = 0; k < length; ++k) AppendEscape(ByteAt(text, i + k), mode, out);
      }
      i += length;
    } else if (c >= 0x80 && mode == TerminalEscape::kJson) {
      out->append("\\ufffd");  // not UTF-8: JSON can only say "replaced"
      ++i;
    } else {
      AppendEscape(c, mode, out);
      ++i;
    }
    kept_from = i;
  }
  out->append(text.substr(kept_from));
}

std::string TerminalSafe(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  AppendTerminalSafe(text, TerminalEscape::kField, &out);
  return out;
}

std::string TerminalSafeLines(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  AppendTerminalSafe(text, TerminalEscape::kLines, &out);
  return out;
}

bool IsTerminalSafe(std::string_view text, TerminalEscape mode) {
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t kept = KeptLength(text, i, mode, {});
    if (kept == 0) return false;
    i += kept;
  }
  return true;
}

}  // namespace fragscope
