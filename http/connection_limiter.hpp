#pragma once
// The connection cap as a plain class (STYLE rule 4: no sockets, no strands; the listener runs one on
// its strand). It knows which connections are open and which of them are idle, that is waiting for a
// request's first byte (a new connection, or a kept-alive one between requests): closing one of those
// loses nothing, so at the cap a new connection takes the place of the longest-idle one, as nginx
// reuses its idle keep-alive connections. Only when every connection is busy is a new one refused.
#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>

namespace ferry::http {

class ConnectionLimiter {
 public:
  using Id = uint64_t;
  enum class Verdict { admit, admit_after_evicting, refuse };
  struct Admission {
    Verdict verdict = Verdict::admit;
    Id evict = 0;  // with admit_after_evicting: the idle connection to close
  };

  explicit ConnectionLimiter(uint32_t limit) : limit_(limit) {}

  // A connection was accepted. Admitted, it counts as open and idle (it has sent nothing yet).
  Admission admit(Id id);
  // Waiting for a request's first byte: the newest idle one, the last to be evicted.
  void idle(Id id);
  // Reading or answering a request: not evictable. Also undoes an eviction the connection was chosen
  // for but that reached it too late (it had begun a request): it stays open, and true says so.
  bool busy(Id id);
  void closed(Id id);
  // The longest-idle connection, marked as closing; nullopt when every connection is busy (for when
  // file descriptors run out below the cap).
  std::optional<Id> evict_one();

  uint32_t open() const { return static_cast<uint32_t>(connections_.size()); }
  // Open and not being closed: what the cap counts.
  uint32_t live() const { return open() - evicting_; }
  uint32_t idle_count() const { return static_cast<uint32_t>(idle_.size()); }
  uint32_t limit() const { return limit_; }

 private:
  struct Connection {
    bool idle = false;
    bool evicting = false;
    std::list<Id>::iterator position;  // in idle_, when idle
  };
  void leave_idle(Connection& c);

  uint32_t limit_;
  std::unordered_map<Id, Connection> connections_;
  std::list<Id> idle_;  // oldest first
  uint32_t evicting_ = 0;
};

}  // namespace ferry::http
