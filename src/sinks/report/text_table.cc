#include "sinks/report/text_table.h"

#include <algorithm>

namespace fragscope::sinks {

std::size_t VisibleWidth(std::string_view text) {
  std::size_t width = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\x1b') {
      while (i < text.size() && text[i] != 'm') ++i;
      continue;
    }
    ++width;
  }
  return width;
}

std::string Pad(std::string_view text, std::size_t width, char align) {
  const std::size_t visible = VisibleWidth(text);
  const std::string fill(width > visible ? width - visible : 0, ' ');
  return align == '>' ? fill + std::string(text) : std::string(text) + fill;
}

std::string Table::Render(std::string_view indent) const {
  std::vector<std::size_t> width(header_.size(), 0);
  auto measure = [&](const std::vector<std::string>& row) {
    for (std::size_t i = 0; i < row.size() && i < width.size(); ++i) {
      width[i] = std::max(width[i], VisibleWidth(row[i]));
    }
  };
  measure(header_);
  for (const auto& row : rows_) measure(row);
  std::string out;
  auto emit = [&](const std::vector<std::string>& row) {
    std::string line(indent);
    for (std::size_t i = 0; i < row.size() && i < width.size(); ++i) {
      if (i != 0) line += "  ";
      line += Pad(row[i], width[i], align_[i]);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line;
    out += '\n';
  };
  emit(header_);
  for (const auto& row : rows_) emit(row);
  return out;
}

}  // namespace fragscope::sinks
