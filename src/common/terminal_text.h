// Terminal-safe text: the one escaping every text sink applies to what it prints, so that a
// file, a log, a label or a daemon's answer cannot drive the terminal that shows a report
// (retitle the window, rewrite the screen, write the clipboard, ring the bell): issue 24 item 3.
//
// What is escaped: C0 controls (0x00-0x1f), except newline and tab where the caller says they
// are structure (kLines, kColoredLines); DEL (0x7f); C1 controls U+0080-U+009F, which arrive
// as UTF-8 (C2 80 .. C2 9F); and every byte that is not part of well-formed UTF-8 (so the raw
// bytes 0x80-0x9f that 8-bit terminals read as C1 controls, stray continuation bytes,
// overlong forms, surrogates, truncated sequences); and the invisible bidirectional controls
// (U+061C, U+200E, U+200F, U+202A-U+202E, U+2066-U+2069), which reorder how the text around
// them is shown. Each such byte is written as "\xNN" with two lowercase hex digits: ESC is
// \x1b, BEL \x07, NUL \x00, U+009B is \xc2\x9b, a raw 0x9b byte \x9b, U+202E is
// \xe2\x80\xae. Everything else, well-formed UTF-8 ("é", CJK, emoji) included, passes
// unchanged.
// The backslash itself is not escaped: the form is for reading, not for parsing back.
//
// JSON output (kJson) keeps JSON valid and its strings' values unchanged: DEL and C1 controls
// become \u007f and \u0080-\u009f, other C0 controls (nlohmann::json already escapes them
// inside strings) \u00NN, a bidirectional control \uNNNN (e.g. \u202e), a byte that is not
// UTF-8 \ufffd (what the JSON writers' "replace" handler writes anyway). docs/user-guide.md,
// "Terminal safety", documents both forms.
//
// Thread safety: pure functions.
#ifndef FRAGSCOPE_COMMON_TERMINAL_TEXT_H_
#define FRAGSCOPE_COMMON_TERMINAL_TEXT_H_

#include <string>
#include <string_view>

namespace fragscope {

enum class TerminalEscape {
  /// One value inside a line (a name, a label, a path): newline and tab are escaped too, so a
  /// value cannot start a line of its own or move the columns of a table.
  kField,
  /// Whole lines of text: newline and tab are kept.
  kLines,
  /// kLines, and the SGR color sequences (ESC '[' digits and ';' 'm') a colored report writes
  /// itself are kept; every other ESC is escaped. Only for output whose fields went through
  /// kField first.
  kColoredLines,
  /// JSON text as nlohmann::json writes it; see the banner.
  kJson,
};

/// Appends `text` to `*out` with the bytes the banner lists escaped as `mode` says. Bytes in
/// `also_escape` (ASCII only, e.g. a quote that delimits the value) are written as \xNN too.
void AppendTerminalSafe(std::string_view text, TerminalEscape mode, std::string* out,
                        std::string_view also_escape = {});

/// `text` as one field of a line (TerminalEscape::kField).
std::string TerminalSafe(std::string_view text);

/// `text` as whole lines (TerminalEscape::kLines): newline and tab kept.
std::string TerminalSafeLines(std::string_view text);

/// Whether `text` comes out of AppendTerminalSafe unchanged in `mode` (no byte to escape).
bool IsTerminalSafe(std::string_view text, TerminalEscape mode);

}  // namespace fragscope

#endif  // FRAGSCOPE_COMMON_TERMINAL_TEXT_H_
