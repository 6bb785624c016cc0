// One bounded HTTP GET, over TCP (apps/fragscope/http_get.h, through cpp-httplib) or over the
// daemon's API socket (UnixHttpGet here: cpp-httplib 0.11 speaks no Unix sockets). The
// whole exchange is bounded by the timeout, not each read (a server that trickles is
// stopped at the deadline), and the body by a byte limit.
#ifndef FRAGSCOPE_SINKS_LIVE_UNIX_HTTP_GET_H_
#define FRAGSCOPE_SINKS_LIVE_UNIX_HTTP_GET_H_

#include <cstddef>
#include <string>

namespace fragscope::sinks::live {

struct HttpGetResult {
  enum class Outcome { kOk, kTooBig, kTimedOut, kFailed };
  Outcome outcome = Outcome::kFailed;
  int status = 0;     // the HTTP status (kOk)
  std::string body;   // the answer (kOk)
  std::string error;  // what failed, in words (kFailed)
};

/// GETs `target` ("/api/v1/processes") from the HTTP server on the Unix socket at
/// `socket_path` within `timeout_seconds`, reading at most `max_body_bytes` of body (an answer
/// that announces or sends more is kTooBig). The request asks the server to close the
/// connection after its answer. An answer that is not HTTP/1.x, a chunked one, or one cut off
/// before its Content-Length is kFailed with the reason.
HttpGetResult UnixHttpGet(const std::string& socket_path, const std::string& target,
                          double timeout_seconds, std::size_t max_body_bytes);

}  // namespace fragscope::sinks::live

#endif  // FRAGSCOPE_SINKS_LIVE_UNIX_HTTP_GET_H_
