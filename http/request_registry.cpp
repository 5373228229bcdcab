#include "http/request_registry.hpp"

#include <boost/asio/post.hpp>
#include <sys/random.h>

#include <random>

namespace ferry::http {

RequestNumber random_request_number() {
  uint64_t bits = 0;
  for (;;) {
    if (getrandom(&bits, sizeof bits, 0) != static_cast<ssize_t>(sizeof bits)) {
      thread_local std::random_device fallback;  // getrandom cannot fail after boot; be safe anyway
      bits = (static_cast<uint64_t>(fallback()) << 32) ^ fallback();
    }
    bits &= (uint64_t{1} << 53) - 1;
    if (bits != 0) return bits;
  }
}

void RequestIndex::add(RequestNumber id, KeyIndex owner) { live_[id] = owner; }

void RequestIndex::end(RequestNumber id) {
  const auto it = live_.find(id);
  if (it == live_.end()) return;
  ended_[id] = it->second;
  live_.erase(it);
  ended_order_.push_back(id);
  while (ended_order_.size() > remembered_) {
    ended_.erase(ended_order_.front());
    ended_order_.pop_front();
  }
}

RequestIndex::Found RequestIndex::find(RequestNumber id, KeyIndex caller, bool any_owner) const {
  if (const auto it = live_.find(id); it != live_.end()) {
    return any_owner || it->second == caller ? Found::live : Found::unknown;
  }
  if (const auto it = ended_.find(id); it != ended_.end()) {
    return any_owner || it->second == caller ? Found::ended : Found::unknown;
  }
  return Found::unknown;
}

void RequestRegistry::add(RequestNumber id, KeyIndex owner) {
  boost::asio::post(strand_, [this, id, owner] { index_.add(id, owner); });
}

void RequestRegistry::end(RequestNumber id) {
  boost::asio::post(strand_, [this, id] { index_.end(id); });
}

void RequestRegistry::find(RequestNumber id, KeyIndex caller, bool any_owner,
                           std::function<void(RequestIndex::Found)> done) {
  boost::asio::post(strand_, [this, id, caller, any_owner, done = std::move(done)] {
    done(index_.find(id, caller, any_owner));
  });
}

}  // namespace ferry::http
