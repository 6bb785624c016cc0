// What a failed HTTP exchange (cpp-httplib) means, in words. httplib's own to_string gives the
// bare enumerator name ("Connection") in the versions Debian 12 ships, which reads as a
// message cut off; the words here are the same on every version.
#ifndef FRAGSCOPE_SINKS_HTTP_ERROR_H_
#define FRAGSCOPE_SINKS_HTTP_ERROR_H_

#include <httplib.h>

#include <string>

namespace fragscope::sinks {

inline std::string HttpErrorText(httplib::Error error) {
  switch (error) {
    case httplib::Error::Connection:
      return "could not connect (refused, unreachable or no such host)";
    case httplib::Error::ConnectionTimeout:
      return "no connection within the timeout";
    case httplib::Error::BindIPAddress:
      return "could not bind the local address";
    case httplib::Error::Read:
      return "the connection failed or closed while reading the answer";
    case httplib::Error::Write:
      return "the connection failed or closed while sending the request";
    case httplib::Error::ExceedRedirectCount:
      return "too many redirects";
    case httplib::Error::Canceled:
      return "the exchange was stopped before it ended";
    case httplib::Error::SSLConnection:
    case httplib::Error::SSLLoadingCerts:
    case httplib::Error::SSLServerVerification:
      return "TLS failed (fragscope speaks plain HTTP)";
    default:
      return "HTTP error: " + httplib::to_string(error);
  }
}

}  // namespace fragscope::sinks

#endif  // FRAGSCOPE_SINKS_HTTP_ERROR_H_
