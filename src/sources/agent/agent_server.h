// AgentServer: the daemon's Unix socket for in-process agents. One thread polls the listening
// socket and every connection (non-blocking), cuts frames out of each connection's bytes
// (FrameDecoder), decodes samples and stores them in an AgentRegistry.
//
// A connection that sends a malformed, oversized or unsupported frame, or sends faster than
// its rate limit, or takes longer than the frame timeout to complete a frame, is closed and
// counted by reason; nothing it sends can stop the thread or touch another connection.
// Connections beyond the limit, in total or for one peer UID, are refused. When a connection ends
// its series leave the registry; series silent longer than the expiry are dropped too.
//
// Identity comes from the kernel, never from a sample: each connection's peer pid and UID are
// read with SO_PEERCRED when it is accepted (a connection whose credentials cannot be read,
// or whose pid is not visible in the daemon's PID namespace, is refused). A sample's `pid`
// is replaced by the peer's pid, unless `allow_uid_sidecars` is set and the sample names a live
// process of the peer's own UID (a sidecar reporting for the job it watches). So no sender can
// make a series, an alert, a hook or a checkpoint request about another user's process.
//
// Socket file (common/unix_socket.h): the parent directory is created (0755) when missing; an
// existing socket that nobody listens on is replaced; a live socket or any other kind of file
// at the path is an error (never clobbered). Stop() removes the socket file if it is still the
// one we made.
//
// Thread safety: Start/Stop from one thread; the registry is thread-safe; the observer and
// log callbacks run on the server thread.
#ifndef FRAGSCOPE_SOURCES_AGENT_AGENT_SERVER_H_
#define FRAGSCOPE_SOURCES_AGENT_AGENT_SERVER_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include <sys/types.h>

#include "common/unix_socket.h"
#include "fragscope/status.h"
#include "sources/agent/agent_registry.h"

namespace fragscope::agent {

struct AgentServerOptions {
  std::string socket_path = "/run/fragscope/agent.sock";
  mode_t socket_mode = 0660;
  std::size_t max_frame_bytes = kDefaultMaxFrameBytes;
  std::size_t max_connections = 256;
  /// Connections one peer UID (SO_PEERCRED) may hold at once, so one user cannot take every
  /// slot from the others.
  std::size_t max_connections_per_uid = 128;
  /// Let a connection report for another live process of its own UID (a sidecar); off: every
  /// sample is the sender's own.
  bool allow_uid_sidecars = false;
  /// Where the processes are (tests point it elsewhere); only read with allow_uid_sidecars.
  std::string proc_root = "/proc";
  /// A frame must be complete this long after its first byte arrived; bytes trickled in do
  /// not extend it. Slower closes the connection (counted as `truncated`).
  std::chrono::milliseconds frame_timeout{10000};
  /// Per connection: a token bucket of `burst` samples refilled at `max_samples_per_second`.
  double max_samples_per_second = 50;
  double burst = 100;
  /// Series silent this long leave the registry; connections silent this long are closed.
  std::chrono::milliseconds expiry{60000};
  /// Called on the server thread for every accepted sample (the seam for history writes and
  /// alert evaluation). Must not block for long: every agent waits behind it.
  std::function<void(const AgentSample&)> on_sample;
  /// Called on the server thread for every decoded sample before it is stored (and before
  /// on_sample): the seam where the daemon fills in its own forecast. Must not block.
  std::function<void(AgentSample&)> prepare;
  /// Diagnostics (connection rejected and why); rate-limited by the caller if it wishes.
  std::function<void(std::string_view)> log;
};

class AgentServer {
 public:
  AgentServer(AgentServerOptions options, AgentRegistry* registry);
  ~AgentServer();  // Stop()s
  AgentServer(const AgentServer&) = delete;
  AgentServer& operator=(const AgentServer&) = delete;

  /// Creates the socket and starts the thread. Errors name the path and the system's reason.
  Status Start();
  /// Stops the thread, closes every connection and removes the socket file. Idempotent.
  void Stop();

  const AgentServerOptions& options() const { return options_; }

 private:
  void Run();

  AgentServerOptions options_;
  AgentRegistry* registry_;
  UnixListener listener_;
  int wake_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace fragscope::agent

#endif  // FRAGSCOPE_SOURCES_AGENT_AGENT_SERVER_H_
