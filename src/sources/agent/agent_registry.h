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
#include <deque>
#include <map>
#include <mutex>
#include <optional>
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
  /// When its connection closed, for a series that lingers after it (SeriesLimits::linger);
  /// unset while the connection is open.
  std::optional<Clock::time_point> closed;
};

/// One past sample of a series, for a live view's sparkline (`fragscope top`).
struct RecentPoint {
  std::int64_t step = -1;
  std::uint64_t reserved_bytes = 0;
  std::uint64_t allocated_bytes = 0;
};

/// A series' latest entry with its recent points, oldest first.
struct AgentView {
  AgentEntry entry;
  std::vector<RecentPoint> recent;
};

/// Points of recent history kept per series: what a sparkline of a terminal row can show, and
/// small enough that max_series of them stay a few MiB.
inline constexpr std::size_t kRecentPoints = 60;

/// Cumulative counters (monotonic while the daemon runs) and current gauges.
struct AgentCounters {
  std::uint64_t samples_received = 0;                        // accepted samples
  std::array<std::uint64_t, kRejectReasonCount> rejected{};  // by RejectReason
  std::uint64_t connections_accepted = 0;
  std::uint64_t connections_refused = 0;  // over the connection limit
  std::uint64_t connections_idle_closed = 0;
  std::uint64_t connections_open = 0;  // gauge
  std::uint64_t series_expired = 0;    // entries dropped (disconnect or silence)
  std::uint64_t series_dropped = 0;    // samples refused: a new series beyond a series cap
  /// Samples that named a pid other than their sender's and were recorded under the sender's
  /// (identity comes from SO_PEERCRED, agent_server.h).
  std::uint64_t samples_relabeled = 0;
};

/// Bounds on the series the registry keeps, so a flood of new (pid, device) keys within the
/// rate limit cannot grow the daemon's memory and its /metrics page without end.
struct SeriesLimits {
  std::size_t max_series = 512;                // in total
  std::size_t max_series_per_connection = 16;  // keys one connection may own
  /// How long a closed connection's series stay, holding their last sample, so a scrape sees
  /// the final state of a process that exited (an OOM, a monitor's checkpoint and stop)
  /// rather than nothing. 0: they leave at the close. A lingering series is the first to
  /// give its place to a new one at the total cap, so lingering never locks a live agent out.
  Clock::duration linger{};
  /// Series one UID (the sender's, from the kernel) may hold, lingering ones included.
  std::size_t max_series_per_uid = 128;
};

// Who owns a series: the UID that made it (AgentSample::uid; 0 when unknown). A series is only
// ever updated, moved to another connection or evicted by a sample of its own UID, with one
// exception that makes the cap fair: at max_series, a UID holding fewer series than its fair
// share (max_series / the number of UIDs holding series, itself included) takes the place of
// the oldest lingering, else least recently updated, series of the UID holding the most. A UID
// at or above its share can only replace one of its own lingering series. So one user can
// neither fill the cap against the others nor evict their series, lingering OOM series
// included.

class AgentRegistry {
 public:
  AgentRegistry() = default;
  explicit AgentRegistry(SeriesLimits limits) : limits_(limits) {}

  /// Stores `sample` as the latest for its key and counts it; returns true. A sample whose
  /// key is new when the registry, or the connection, is at its series limit is not stored:
  /// it is counted in series_dropped and false returned. A known key is always updated.
  bool Accept(const AgentSample& sample, std::uint64_t connection_id, Clock::time_point now);
  /// Whether Accept would store a sample of this key from this connection now.
  bool Admits(std::uint32_t pid, const std::string& device_uuid, std::uint64_t connection_id,
              std::uint32_t uid = 0) const;
  /// Counts a sample not stored at a series limit (when the caller checked Admits first).
  void CountSeriesDropped();
  /// Counts a sample whose claimed pid was replaced by its sender's.
  void CountRelabeled();
  const SeriesLimits& limits() const { return limits_; }
  void CountRejected(RejectReason reason);
  void CountConnectionAccepted();
  void CountConnectionRefused();
  void CountConnectionIdleClosed();
  /// The connection ended: its series leave the current state (an agent that vanished), at
  /// once or after SeriesLimits::linger.
  void ConnectionClosed(std::uint64_t connection_id, Clock::time_point now = Clock::now());
  /// Drops series whose latest sample is older than `now - expiry`, and lingering series of
  /// closed connections whose linger is over; returns how many.
  std::size_t Expire(Clock::time_point now, Clock::duration expiry);

  /// A copy of the current entries, ordered by (pid, device_uuid).
  std::vector<AgentEntry> Entries() const;
  /// The same entries with their last kRecentPoints accepted samples (RecentPoint).
  std::vector<AgentView> Views() const;
  AgentCounters Counters() const;

 private:
  mutable std::mutex mu_;
  using Key = std::pair<std::uint32_t, std::string>;
  using Iterator = std::map<Key, AgentEntry>::iterator;
  void Forget(std::uint64_t connection_id);  // one series of it left; REQUIRES: mu_ held
  // Removes a series and its counts; REQUIRES: mu_ held.
  Iterator Erase(Iterator it);
  // Whether a sample of `key` from `uid` on `connection_id` may be stored; with `make_room`,
  // evicts the series whose place it takes (class comment). REQUIRES: mu_ held.
  bool Room(const Key& key, std::uint32_t uid, std::uint64_t connection_id, bool make_room);

  SeriesLimits limits_;
  std::map<Key, AgentEntry> entries_;
  std::map<Key, std::deque<RecentPoint>> recent_;              // same keys as entries_
  std::map<std::uint64_t, std::size_t> series_by_connection_;  // live series per connection
  std::map<std::uint32_t, std::size_t> series_by_uid_;         // all series per UID
  AgentCounters counters_;
};

}  // namespace fragscope::agent

#endif  // FRAGSCOPE_SOURCES_AGENT_AGENT_REGISTRY_H_
