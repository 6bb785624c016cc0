#include "http_get.h"

#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include "sinks/http_error.h"

namespace fragscope::cli {

HttpGetResult HttpGet(const std::string& base, const std::string& path, double timeout_seconds,
                      std::size_t max_body_bytes) {
  httplib::Client client(base);
  const auto usec = static_cast<long>(timeout_seconds * 1e6);
  client.set_connection_timeout(usec / 1000000, usec % 1000000);
  client.set_read_timeout(usec / 1000000, usec % 1000000);
  // httplib's timeouts are per read, so an endpoint that trickles a byte at a time would never
  // end; a watchdog stops the client at the deadline.
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::microseconds(static_cast<std::int64_t>(timeout_seconds * 1e6));
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  bool timed_out = false;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> lock(mu);
    if (cv.wait_until(lock, deadline, [&] { return done; })) return;
    timed_out = true;
    // Again and again until the request returns: a stop() before its socket exists is lost.
    while (!cv.wait_for(lock, std::chrono::milliseconds(20), [&] { return done; })) {
      client.stop();
    }
  });
  HttpGetResult out;
  bool too_big = false;
  const auto receive = [&](const char* data, std::size_t size) {
    if (out.body.size() + size > max_body_bytes) {
      too_big = true;
      return false;
    }
    out.body.append(data, size);
    return std::chrono::steady_clock::now() < deadline;
  };
  httplib::Result res = client.Get(path, receive);
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
    if (!timed_out && std::chrono::steady_clock::now() >= deadline) timed_out = true;
  }
  cv.notify_all();
  watchdog.join();
  if (too_big) {
    out.outcome = HttpGetResult::Outcome::kTooBig;
  } else if (timed_out) {
    out.outcome = HttpGetResult::Outcome::kTimedOut;
  } else if (!res) {
    out.outcome = HttpGetResult::Outcome::kFailed;
    out.error = sinks::HttpErrorText(res.error());
  } else {
    out.outcome = HttpGetResult::Outcome::kOk;
    out.status = res->status;
  }
  if (out.outcome != HttpGetResult::Outcome::kOk) out.body.clear();
  return out;
}

}  // namespace fragscope::cli
