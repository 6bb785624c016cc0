// AgentServer (agent_server.h).
#include "sources/agent/agent_server.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <vector>

#include <fmt/format.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>

namespace fragscope::agent {
namespace {

std::string Errno(int err) { return std::strerror(err); }

struct Connection {
  int fd = -1;
  std::uint64_t id = 0;
  FrameDecoder decoder;
  double tokens = 0;
  Clock::time_point refilled;
  Clock::time_point last_activity;
  uid_t uid = 0;                    // the peer's, from SO_PEERCRED
  pid_t pid = 0;                    // the peer's, from SO_PEERCRED (> 0)
  bool relabel_logged = false;      // a sample naming another pid was logged once
  bool in_frame = false;            // some bytes of a frame have arrived, not all
  Clock::time_point frame_started;  // when its first byte did
  std::uint64_t frames = 0;         // frames cut out of the stream so far
};

// The effective UID of process `pid` (the owner of /proc/PID), or nullopt when it does not
// exist or cannot be seen.
std::optional<uid_t> ProcessUid(const std::string& proc_root, std::uint32_t pid) {
  struct stat st = {};
  const std::string path = fmt::format("{}/{}", proc_root, pid);
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return std::nullopt;
  return st.st_uid;
}

}  // namespace

AgentServer::AgentServer(AgentServerOptions options, AgentRegistry* registry)
    : options_(std::move(options)), registry_(registry) {}

AgentServer::~AgentServer() { Stop(); }

Status AgentServer::Start() {
  if (thread_.joinable()) return Status::Internal("AgentServer::Start called twice");
  if (options_.max_frame_bytes < kHeaderBytes || options_.max_frame_bytes > kMaxFrameBytesCeiling) {
    return Status::InvalidArgument(
        fmt::format("max frame size must be {}..{} bytes", kHeaderBytes, kMaxFrameBytesCeiling));
  }
  if (options_.max_connections < 1) {
    return Status::InvalidArgument("max connections must be at least 1");
  }
  if (!(options_.max_samples_per_second > 0) || !(options_.burst >= 1)) {
    return Status::InvalidArgument("the rate limit must be > 0/s with a burst of at least 1");
  }
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return Status::IoError(fmt::format("eventfd(): {}", Errno(errno)));
  Status status = listener_.Open(options_.socket_path, options_.socket_mode, "agent socket");
  if (!status.ok()) {
    ::close(wake_fd_);
    wake_fd_ = -1;
    return status;
  }
  stop_ = false;
  thread_ = std::thread([this] { Run(); });
  return Status::Ok();
}

void AgentServer::Stop() {
  if (thread_.joinable()) {
    stop_ = true;
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(wake_fd_, &one, sizeof(one));
    thread_.join();
  }
  listener_.Close();
  if (wake_fd_ >= 0) {
    ::close(wake_fd_);
    wake_fd_ = -1;
  }
}

void AgentServer::Run() {
  std::map<int, Connection> conns;       // by fd
  std::map<uid_t, std::size_t> per_uid;  // open connections by peer UID
  std::uint64_t next_id = 1;
  std::vector<pollfd> fds;
  std::vector<char> chunk(16 * 1024);
  std::string payload;
  Clock::time_point last_sweep = Clock::now();

  auto log = [&](std::string_view message) {
    if (options_.log) options_.log(message);
  };
  // The registry is updated before the close, so a peer that sees its connection closed
  // also sees every count and series change that closing made.
  auto close_conn = [&](std::map<int, Connection>::iterator it) {
    registry_->ConnectionClosed(it->second.id);
    if (auto u = per_uid.find(it->second.uid); u != per_uid.end() && --u->second == 0) {
      per_uid.erase(u);
    }
    ::close(it->second.fd);
    return conns.erase(it);
  };
  auto reject = [&](Connection& c, const ProtocolError& error) {
    registry_->CountRejected(error.reason);
    log(fmt::format("agent connection {} closed: {} ({})", c.id, error.message,
                    RejectReasonName(error.reason)));
  };

  // Returns false when the connection must close.
  auto handle_frames = [&](Connection& c, Clock::time_point now) {
    const double elapsed = std::chrono::duration<double>(now - c.refilled).count();
    c.tokens = std::min(options_.burst, c.tokens + elapsed * options_.max_samples_per_second);
    c.refilled = now;
    for (;;) {
      ProtocolError error;
      bool failed = false;
      if (!c.decoder.Next(&payload, &error, &failed)) {
        if (failed) {
          reject(c, error);
          return false;
        }
        return true;
      }
      ++c.frames;
      if (c.tokens < 1) {
        reject(c, {RejectReason::kRateLimited,
                   fmt::format("more than {} samples/s (burst {})", options_.max_samples_per_second,
                               options_.burst)});
        return false;
      }
      c.tokens -= 1;
      Result<AgentSample> sample = DecodeSample(payload);
      if (!sample.ok()) {
        reject(c, {RejectReason::kMalformed,
                   fmt::format("frame ending at byte {}: {}", c.decoder.stream_offset(),
                               sample.status().message())});
        return false;
      }
      // Identity from the kernel: the sender's own pid, or a live process of its own UID when
      // sidecars are allowed; any other pid the sample names is replaced by the sender's.
      sample->uid = static_cast<std::uint32_t>(c.uid);
      if (sample->pid != static_cast<std::uint32_t>(c.pid)) {
        const bool sidecar = options_.allow_uid_sidecars &&
                             ProcessUid(options_.proc_root, sample->pid) == std::optional(c.uid);
        if (!sidecar) {
          registry_->CountRelabeled();
          if (!c.relabel_logged) {
            c.relabel_logged = true;
            log(fmt::format(
                "agent connection {} (pid {}, UID {}) sent samples for pid {}: recorded as pid "
                "{} (a process reports for itself{})",
                c.id, c.pid, c.uid, sample->pid, c.pid,
                options_.allow_uid_sidecars ? ", or for a live process of its own UID"
                                            : "; --allow-uid-sidecars lets it report for "
                                              "processes of its own UID"));
          }
          sample->pid = static_cast<std::uint32_t>(c.pid);
        }
      }
      // A sample that would make a series beyond the limits is counted and left out: not
      // forecast, stored, recorded or alerted on. The connection stays (its known series
      // still update); the daemon logs the count once per interval.
      if (!registry_->Admits(sample->pid, sample->device_uuid, c.id, *sample->uid)) {
        registry_->CountSeriesDropped();
        continue;
      }
      if (options_.prepare) options_.prepare(*sample);
      if (!registry_->Accept(*sample, c.id, now)) continue;
      if (options_.on_sample) options_.on_sample(*sample);
    }
  };

  while (!stop_) {
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({listener_.fd(), POLLIN, 0});
    for (const auto& [fd, c] : conns) fds.push_back({fd, POLLIN, 0});
    const int ready = ::poll(fds.data(), fds.size(), 100);
    if (ready < 0 && errno != EINTR) {
      log(fmt::format("poll(): {}", Errno(errno)));
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    const Clock::time_point now = Clock::now();
    if (ready > 0) {
      if (fds[1].revents & POLLIN) {
        for (;;) {
          const int fd = ::accept4(listener_.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (fd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
                errno != ECONNABORTED) {
              log(fmt::format("accept(): {}", Errno(errno)));
            }
            break;
          }
          if (conns.size() >= options_.max_connections) {
            registry_->CountConnectionRefused();  // before close: the peer sees the count
            ::close(fd);
            continue;
          }
          // Who is at the other end, from the kernel. Without credentials, or with a pid the
          // daemon's PID namespace cannot see (0), nothing it sends could be attributed.
          ucred cred{};
          socklen_t cred_len = sizeof(cred);
          if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) != 0 || cred.pid <= 0) {
            registry_->CountConnectionRefused();
            log(fmt::format("agent connection refused: no peer credentials ({})",
                            cred.pid <= 0 ? "pid outside this PID namespace" : Errno(errno)));
            ::close(fd);
            continue;
          }
          const uid_t uid = cred.uid;
          if (per_uid[uid] >= options_.max_connections_per_uid) {
            registry_->CountConnectionRefused();
            log(fmt::format("agent connection from UID {} refused: already {} connections per UID",
                            uid, options_.max_connections_per_uid));
            ::close(fd);
            continue;
          }
          ++per_uid[uid];
          Connection c;
          c.fd = fd;
          c.id = next_id++;
          c.decoder = FrameDecoder(options_.max_frame_bytes);
          c.tokens = options_.burst;
          c.refilled = now;
          c.last_activity = now;
          c.uid = uid;
          c.pid = cred.pid;
          conns.emplace(fd, std::move(c));
          registry_->CountConnectionAccepted();
        }
      }
      for (std::size_t i = 2; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        auto it = conns.find(fds[i].fd);
        if (it == conns.end()) continue;
        Connection& c = it->second;
        bool keep = true;
        // At most a few chunks per round, so one busy connection cannot starve the others.
        for (int round = 0; round < 4 && keep; ++round) {
          const ssize_t n = ::read(c.fd, chunk.data(), chunk.size());
          if (n > 0) {
            c.last_activity = now;
            c.decoder.Feed(chunk.data(), static_cast<std::size_t>(n));
            const std::uint64_t frames_before = c.frames;
            keep = handle_frames(c, now);
            // The frame deadline runs from the first byte of a frame, whatever follows: it
            // restarts only when a frame completed and the bytes left begin the next one.
            if (c.decoder.buffered() == 0) {
              c.in_frame = false;
            } else if (!c.in_frame || c.frames != frames_before) {
              c.in_frame = true;
              c.frame_started = now;
            }
            if (static_cast<std::size_t>(n) < chunk.size()) break;
          } else if (n == 0) {
            if (c.decoder.buffered() > 0) {
              reject(c, {RejectReason::kTruncated,
                         fmt::format("byte {}: connection closed {} bytes into a frame",
                                     c.decoder.stream_offset(), c.decoder.buffered())});
            }
            keep = false;
          } else {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
            if (c.decoder.buffered() > 0) {
              reject(c,
                     {RejectReason::kTruncated, fmt::format("read error {} bytes into a frame: {}",
                                                            c.decoder.buffered(), Errno(errno))});
            }
            keep = false;
          }
        }
        if (!keep) close_conn(it);
      }
    }
    // Housekeeping a few times a second: silent series and idle connections.
    if (now - last_sweep >= std::chrono::milliseconds(200)) {
      last_sweep = now;
      registry_->Expire(now, options_.expiry);
      for (auto it = conns.begin(); it != conns.end();) {
        if (it->second.in_frame && now - it->second.frame_started > options_.frame_timeout) {
          reject(it->second,
                 {RejectReason::kTruncated,
                  fmt::format("frame not complete {} ms after its first byte ({} bytes "
                              "so far)",
                              options_.frame_timeout.count(), it->second.decoder.buffered())});
          it = close_conn(it);
        } else if (now - it->second.last_activity > options_.expiry) {
          registry_->CountConnectionIdleClosed();
          if (it->second.decoder.buffered() > 0) {
            reject(it->second,
                   {RejectReason::kTruncated,
                    fmt::format("idle for {} ms {} bytes into a frame", options_.expiry.count(),
                                it->second.decoder.buffered())});
          }
          it = close_conn(it);
        } else {
          ++it;
        }
      }
    }
  }
  for (auto it = conns.begin(); it != conns.end();) it = close_conn(it);
}

}  // namespace fragscope::agent
