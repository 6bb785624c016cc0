// AgentRegistry (agent_registry.h).
#include "sources/agent/agent_registry.h"

namespace fragscope::agent {

void AgentRegistry::Accept(const AgentSample& sample, std::uint64_t connection_id,
                           Clock::time_point now) {
  const auto unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
  std::lock_guard<std::mutex> lock(mu_);
  AgentEntry& entry = entries_[{sample.pid, sample.device_uuid}];
  entry.sample = sample;
  entry.connection_id = connection_id;
  entry.received = now;
  entry.received_unix_ms = unix_ms;
  ++entry.samples;
  ++counters_.samples_received;
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

void AgentRegistry::ConnectionClosed(std::uint64_t connection_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (counters_.connections_open > 0) --counters_.connections_open;
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.connection_id == connection_id) {
      it = entries_.erase(it);
      ++counters_.series_expired;
    } else {
      ++it;
    }
  }
}

std::size_t AgentRegistry::Expire(Clock::time_point now, Clock::duration expiry) {
  std::lock_guard<std::mutex> lock(mu_);
  std::size_t dropped = 0;
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (now - it->second.received > expiry) {
      it = entries_.erase(it);
      ++dropped;
    } else {
      ++it;
    }
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
