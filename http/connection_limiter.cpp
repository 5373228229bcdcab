#include "http/connection_limiter.hpp"

namespace ferry::http {

ConnectionLimiter::Admission ConnectionLimiter::admit(Id id) {
  Admission a;
  if (live() >= limit_) {
    const auto victim = evict_one();
    if (!victim) return {Verdict::refuse, 0};
    a = {Verdict::admit_after_evicting, *victim};
  }
  connections_.emplace(id, Connection{});
  idle(id);
  return a;
}

void ConnectionLimiter::leave_idle(Connection& c) {
  if (!c.idle) return;
  idle_.erase(c.position);
  c.idle = false;
}

void ConnectionLimiter::idle(Id id) {
  const auto it = connections_.find(id);
  if (it == connections_.end() || it->second.idle || it->second.evicting) return;
  it->second.position = idle_.insert(idle_.end(), id);
  it->second.idle = true;
}

bool ConnectionLimiter::busy(Id id) {
  const auto it = connections_.find(id);
  if (it == connections_.end()) return false;
  leave_idle(it->second);
  if (!it->second.evicting) return false;
  it->second.evicting = false;
  --evicting_;
  return true;
}

void ConnectionLimiter::closed(Id id) {
  const auto it = connections_.find(id);
  if (it == connections_.end()) return;
  leave_idle(it->second);
  if (it->second.evicting) --evicting_;
  connections_.erase(it);
}

std::optional<ConnectionLimiter::Id> ConnectionLimiter::evict_one() {
  if (idle_.empty()) return std::nullopt;
  const Id victim = idle_.front();
  Connection& c = connections_.at(victim);
  leave_idle(c);
  c.evicting = true;
  ++evicting_;
  return victim;
}

}  // namespace ferry::http
