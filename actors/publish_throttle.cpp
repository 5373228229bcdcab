#include "actors/publish_throttle.hpp"

namespace ferry::actors {

PublishThrottle::Decision PublishThrottle::publish_at(Clock::time_point now) {
  last_ = now;
  published_once_ = true;
  dirty_ = false;
  flush_pending_ = true;  // the trailing flush: it publishes what comes next, or the quiet state
  return Decision{true, interval_};
}

PublishThrottle::Decision PublishThrottle::changed(Clock::time_point now) {
  dirty_ = true;
  if (flush_pending_) return {};  // the flush will carry it
  if (!published_once_ || now - last_ >= interval_) return publish_at(now);
  flush_pending_ = true;
  return Decision{false, last_ + interval_ - now};
}

PublishThrottle::Decision PublishThrottle::flush(Clock::time_point now) {
  if (!flush_pending_) return {};  // not ours (or already handled)
  flush_pending_ = false;
  if (dirty_) return publish_at(now);
  // Nothing new since the last report: one more, as the actor is now, and then sleep.
  last_ = now;
  return Decision{true, std::nullopt};
}

}  // namespace ferry::actors
