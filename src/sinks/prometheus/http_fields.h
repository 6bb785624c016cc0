// The header fields of an HTTP/1.x head, as the daemon's server (http_server.cc) reads a
// request's and `top`'s socket client (sinks/live/unix_http_get.cc) reads an answer's.
#ifndef FRAGSCOPE_SINKS_PROMETHEUS_HTTP_FIELDS_H_
#define FRAGSCOPE_SINKS_PROMETHEUS_HTTP_FIELDS_H_

#include <cstddef>
#include <string_view>

namespace fragscope::sinks::prometheus {

/// ASCII case-insensitive equality (field names and tokens such as "close").
inline bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if ((a[i] | 0x20) != (b[i] | 0x20)) return false;
  }
  return true;
}

/// Calls `fn(name, value)` for each "Name: value" line of `head` (the lines after its first,
/// CRLF-separated; the value without surrounding blanks). Lines without a colon are skipped.
template <typename Fn>
void ForEachHttpField(std::string_view head, Fn fn) {
  std::size_t pos = head.find("\r\n");
  if (pos == std::string_view::npos) return;
  for (pos += 2; pos < head.size();) {
    std::size_t next = head.find("\r\n", pos);
    if (next == std::string_view::npos) next = head.size();
    const std::string_view field = head.substr(pos, next - pos);
    pos = next + 2;
    const std::size_t colon = field.find(':');
    if (colon == std::string_view::npos) continue;
    std::string_view value = field.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) {
      value.remove_prefix(1);
    }
    while (!value.empty() &&
           (value.back() == ' ' || value.back() == '\t' || value.back() == '\r')) {
      value.remove_suffix(1);
    }
    fn(field.substr(0, colon), value);
  }
}

}  // namespace fragscope::sinks::prometheus

#endif  // FRAGSCOPE_SINKS_PROMETHEUS_HTTP_FIELDS_H_
