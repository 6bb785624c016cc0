#include "sources/agent/agent_server.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

namespace fragscope::agent {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

std::string SampleFrame(std::uint32_t pid, const std::string& uuid, std::int64_t step = 1) {
  AgentSample s;
  s.pid = pid;
  s.device_uuid = uuid;
  s.step = step;
  s.reserved_bytes = 1000 + static_cast<std::uint64_t>(step);
  return EncodeFrame(EncodeSampleJson(s));
}

int Connect(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void SendAll(int fd, const std::string& bytes) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n <= 0) return;  // the server closed us; tests check the counters
    done += static_cast<std::size_t>(n);
  }
}

// Polls `pred` for up to 5 s (the server thread works asynchronously).
bool WaitFor(const std::function<bool()>& pred) {
  for (int i = 0; i < 500; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return pred();
}

// True when the server closed `fd` (read returns 0 or an error).
bool ClosedByPeer(int fd) {
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char c;
  return ::recv(fd, &c, 1, 0) <= 0;
}

class AgentServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/fragscope_agent_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    options_.socket_path = dir_ + "/run/agent.sock";
    options_.expiry = milliseconds(60000);
  }
  void TearDown() override {
    server_.reset();
    fs::remove_all(dir_);
  }
  void StartServer() {
    server_ = std::make_unique<AgentServer>(options_, &registry_);
    Status s = server_->Start();
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  std::uint64_t Rejected(RejectReason r) {
    return registry_.Counters().rejected[static_cast<std::size_t>(r)];
  }

  std::string dir_;
  AgentServerOptions options_;
  AgentRegistry registry_;
  std::unique_ptr<AgentServer> server_;
};

TEST_F(AgentServerTest, CreatesSocketWithModeAndRemovesItOnStop) {
  StartServer();
  struct stat st = {};
  ASSERT_EQ(::lstat(options_.socket_path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  server_->Stop();
  EXPECT_FALSE(fs::exists(options_.socket_path));
}

TEST_F(AgentServerTest, RefusesToClobberARegularFile) {
  fs::create_directories(dir_ + "/run");
  std::ofstream(options_.socket_path) << "precious";
  AgentServer server(options_, &registry_);
  Status s = server.Start();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("not a socket"), std::string::npos) << s.message();
  std::ifstream in(options_.socket_path);
  std::string content;
  in >> content;
  EXPECT_EQ(content, "precious");
}

TEST_F(AgentServerTest, ReplacesAStaleSocketButNotALiveOne) {
  StartServer();
  // A second server on the same path: the first is alive.
  AgentRegistry other;
  AgentServer second(options_, &other);
  Status s = second.Start();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("in use"), std::string::npos) << s.message();
  // A stale socket file (bound, never listening, closed) is replaced.
  server_->Stop();
  {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", options_.socket_path.c_str());
    ASSERT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
    ::close(fd);
  }
  ASSERT_TRUE(fs::exists(options_.socket_path));
  AgentServer third(options_, &other);
  Status s3 = third.Start();
  EXPECT_TRUE(s3.ok()) << s3.ToString();
}

TEST_F(AgentServerTest, OneByteWritesAndTwoFramesPerWrite) {
  std::atomic<int> observed{0};
  options_.on_sample = [&](const AgentSample&) { ++observed; };
  StartServer();
  const int fd = Connect(options_.socket_path);
  ASSERT_GE(fd, 0);
  const std::string frame = SampleFrame(10, "GPU-a", 1);
  for (char c : frame) {
    SendAll(fd, std::string(1, c));
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  SendAll(fd, SampleFrame(10, "GPU-a", 2) + SampleFrame(10, "GPU-b", 3));
  ASSERT_TRUE(WaitFor([&] { return registry_.Counters().samples_received == 3; }));
  EXPECT_EQ(observed.load(), 3);
  const std::vector<AgentEntry> entries = registry_.Entries();
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].sample.device_uuid, "GPU-a");
  EXPECT_EQ(entries[0].sample.step, 2);  // the latest sample wins
  EXPECT_EQ(entries[1].sample.device_uuid, "GPU-b");
  ::close(fd);
  // The agent vanished: its series leave the registry.
  ASSERT_TRUE(WaitFor([&] { return registry_.Entries().empty(); }));
  EXPECT_EQ(registry_.Counters().series_expired, 2u);
}

TEST_F(AgentServerTest, GarbageOversizeAndBadJsonCloseOnlyThatConnection) {
  StartServer();
  const int good = Connect(options_.socket_path);
  ASSERT_GE(good, 0);
  SendAll(good, SampleFrame(1, "GPU-good"));
  ASSERT_TRUE(WaitFor([&] { return registry_.Counters().samples_received == 1; }));

  const int garbage = Connect(options_.socket_path);
  SendAll(garbage, std::string("\x20\x00\x00\x00", 4) + "NOPE" + std::string(28, 'x'));
  EXPECT_TRUE(ClosedByPeer(garbage));
  const int huge = Connect(options_.socket_path);
  SendAll(huge, std::string("\xff\xff\xff\x7f", 4));
  EXPECT_TRUE(ClosedByPeer(huge));
  const int bad_json = Connect(options_.socket_path);
  SendAll(bad_json, EncodeFrame("{\"pid\":1,"));
  EXPECT_TRUE(ClosedByPeer(bad_json));
  const int bad_version = Connect(options_.socket_path);
  SendAll(bad_version, EncodeFrame("{}", 9));
  EXPECT_TRUE(ClosedByPeer(bad_version));
  for (int fd : {garbage, huge, bad_json, bad_version}) ::close(fd);

  EXPECT_EQ(Rejected(RejectReason::kBadMagic), 1u);
  EXPECT_EQ(Rejected(RejectReason::kOversized), 1u);
  EXPECT_EQ(Rejected(RejectReason::kMalformed), 1u);
  EXPECT_EQ(Rejected(RejectReason::kUnsupportedVersion), 1u);
  // The good agent is undisturbed and keeps sending.
  SendAll(good, SampleFrame(1, "GPU-good", 2));
  ASSERT_TRUE(WaitFor([&] { return registry_.Counters().samples_received == 2; }));
  EXPECT_EQ(registry_.Entries().size(), 1u);
  ::close(good);
}

TEST_F(AgentServerTest, DisconnectMidFrameIsCountedAsTruncated) {
  StartServer();
  const int fd = Connect(options_.socket_path);
  const std::string frame = SampleFrame(5, "GPU-t");
  SendAll(fd, frame.substr(0, frame.size() / 2));
  std::this_thread::sleep_for(milliseconds(50));
  ::close(fd);
  ASSERT_TRUE(WaitFor([&] { return Rejected(RejectReason::kTruncated) == 1; }));
  EXPECT_EQ(registry_.Counters().samples_received, 0u);
}

TEST_F(AgentServerTest, FloodBeyondTheRateLimitClosesTheConnection) {
  options_.max_samples_per_second = 10;
  options_.burst = 20;
  StartServer();
  const int fd = Connect(options_.socket_path);
  std::string flood;
  for (int i = 0; i < 200; ++i) flood += SampleFrame(9, "GPU-f", i);
  SendAll(fd, flood);
  EXPECT_TRUE(ClosedByPeer(fd));
  ::close(fd);
  ASSERT_TRUE(WaitFor([&] { return Rejected(RejectReason::kRateLimited) == 1; }));
  // The burst was accepted, the rest was not.
  const std::uint64_t received = registry_.Counters().samples_received;
  EXPECT_GE(received, 20u);
  EXPECT_LT(received, 40u);
}

TEST_F(AgentServerTest, ConnectionLimitRefusesExtraConnections) {
  options_.max_connections = 2;
  StartServer();
  const int a = Connect(options_.socket_path);
  const int b = Connect(options_.socket_path);
  ASSERT_TRUE(WaitFor([&] { return registry_.Counters().connections_open == 2; }));
  const int c = Connect(options_.socket_path);
  EXPECT_TRUE(ClosedByPeer(c));
  EXPECT_EQ(registry_.Counters().connections_refused, 1u);
  for (int fd : {a, b, c}) ::close(fd);
}

TEST_F(AgentServerTest, SilentSeriesExpireAndIdleConnectionsClose) {
  options_.expiry = milliseconds(300);
  StartServer();
  const int fd = Connect(options_.socket_path);
  SendAll(fd, SampleFrame(3, "GPU-s"));
  ASSERT_TRUE(WaitFor([&] { return registry_.Entries().size() == 1; }));
  ASSERT_TRUE(WaitFor([&] { return registry_.Entries().empty(); }));
  EXPECT_TRUE(ClosedByPeer(fd));
  EXPECT_EQ(registry_.Counters().connections_idle_closed, 1u);
  ::close(fd);
}

TEST_F(AgentServerTest, ManyConcurrentClientsLoseNoSample) {
  constexpr int kClients = 32;
  constexpr int kSamples = 40;
  options_.max_samples_per_second = 1e6;
  options_.burst = 1e6;
  StartServer();
  std::vector<std::thread> threads;
  std::vector<int> fds(kClients, -1);
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      fds[static_cast<std::size_t>(c)] = Connect(options_.socket_path);
      for (int i = 0; i < kSamples; ++i) {
        SendAll(fds[static_cast<std::size_t>(c)],
                // One process: the daemon records every sample under this pid (SO_PEERCRED),
                // so each client is its own device.
                SampleFrame(static_cast<std::uint32_t>(100 + c), "GPU-m" + std::to_string(c), i));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE(WaitFor([&] {
    return registry_.Counters().samples_received == static_cast<std::uint64_t>(kClients * kSamples);
  })) << registry_.Counters().samples_received;
  const std::vector<AgentEntry> entries = registry_.Entries();
  ASSERT_EQ(entries.size(), static_cast<std::size_t>(kClients));
  for (const AgentEntry& e : entries) {
    EXPECT_EQ(e.sample.step, kSamples - 1);
    EXPECT_EQ(e.samples, static_cast<std::uint64_t>(kSamples));
  }
  for (int fd : fds) ::close(fd);
}

TEST_F(AgentServerTest, PathTooLongIsAClearError) {
  options_.socket_path = "/tmp/" + std::string(200, 'x') + "/agent.sock";
  AgentServer server(options_, &registry_);
  Status s = server.Start();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("must be 1..107 bytes"), std::string::npos) << s.message();
}

// The series limits: a new key beyond either is dropped and counted; a known key always
// updates; a closed connection's series free their room.
TEST(AgentRegistryLimitsTest, NewSeriesBeyondTheLimitsAreDroppedAndCounted) {
  AgentRegistry registry(SeriesLimits{3, 2});
  const Clock::time_point now = Clock::now();
  AgentSample s;
  s.pid = 1;
  auto with_uuid = [&](const std::string& uuid) {
    s.device_uuid = uuid;
    return s;
  };
  EXPECT_TRUE(registry.Accept(with_uuid("a"), 10, now));
  EXPECT_TRUE(registry.Accept(with_uuid("b"), 10, now));
  EXPECT_FALSE(registry.Admits(1, "c", 10));
  EXPECT_FALSE(registry.Accept(with_uuid("c"), 10, now));  // connection 10 is at 2
  EXPECT_TRUE(registry.Accept(with_uuid("a"), 10, now));   // known: updates
  EXPECT_TRUE(registry.Accept(with_uuid("d"), 11, now));
  EXPECT_FALSE(registry.Accept(with_uuid("e"), 11, now));  // total is at 3
  EXPECT_EQ(registry.Entries().size(), 3u);
  EXPECT_EQ(registry.Counters().series_dropped, 2u);
  registry.ConnectionClosed(10);
  EXPECT_EQ(registry.Entries().size(), 1u);
  EXPECT_TRUE(registry.Accept(with_uuid("e"), 11, now));
  // A key taken over by another connection counts against the new owner only.
  EXPECT_TRUE(registry.Accept(with_uuid("d"), 12, now));
  EXPECT_TRUE(registry.Accept(with_uuid("f"), 11, now));
}

// A closed connection's series linger with their last sample (so a scrape sees the final
// state of a process that exited), leave when the linger is over, and give their place to a
// live agent's new series at the total cap.
TEST(AgentRegistryLimitsTest, ClosedSeriesLingerThenLeaveAndNeverLockOutLiveAgents) {
  AgentRegistry registry(SeriesLimits{2, 2, std::chrono::seconds(30)});
  const Clock::time_point t0 = Clock::now();
  AgentSample s;
  s.pid = 7;
  s.device_uuid = "a";
  s.step = 41;
  ASSERT_TRUE(registry.Accept(s, 10, t0));
  s.device_uuid = "b";
  ASSERT_TRUE(registry.Accept(s, 10, t0));
  registry.ConnectionClosed(10, t0 + std::chrono::seconds(1));
  EXPECT_EQ(registry.Entries().size(), 2u);
  EXPECT_EQ(registry.Entries()[0].sample.step, 41);
  EXPECT_EQ(registry.Expire(t0 + std::chrono::seconds(20), std::chrono::seconds(60)), 0u);
  // At the cap of 2, a live agent's new series takes the place of the oldest lingering one.
  EXPECT_TRUE(registry.Admits(8, "c", 11));
  s.pid = 8;
  s.device_uuid = "c";
  ASSERT_TRUE(registry.Accept(s, 11, t0 + std::chrono::seconds(21)));
  EXPECT_EQ(registry.Entries().size(), 2u);
  EXPECT_EQ(registry.Counters().series_dropped, 0u);
  // The remaining lingering series leaves when its linger is over; the live one stays.
  EXPECT_EQ(registry.Expire(t0 + std::chrono::seconds(31), std::chrono::seconds(60)), 1u);
  ASSERT_EQ(registry.Entries().size(), 1u);
  EXPECT_EQ(registry.Entries()[0].sample.pid, 8u);
  EXPECT_EQ(registry.Counters().series_expired, 2u);
}

TEST(AgentRegistryLimitsTest, ALingeringSeriesWhoseProcessReconnectsIsLiveAgain) {
  AgentRegistry registry(SeriesLimits{4, 1, std::chrono::seconds(5)});
  const Clock::time_point t0 = Clock::now();
  AgentSample s;
  s.pid = 7;
  s.device_uuid = "a";
  ASSERT_TRUE(registry.Accept(s, 10, t0));
  registry.ConnectionClosed(10, t0);
  ASSERT_TRUE(registry.Accept(s, 12, t0 + std::chrono::seconds(1)));
  EXPECT_FALSE(registry.Entries()[0].closed.has_value());
  EXPECT_EQ(registry.Expire(t0 + std::chrono::seconds(10), std::chrono::seconds(60)), 0u);
  // Its new connection owns it: the per-connection cap of 1 is reached.
  EXPECT_FALSE(registry.Admits(7, "b", 12));
}

// Issue 30, items 1 and 2: a series belongs to the UID that made it; at the cap each UID keeps
// its fair share and no UID evicts another's series, lingering ones included.
TEST(AgentRegistryLimitsTest, Issue30SeriesBelongToTheirUidAndTheCapIsShared) {
  AgentRegistry registry(SeriesLimits{4, 8, std::chrono::seconds(60), 8});
  const auto t0 = Clock::now();
  auto sample = [](std::uint32_t uid, std::uint32_t pid, const std::string& uuid) {
    AgentSample s;
    s.uid = uid;
    s.pid = pid;
    s.device_uuid = uuid;
    return s;
  };
  ASSERT_TRUE(registry.Accept(sample(1000, 10, "victim-oom"), 1, t0));
  registry.ConnectionClosed(1, t0);  // lingers
  // Another UID floods: it fills the free places, then evicts nothing of the victim's.
  for (int i = 0; i < 10; ++i) {
    registry.Accept(sample(2000, 20, "x" + std::to_string(i)), 2, t0);
  }
  std::vector<AgentEntry> entries = registry.Entries();
  ASSERT_EQ(entries.size(), 4u);
  EXPECT_EQ(entries[0].sample.device_uuid, "victim-oom");
  // Nor may it update or take over the victim's key.
  EXPECT_FALSE(registry.Accept(sample(2000, 10, "victim-oom"), 2, t0));
  // The victim, under its share (2 of 4), takes a place of the heaviest UID at the cap.
  EXPECT_TRUE(registry.Admits(11, "victim-2", 3, 1000));
  EXPECT_TRUE(registry.Accept(sample(1000, 11, "victim-2"), 3, t0));
  // At its share it only replaces its own lingering series (the OOM one), then nothing.
  EXPECT_TRUE(registry.Accept(sample(1000, 11, "victim-3"), 3, t0));
  EXPECT_FALSE(registry.Accept(sample(1000, 11, "victim-4"), 3, t0));
  entries = registry.Entries();
  std::size_t victims = 0;
  for (const AgentEntry& e : entries) victims += e.sample.uid == 1000u;
  EXPECT_EQ(victims, 2u);
  EXPECT_EQ(entries.size(), 4u);
}

}  // namespace
TEST(AgentRegistryRecentTest, ViewsKeepTheLastPointsOfEachSeriesAndForgetThemWithIt) {
  AgentRegistry registry(SeriesLimits{4, 4});
  const auto now = Clock::now();
  AgentSample s;
  s.pid = 7;
  s.device_uuid = "GPU-a";
  const std::size_t sent = kRecentPoints + 5;
  for (std::size_t i = 0; i < sent; ++i) {
    s.step = static_cast<std::int64_t>(i);
    s.reserved_bytes = 1000 + i;
    s.allocated_bytes = 500 + i;
    ASSERT_TRUE(registry.Accept(s, 1, now));
  }
  std::vector<AgentView> views = registry.Views();
  ASSERT_EQ(views.size(), 1u);
  ASSERT_EQ(views[0].recent.size(), kRecentPoints);
  // Oldest first, the first five gone.
  EXPECT_EQ(views[0].recent.front().step, 5);
  EXPECT_EQ(views[0].recent.back().step, static_cast<std::int64_t>(sent - 1));
  EXPECT_EQ(views[0].recent.back().reserved_bytes, 1000 + sent - 1);
  EXPECT_EQ(views[0].recent.back().allocated_bytes, 500 + sent - 1);
  EXPECT_EQ(views[0].entry.sample.step, static_cast<std::int64_t>(sent - 1));
  // A series that leaves takes its points: the same key afterwards starts empty.
  registry.ConnectionClosed(1, now);
  ASSERT_TRUE(registry.Views().empty());
  s.step = 0;
  ASSERT_TRUE(registry.Accept(s, 2, now));
  ASSERT_EQ(registry.Views()[0].recent.size(), 1u);
}

}  // namespace fragscope::agent
