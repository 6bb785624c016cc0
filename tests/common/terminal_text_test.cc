#include "common/terminal_text.h"

#include <string>
#include <string_view>

#include <gtest/gtest.h>

namespace fragscope {
namespace {

using namespace std::string_literals;

std::string Lines(std::string_view text) { return TerminalSafeLines(text); }

std::string Colored(std::string_view text) {
  std::string out;
  AppendTerminalSafe(text, TerminalEscape::kColoredLines, &out);
  return out;
}

std::string Json(std::string_view text) {
  std::string out;
  AppendTerminalSafe(text, TerminalEscape::kJson, &out);
  return out;
}

// No byte of `text` is one a terminal acts on: C0 but \n and \t, DEL, and 0x80-0x9f are the
// bytes checked; a byte 0x80-0x9f that is not inside a well-formed sequence is not expected
// in output whose only non-ASCII bytes are the unchanged UTF-8 of the input.
bool HasControlBytes(std::string_view text, bool keep_newlines) {
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if ((c == '\n' || c == '\t') && keep_newlines) continue;
    if (c < 0x20 || c == 0x7f) return true;
    if (c == 0xc2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) < 0xa0) {
      return true;
    }
  }
  return false;
}

TEST(TerminalTextTest, Issue24EscapesEsc) {
  EXPECT_EQ(TerminalSafe("a\x1b"
                         "b"),
            "a\\x1bb");
}

TEST(TerminalTextTest, Issue24EscapesOscTitleSequence) {
  // OSC 0 (set the window title) ended by BEL, and OSC 52 (write the clipboard).
  EXPECT_EQ(TerminalSafe("x\x1b]0;title\x07y"), "x\\x1b]0;title\\x07y");
  EXPECT_EQ(TerminalSafe("\x1b]52;c;cHduZWQ=\x07"), "\\x1b]52;c;cHduZWQ=\\x07");
}

TEST(TerminalTextTest, Issue24EscapesCsiSequences) {
  EXPECT_EQ(TerminalSafe("\x1b[2J\x1b[31mred\x1b[0m"), "\\x1b[2J\\x1b[31mred\\x1b[0m");
  EXPECT_EQ(Lines("\x1b[1A\x1b[K"), "\\x1b[1A\\x1b[K");
}

TEST(TerminalTextTest, Issue24EscapesNulBelAndOtherC0) {
  EXPECT_EQ(TerminalSafe("a\0b"s), "a\\x00b");
  EXPECT_EQ(TerminalSafe("\a"), "\\x07");
  EXPECT_EQ(TerminalSafe("\b\r\f\v\x01\x1f"), "\\x08\\x0d\\x0c\\x0b\\x01\\x1f");
  EXPECT_EQ(TerminalSafe("\x7f"), "\\x7f");  // DEL
}

TEST(TerminalTextTest, Issue24NewlineAndTabAreKeptOnlyInLines) {
  EXPECT_EQ(TerminalSafe("a\nb\tc"), "a\\x0ab\\x09c");
  EXPECT_EQ(Lines("a\nb\tc\r\n"), "a\nb\tc\\x0d\n");
}

TEST(TerminalTextTest, Issue24EscapesRawC1Bytes) {
  // 0x9b is CSI and 0x9d OSC to an 8-bit terminal; alone they are not UTF-8.
  EXPECT_EQ(TerminalSafe("\x9b"
                         "31m"),
            "\\x9b31m");
  EXPECT_EQ(TerminalSafe("\x9d"
                         "0;t\x9c"),
            "\\x9d0;t\\x9c");
  EXPECT_EQ(TerminalSafe("\x80\x85\x9f"), "\\x80\\x85\\x9f");
}

TEST(TerminalTextTest, Issue24EscapesC1InUtf8) {
  // U+009B (CSI), U+0085 (NEL), U+0080 and U+009F as UTF-8.
  EXPECT_EQ(TerminalSafe("\xc2\x9b"
                         "31m"),
            "\\xc2\\x9b31m");
  EXPECT_EQ(TerminalSafe("\xc2\x85\xc2\x80\xc2\x9f"), "\\xc2\\x85\\xc2\\x80\\xc2\\x9f");
  // U+00A0 (no-break space) is the first character after them: kept.
  EXPECT_EQ(TerminalSafe("\xc2\xa0"), "\xc2\xa0");
}

TEST(TerminalTextTest, Issue24KeepsValidMultiByteUtf8) {
  const std::string text =
      "caf\xc3\xa9 "                  // é
      "\xe6\x98\xbe\xe5\xad\x98 "     // 显存 (CJK)
      "\xf0\x9f\x94\xa5 "             // U+1F525 (four bytes)
      "\xe2\x96\x88\xe2\x80\xa6 \\";  // █ … and a backslash
  EXPECT_EQ(TerminalSafe(text), text);
  EXPECT_EQ(Lines(text), text);
  EXPECT_EQ(Json(text), text);
  EXPECT_TRUE(IsTerminalSafe(text, TerminalEscape::kField));
}

TEST(TerminalTextTest, Issue24EscapesInvalidUtf8ByteByByte) {
  EXPECT_EQ(TerminalSafe("\xff\xfe"), "\\xff\\xfe");
  EXPECT_EQ(TerminalSafe("\xc3\x28"), "\\xc3(");                        // bad continuation
  EXPECT_EQ(TerminalSafe("\xc0\xaf"), "\\xc0\\xaf");                    // overlong '/'
  EXPECT_EQ(TerminalSafe("\xe0\x80\xaf"), "\\xe0\\x80\\xaf");           // overlong, 3 bytes
  EXPECT_EQ(TerminalSafe("\xed\xa0\x80"), "\\xed\\xa0\\x80");           // a surrogate
  EXPECT_EQ(TerminalSafe("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");  // above U+10FFFF
  EXPECT_EQ(TerminalSafe("ok\xe6\x98"), "ok\\xe6\\x98");                // cut short
  // A C1 byte hidden as a continuation byte after a bad lead is escaped too.
  EXPECT_EQ(TerminalSafe("\xe6\x9b"), "\\xe6\\x9b");
}

TEST(TerminalTextTest, Issue24NoControlByteSurvivesAnyInput) {
  // Every byte value, alone and after each lead byte: the output never holds one.
  for (int a = 0; a < 256; ++a) {
    for (int b = 0; b < 256; b += 7) {
      const std::string text = {static_cast<char>(a), static_cast<char>(b), 'x'};
      const std::string field = TerminalSafe(text);
      EXPECT_FALSE(HasControlBytes(field, false)) << a << " " << b;
      EXPECT_TRUE(IsTerminalSafe(field, TerminalEscape::kField)) << a << " " << b;
      EXPECT_EQ(IsTerminalSafe(text, TerminalEscape::kField), field == text) << a << " " << b;
      EXPECT_FALSE(HasControlBytes(Lines(text), true)) << a << " " << b;
      EXPECT_FALSE(HasControlBytes(Json(text), true)) << a << " " << b;
    }
  }
}

TEST(TerminalTextTest, Issue24ColoredLinesKeepOnlySgr) {
  EXPECT_EQ(Colored("\x1b[1mtitle\x1b[0m\n\x1b[1;31mx\x1b[m"),
            "\x1b[1mtitle\x1b[0m\n\x1b[1;31mx\x1b[m");
  EXPECT_EQ(Colored("\x1b[2J\x1b]0;t\x07\x1b[31"), "\\x1b[2J\\x1b]0;t\\x07\\x1b[31");
}

TEST(TerminalTextTest, Issue24JsonFormKeepsJsonValid) {
  // nlohmann::json leaves DEL and C1 raw inside strings; \u escapes decode to the same string.
  EXPECT_EQ(Json("{\"a\": \"x\x7fy\xc2\x9bz\xc2\x85\"}\n"),
            "{\"a\": \"x\\u007fy\\u009bz\\u0085\"}\n");
  EXPECT_EQ(Json("\x1b\t"), "\\u001b\t");
  EXPECT_EQ(Json("\x9b\xff"), "\\ufffd\\ufffd");
}

TEST(TerminalTextTest, Issue24AlsoEscapeQuotesTheDelimiter) {
  EXPECT_EQ(
      [] {
        std::string out;
        AppendTerminalSafe("it's a\\b\x1b", TerminalEscape::kField, &out, "'\\");
        return out;
      }(),
      "it\\x27s a\\x5cb\\x1b");
}

// "Trojan Source": a right-to-left override makes "run\u202e1txt.exe" display reversed after
// it; every bidirectional control is written byte by byte (text) or as its code point (JSON),
// while right-to-left letters themselves (Hebrew, Arabic) pass.
TEST(TerminalTextTest, Issue24EscapesBidirectionalControls) {
  EXPECT_EQ(TerminalSafe("run\u202e1txt.exe"), "run\\xe2\\x80\\xae1txt.exe");
  EXPECT_EQ(Lines("a\u2066b\u2069c\u200fd\u061ce"),
            "a\\xe2\\x81\\xa6b\\xe2\\x81\\xa9c\\xe2\\x80\\x8fd\\xd8\\x9ce");
  EXPECT_EQ(Json("\"x\u202ay\u2068\""), "\"x\\u202ay\\u2068\"");
  for (std::string_view control : {"\u061c", "\u200e", "\u200f", "\u202a", "\u202b", "\u202c",
                                   "\u202d", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069"}) {
    EXPECT_FALSE(IsTerminalSafe(control, TerminalEscape::kLines)) << TerminalSafe(control);
  }
  // Neighbours that are not controls, and right-to-left letters, pass.
  for (std::string_view kept : {"\u2010", "\u2029", "\u2065", "\u206a", "\u061b",
                                "\u05e9\u05dc\u05d5\u05dd", "\u0633\u0644\u0627\u0645"}) {
    EXPECT_EQ(TerminalSafe(kept), kept);
  }
}

TEST(TerminalTextTest, Issue24PlainTextIsUnchanged) {
  const std::string text = "fragscope analyze: run.jsonl\n  labels: model=gpt, dtype=bf16\n";
  EXPECT_EQ(Lines(text), text);
  EXPECT_TRUE(IsTerminalSafe(text, TerminalEscape::kLines));
  EXPECT_FALSE(IsTerminalSafe(text, TerminalEscape::kField));
  EXPECT_EQ(TerminalSafe(""), "");
}

}  // namespace
}  // namespace fragscope
