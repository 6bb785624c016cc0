// The daemon's API socket (issue 33 item 3): MetricsHttpServer serving on a Unix domain socket
// (the file's mode, a stale socket replaced, a live one or another file refused, the file
// removed on Stop) and UnixHttpGet, the client `fragscope top --socket` reads it with, against
// that server and against endpoints that misbehave (silent, not HTTP, cut off, too big).
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <thread>

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include "sinks/live/unix_http_get.h"
#include "sinks/prometheus/http_server.h"
#include "testing/test_util.h"

namespace fragscope::sinks {
namespace {

namespace fs = std::filesystem;
using live::HttpGetResult;
using live::UnixHttpGet;
using prometheus::ApiAnswer;
using prometheus::HttpServerOptions;
using prometheus::MetricsHttpServer;

constexpr std::size_t kMaxBody = 1 << 20;

// A socket file bound at `path` and listening (or not, `listen_too` false: a stale one after
// close). Returns the fd (-1 on error); the caller closes it.
int BindUnix(const std::string& path, bool listen_too) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0 ||
      (listen_too && ::listen(fd, 8) != 0)) {
    ::close(fd);
    return -1;
  }
  return fd;
}

class ApiSocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fragscope::testing::MakeTempDir();
    path_ = dir_ + "/run/agent.api.sock";
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<MetricsHttpServer> Server(mode_t mode = 0660) {
    HttpServerOptions options;
    options.unix_socket_path = path_;
    options.unix_socket_mode = mode;
    auto server = std::make_unique<MetricsHttpServer>(
        std::move(options), [] { return std::string("fragscope_up 1\n"); });
    const auto api = [](std::string_view target) {
      return target == "/api/v1/processes" ? ApiAnswer{200, R"({"processes":[]})"}
                                           : ApiAnswer{404, R"({"error":"no such process"})"};
    };
    server->set_api(api);
    return server;
  }

  std::string dir_;
  std::string path_;
};

TEST_F(ApiSocketTest, ServesTheSameHttpApiOnTheSocketWithTheFilesMode) {
  auto server = Server(0600);
  ASSERT_TRUE(server->Start().ok());
  EXPECT_EQ(server->port(), 0);
  struct stat st = {};
  ASSERT_EQ(::lstat(path_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  HttpGetResult got = UnixHttpGet(path_, "/api/v1/processes", 5, kMaxBody);
  ASSERT_EQ(got.outcome, HttpGetResult::Outcome::kOk) << got.error;
  EXPECT_EQ(got.status, 200);
  EXPECT_EQ(got.body, R"({"processes":[]})");
  got = UnixHttpGet(path_, "/api/v1/processes/1-0/map", 5, kMaxBody);
  ASSERT_EQ(got.outcome, HttpGetResult::Outcome::kOk) << got.error;
  EXPECT_EQ(got.status, 404);
  EXPECT_EQ(got.body, R"({"error":"no such process"})");
  got = UnixHttpGet(path_, "/metrics", 5, kMaxBody);
  ASSERT_EQ(got.outcome, HttpGetResult::Outcome::kOk) << got.error;
  EXPECT_EQ(got.body, "fragscope_up 1\n");
  got = UnixHttpGet(path_, "/healthz", 5, kMaxBody);
  EXPECT_EQ(got.body, "ok\n");
  // The body limit holds over the socket too.
  got = UnixHttpGet(path_, "/api/v1/processes", 5, 4);
  EXPECT_EQ(got.outcome, HttpGetResult::Outcome::kTooBig);
  EXPECT_TRUE(got.body.empty());

  server->Stop();
  EXPECT_FALSE(fs::exists(fs::symlink_status(path_)));  // removed on stop
  got = UnixHttpGet(path_, "/api/v1/processes", 5, kMaxBody);
  EXPECT_EQ(got.outcome, HttpGetResult::Outcome::kFailed);
  EXPECT_EQ(got.error, "no such socket");
}

TEST_F(ApiSocketTest, AStaleSocketIsReplacedALiveOneAndOtherFilesAreRefused) {
  fs::create_directories(dir_ + "/run");
  const int stale = BindUnix(path_, false);
  ASSERT_GE(stale, 0);
  ::close(stale);  // the file stays: a daemon that died
  // Nobody accepts on a stale socket: the client says so.
  HttpGetResult got = UnixHttpGet(path_, "/api/v1/processes", 5, kMaxBody);
  EXPECT_EQ(got.outcome, HttpGetResult::Outcome::kFailed);
  EXPECT_NE(got.error.find("nobody accepts"), std::string::npos) << got.error;

  auto server = Server();
  ASSERT_TRUE(server->Start().ok());
  EXPECT_EQ(UnixHttpGet(path_, "/healthz", 5, kMaxBody).status, 200);
  // A second daemon on the same path is refused, and the first keeps its socket.
  auto second = Server();
  Status s = second->Start();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("API socket " + path_ + " is in use"), std::string::npos)
      << s.message();
  EXPECT_EQ(UnixHttpGet(path_, "/healthz", 5, kMaxBody).status, 200);
  server->Stop();

  // A regular file at the path is never replaced.
  std::ofstream(path_) << "keep me";
  s = Server()->Start();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("exists and is not a socket"), std::string::npos) << s.message();
  EXPECT_EQ(fragscope::testing::ReadFileOrDie(path_), "keep me");
}

TEST_F(ApiSocketTest, StopLeavesASocketThatIsNoLongerItsOwn) {
  auto server = Server();
  ASSERT_TRUE(server->Start().ok());
  // A successor took the path meanwhile: its socket is not ours to remove.
  ASSERT_EQ(::unlink(path_.c_str()), 0);
  const int successor = BindUnix(path_, true);
  ASSERT_GE(successor, 0);
  server->Stop();
  EXPECT_TRUE(fs::is_socket(path_));
  ::close(successor);
}

// A one-connection server that reads the request and answers `answer` (then closes), or
// never answers when `answer` is empty.
class RawServer {
 public:
  RawServer(const std::string& path, std::string answer) : answer_(std::move(answer)) {
    fd_ = BindUnix(path, true);
    thread_ = std::thread([this] {
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      char buf[4096];
      [[maybe_unused]] const ssize_t n = ::recv(c, buf, sizeof(buf), 0);
      if (!answer_.empty()) {
        [[maybe_unused]] const ssize_t w = ::send(c, answer_.data(), answer_.size(), MSG_NOSIGNAL);
        ::close(c);
        return;
      }
      while (!done_) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      ::close(c);
    });
  }
  ~RawServer() {
    done_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
  }
  RawServer(const RawServer&) = delete;
  RawServer& operator=(const RawServer&) = delete;

 private:
  std::string answer_;
  int fd_ = -1;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

HttpGetResult GetFrom(const std::string& path, const std::string& answer, double timeout = 5,
                      std::size_t max_body = kMaxBody) {
  RawServer server(path, answer);
  return UnixHttpGet(path, "/api/v1/processes", timeout, max_body);
}

TEST_F(ApiSocketTest, TheClientSaysWhatIsWrongWithAnAnswer) {
  fs::create_directories(dir_ + "/run");
  HttpGetResult got = GetFrom(path_, "SSH-2.0-OpenSSH_9.2\r\n\r\n");
  EXPECT_EQ(got.outcome, HttpGetResult::Outcome::kFailed);
  EXPECT_NE(got.error.find("not an HTTP answer"), std::string::npos) << got.error;
  ::unlink(path_.c_str());

  got = GetFrom(path_, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"proc");
  EXPECT_EQ(got.outcome, HttpGetResult::Outcome::kFailed);
  EXPECT_EQ(got.error, "the connection closed 6 bytes into an answer of 100");
  ::unlink(path_.c_str());

  got = GetFrom(path_, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n");
  EXPECT_EQ(got.outcome, HttpGetResult::Outcome::kFailed);
  EXPECT_NE(got.error.find("chunked"), std::string::npos) << got.error;
  ::unlink(path_.c_str());

  // Announced over the limit: refused before reading it; sent over it without a length: too.
  got = GetFrom(path_, "HTTP/1.1 200 OK\r\nContent-Length: 99999999\r\n\r\n", 5, 1000);
  EXPECT_EQ(got.outcome, HttpGetResult::Outcome::kTooBig);
  ::unlink(path_.c_str());
  got = GetFrom(path_, "HTTP/1.0 200 OK\r\n\r\n" + std::string(2000, 'x'), 5, 1000);
  EXPECT_EQ(got.outcome, HttpGetResult::Outcome::kTooBig);
  ::unlink(path_.c_str());

  // No Content-Length: the body is what came before the close.
  got = GetFrom(path_, "HTTP/1.0 200 OK\r\n\r\n{}");
  ASSERT_EQ(got.outcome, HttpGetResult::Outcome::kOk) << got.error;
  EXPECT_EQ(got.body, "{}");
  ::unlink(path_.c_str());

  // A server that accepts and never answers: the deadline ends the exchange.
  got = GetFrom(path_, "", 0.3);
  EXPECT_EQ(got.outcome, HttpGetResult::Outcome::kTimedOut);
  ::unlink(path_.c_str());

  got = UnixHttpGet(dir_ + "/" + std::string(200, 'a'), "/", 1, kMaxBody);
  EXPECT_EQ(got.outcome, HttpGetResult::Outcome::kFailed);
  EXPECT_NE(got.error.find("must be 1..107 bytes"), std::string::npos) << got.error;
}

}  // namespace
}  // namespace fragscope::sinks
