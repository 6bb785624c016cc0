// AgentRegistry (agent_registry.h).
#include "sources/agent/agent_registry.h"

#include <algorithm>

namespace fragscope::agent {
namespace {

std::uint32_t OwnerOf(const AgentEntry& e) { return e.sample.uid.value_or(0); }

}  // namespace

void AgentRegistry::Forget(std::uint64_t connection_id) {
  auto it = series_by_connection_.find(connection_id);
  if (it != series_by_connection_.end() && --it->second == 0) series_by_connection_.erase(it);
}

AgentRegistry::Iterator AgentRegistry::Erase(Iterator it) {
  if (!it->second.closed) Forget(it->second.connection_id);
  if (auto u = series_by_uid_.find(OwnerOf(it->second));
      u != series_by_uid_.end() && --u->second == 0) {
    series_by_uid_.erase(u);
  }
  ++counters_.series_expired;
  recent_.erase(it->first);
  return entries_.erase(it);
}

bool AgentRegistry::Room(const Key& key, std::uint32_t uid, std::uint64_t connection_id,
                         bool make_room) {
  if (auto found = entries_.find(key); found != entries_.end()) {
    // Known: its own UID updates it (or takes it over from a connection that reconnected);
    // another UID never touches it, live or lingering.
    return OwnerOf(found->second) == uid;
  }
  if (const auto owned = series_by_connection_.find(connection_id);
      owned != series_by_connection_.end() && owned->second >= limits_.max_series_per_connection) {
    return false;
  }
  const auto held_it = series_by_uid_.find(uid);
  const std::size_t held = held_it == series_by_uid_.end() ? 0 : held_it->second;
  // The series to give its place: the oldest lingering of `owner`, else (only when `live`)
  // its least recently updated one.
  auto pick = [&](std::uint32_t owner, bool live) {
    auto victim = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      const AgentEntry& e = it->second;
      if (OwnerOf(e) != owner || (!e.closed && !live)) continue;
      if (victim == entries_.end()) {
        victim = it;
        continue;
      }
      const AgentEntry& v = victim->second;
      if (e.closed.has_value() != v.closed.has_value()) {
        if (e.closed) victim = it;  // lingering before live
      } else if (e.closed ? *e.closed < *v.closed : e.received < v.received) {
        victim = it;
      }
    }
    return victim;
  };
  auto evict = [&](Iterator victim) {
    if (victim == entries_.end()) return false;
    if (make_room) Erase(victim);
    return true;
  };
  if (held >= limits_.max_series_per_uid) return evict(pick(uid, false));
  if (entries_.size() < limits_.max_series) return true;
  const std::size_t uids = series_by_uid_.size() + (held == 0 ? 1 : 0);
  const std::size_t fair = std::max<std::size_t>(1, limits_.max_series / uids);
  if (held >= fair) return evict(pick(uid, false));
  // Under its share: the heaviest other UID gives a place (it holds more than its share).
  std::uint32_t heaviest = uid;
  std::size_t most = 0;
  for (const auto& [owner, count] : series_by_uid_) {
    if (owner != uid && count > most) {
      heaviest = owner;
      most = count;
    }
  }
  if (most <= fair) return evict(pick(uid, false));
  return evict(pick(heaviest, true));
}

bool AgentRegistry::Admits(std::uint32_t pid, const std::string& device_uuid,
                           std::uint64_t connection_id, std::uint32_t uid) const {
  std::lock_guard<std::mutex> lock(mu_);
  return const_cast<AgentRegistry*>(this)->Room({pid, device_uuid}, uid, connection_id, false);
}

void AgentRegistry::CountSeriesDropped() {
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.series_dropped;
}

void AgentRegistry::CountRelabeled() {
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.samples_relabeled;
}

bool AgentRegistry::Accept(const AgentSample& sample, std::uint64_t connection_id,
                           Clock::time_point now) {
  const auto unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
  const std::uint32_t uid = sample.uid.value_or(0);
  std::lock_guard<std::mutex> lock(mu_);
  Key key(sample.pid, sample.device_uuid);
  if (!Room(key, uid, connection_id, true)) {
    ++counters_.series_dropped;
    return false;
  }
  auto found = entries_.find(key);
  if (found == entries_.end()) {
    found = entries_.emplace(std::move(key), AgentEntry{}).first;
    ++series_by_connection_[connection_id];
    ++series_by_uid_[uid];
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
  entry.sample.uid = uid;
  entry.connection_id = connection_id;
  entry.received = now;
  entry.received_unix_ms = unix_ms;
  entry.closed.reset();
  ++entry.samples;
  std::deque<RecentPoint>& recent = recent_[found->first];
  if (recent.size() >= kRecentPoints) recent.pop_front();
  recent.push_back({sample.step, sample.reserved_bytes, sample.allocated_bytes});
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
      it = Erase(it);
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
    it = Erase(it);
    ++dropped;
  }
  return dropped;
}

std::vector<AgentEntry> AgentRegistry::Entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<AgentEntry> out;
  out.reserve(entries_.size());
  for (const auto& [key, entry] : entries_) out.push_back(entry);
  return out;
}

std::vector<AgentView> AgentRegistry::Views() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<AgentView> out;
  out.reserve(entries_.size());
  for (const auto& [key, entry] : entries_) {
    AgentView& view = out.emplace_back();
    view.entry = entry;
    if (const auto it = recent_.find(key); it != recent_.end()) {
      view.recent.assign(it->second.begin(), it->second.end());
    }
  }
  return out;
}

AgentCounters AgentRegistry::Counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

}  // namespace fragscope::agent
