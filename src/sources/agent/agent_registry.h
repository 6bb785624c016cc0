// AgentRegistry: the daemon's current view of its agents. It keeps the latest sample per
// (pid, device_uuid), which connection sent it and when, and the cumulative counters the
// exporter publishes (samples received, rejected by reason, connections).
//
// Thread safety: every method may be called from any thread (one mutex; the agent server
// writes, scrapes and the periodic tick read).
#ifndef FRAGSCOPE_SOURCES_AGENT_AGENT_REGISTRY_H_
#define FRAGSCOPE_SOURCES_AGENT_AGENT_REGISTRY_H_

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "sources/agent/agent_protocol.h"
#include "sources/agent/agent_sample.h"

namespace fragscope::agent {

using Clock = std::chrono::steady_clock;

/// One agent's latest sample, with where and when it arrived.
struct AgentEntry {
  AgentSample sample;
  std::uint64_t connection_id = 0;  // the connection that sent it (0: none)
  Clock::time_point received;       // daemon's monotonic clock
  std::int64_t received_unix_ms = 0;
  std::uint64_t samples = 0;  // accepted samples for this key so far
};

/// Cumulative counters (monotonic while the daemon runs) and current gauges.
struct AgentCounters {
  std::uint64_t samples_received = 0;                        // accepted samples
  std::array<std::uint64_t, kRejectReasonCount> rejected{};  // by RejectReason
  std::uint64_t connections_accepted = 0;
  std::uint64_t connections_refused = 0;  // over the connection limit
  std::uint64_t connections_idle_closed = 0;
  std::uint64_t connections_open = 0;  // gauge
  std::uint64_t series_expired = 0;    // entries dropped (disconnect or silence)
};

class AgentRegistry {
 public:
  /// Stores `sample` as the latest for its key and counts it.
  void Accept(const AgentSample& sample, std::uint64_t connection_id, Clock::time_point now);
  void CountRejected(RejectReason reason);
  void CountConnectionAccepted();
  void CountConnectionRefused();
  void CountConnectionIdleClosed();
  /// The connection ended: its series leave the current state (an agent that vanished).
  void ConnectionClosed(std::uint64_t connection_id);
  /// Drops series whose latest sample is older than `now - expiry`; returns how many.
  std::size_t Expire(Clock::time_point now, Clock::duration expiry);

  /// A copy of the current entries, ordered by (pid, device_uuid).
  std::vector<AgentEntry> Entries() const;
  AgentCounters Counters() const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::uint32_t, std::string>, AgentEntry> entries_;
  AgentCounters counters_;
};

}  // namespace fragscope::agent

#endif  // FRAGSCOPE_SOURCES_AGENT_AGENT_REGISTRY_H_
