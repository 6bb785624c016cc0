// HttpGet: one bounded GET from the node daemon, for the commands that read it (`probe`,
// `top`). The whole exchange, not each read, is bounded by the timeout (a watchdog stops a
// client that trickles), and the body by a byte limit.
#ifndef FRAGSCOPE_APPS_FRAGSCOPE_HTTP_GET_H_
#define FRAGSCOPE_APPS_FRAGSCOPE_HTTP_GET_H_

#include <cstddef>
#include <string>

namespace fragscope::cli {

struct HttpGetResult {
  enum class Outcome { kOk, kTooBig, kTimedOut, kFailed };
  Outcome outcome = Outcome::kFailed;
  int status = 0;     // the HTTP status (kOk)
  std::string body;   // the answer (kOk)
  std::string error;  // what failed, in words (kFailed)
};

/// GETs `path` from `base` ("http://host:port") within `timeout_seconds`, reading at most
/// `max_body_bytes`.
HttpGetResult HttpGet(const std::string& base, const std::string& path, double timeout_seconds,
                      std::size_t max_body_bytes);

}  // namespace fragscope::cli

#endif  // FRAGSCOPE_APPS_FRAGSCOPE_HTTP_GET_H_
