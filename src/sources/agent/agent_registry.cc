// AgentRegistry (agent_registry.h).
#include "sources/agent/agent_registry.h"

#include <algorithm>

namespace fragscope::agent {

void AgentRegistry::Forget(std::uint64_t connection_id) {
  auto it = series_by_connection_.find(connection_id);
  if (it != series_by_connection_.end() && --it->second == 0) series_by_connection_.erase(it);
}

bool AgentRegistry::EvictOldestLingering() {
  auto oldest = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->second.closed &&
        (oldest == entries_.end() || *it->second.closed < *oldest->second.closed)) {
      oldest = it;
    }
  }
  if (oldest == entries_.end()) return false;
  entries_.erase(oldest);
  ++counters_.series_expired;
  return true;
}

bool AgentRegistry::Admits(std::uint32_t pid, const std::string& device_uuid,
                           std::uint64_t connection_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (entries_.count({pid, device_uuid}) != 0) return true;
  const auto owned = series_by_connection_.find(connection_id);
  const bool room = entries_.size() < limits_.max_series ||
                    std::any_of(entries_.begin(), entries_.end(),
                                [](const auto& kv) { return kv.second.closed.has_value(); });
  return room && (owned == series_by_connection_.end() ||
                  owned->second < limits_.max_series_per_connection);
}

void AgentRegistry::CountSeriesDropped() {
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.series_dropped;
}

bool AgentRegistry::Accept(const AgentSample& sample, std::uint64_t connection_id,
                           Clock::time_point now) {
  const auto unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
  std::lock_guard<std::mutex> lock(mu_);
  auto key = std::make_pair(sample.pid, sample.device_uuid);
  auto found = entries_.find(key);
  if (found == entries_.end()) {
    const auto owned = series_by_connection_.find(connection_id);
    if ((owned != series_by_connection_.end() &&
         owned->second >= limits_.max_series_per_connection) ||
        (entries_.size() >= limits_.max_series && !EvictOldestLingering())) {
      ++counters_.series_dropped;
      return false;
    }
    found = entries_.emplace(std::move(key), AgentEntry{}).first;
    ++series_by_connection_[connection_id];
  } else if (found->second.closed) {
    // A lingering series whose agent is back (a reconnect of the same process).
    ++series_by_connection_[connection_id];
  } else if (found->second.connection_id != connection_id) {
    // The key moves to the connection that sends it now (an agent that reconnected).
    Forget(found->second.connection_id);
    ++series_by_connection_[connection_id];
  }
  AgentEntry& entry = found->second;
  entry.sample = sample;
  entry.connection_id = connection_id;
  entry.received = now;
  entry.received_unix_ms = unix_ms;
  entry.closed.reset();
  ++entry.samples;
  ++counters_.samples_received;
  return true;
}

void AgentRegistry::CountRejected(RejectReason reason) {
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.rejected[static_cast<std::size_t>(reason)];
}

void AgentRegistry::CountConnectionAccepted() {
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.connections_accepted;
  ++counters_.connections_open;
}

void AgentRegistry::CountConnectionRefused() {
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.connections_refused;
}

void AgentRegistry::CountConnectionIdleClosed() {
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.connections_idle_closed;
}

void AgentRegistry::ConnectionClosed(std::uint64_t connection_id, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  if (counters_.connections_open > 0) --counters_.connections_open;
  if (series_by_connection_.erase(connection_id) == 0) return;  // it owned no series
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.connection_id != connection_id || it->second.closed) {
      ++it;
    } else if (limits_.linger > Clock::duration::zero()) {
      it->second.closed = now;
      ++it;
    } else {
      it = entries_.erase(it);
      ++counters_.series_expired;
    }
  }
}

std::size_t AgentRegistry::Expire(Clock::time_point now, Clock::duration expiry) {
  std::lock_guard<std::mutex> lock(mu_);
  std::size_t dropped = 0;
  for (auto it = entries_.begin(); it != entries_.end();) {
    const AgentEntry& e = it->second;
    const bool lingered = e.closed && now - *e.closed >= limits_.linger;
    const bool silent = !e.closed && now - e.received > expiry;
    if (!lingered && !silent) {
      ++it;
      continue;
    }
    if (silent) Forget(e.connection_id);
    it = entries_.erase(it);
    ++dropped;
  }
  counters_.series_expired += dropped;
  return dropped;
}

std::vector<AgentEntry> AgentRegistry::Entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<AgentEntry> out;
  out.reserve(entries_.size());
  for (const auto& [key, entry] : entries_) out.push_back(entry);
  return out;
}

AgentCounters AgentRegistry::Counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

}  // namespace fragscope::agent
