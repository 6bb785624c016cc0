// HttpGet: one bounded GET from the node daemon over TCP, for the commands that read it
// (`probe`, `top`; over the daemon's API socket: sinks/live/unix_http_get.h). The whole
// exchange, not each read, is bounded by the timeout (a watchdog stops a client that
// trickles), and the body by a byte limit.
#ifndef FRAGSCOPE_APPS_FRAGSCOPE_HTTP_GET_H_
#define FRAGSCOPE_APPS_FRAGSCOPE_HTTP_GET_H_

#include <cstddef>
#include <string>

#include "sinks/live/unix_http_get.h"

namespace fragscope::cli {

using HttpGetResult = sinks::live::HttpGetResult;

/// GETs `path` from `base` ("http://host:port") within `timeout_seconds`, reading at most
/// `max_body_bytes`.
HttpGetResult HttpGet(const std::string& base, const std::string& path, double timeout_seconds,
                      std::size_t max_body_bytes);

}  // namespace fragscope::cli

#endif  // FRAGSCOPE_APPS_FRAGSCOPE_HTTP_GET_H_
