// TextTable: the plain-text tables of the terminal reports (`analyze`, `diff`): columns padded
// to their widest cell, ANSI color sequences taking no width.
//
// Thread safety: a TextTable is a plain value; the functions are pure.
#ifndef FRAGSCOPE_SINKS_REPORT_TEXT_TABLE_H_
#define FRAGSCOPE_SINKS_REPORT_TEXT_TABLE_H_

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fragscope::sinks {

/// Width on screen: ANSI color sequences ("\x1b[...m") take none.
std::size_t VisibleWidth(std::string_view text);

/// `text` padded with spaces to `width` on screen; `align` '>' pads on the left.
std::string Pad(std::string_view text, std::size_t width, char align);

class Table {
 public:
  /// `align` holds one of '<' or '>' per column.
  Table(std::vector<std::string> header, std::string align)
      : header_(std::move(header)), align_(std::move(align)) {}

  void AddRow(std::vector<std::string> row) { rows_.push_back(std::move(row)); }

  /// The header and the rows, one line each, every line starting with `indent`, columns two
  /// spaces apart, trailing spaces cut.
  std::string Render(std::string_view indent) const;

 private:
  std::vector<std::string> header_;
  std::string align_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace fragscope::sinks

#endif  // FRAGSCOPE_SINKS_REPORT_TEXT_TABLE_H_
