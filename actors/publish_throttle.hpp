#pragma once
// When an actor publishes its telemetry (STYLE rule 4: the policy is a plain class, the actors call
// it). A change is published at once when the last report is at least one interval old; otherwise
// one flush is scheduled for the end of the interval, which publishes everything that changed
// meanwhile. A flush that finds nothing new publishes once more (the actor has gone quiet, so its
// "doing" can say idle) and schedules nothing: an idle actor sleeps (rule 13). So a busy actor sends
// at most about one report per interval, whatever its step rate, and the last report it sends
// describes it at rest.
#include <chrono>
#include <optional>

namespace ferry::actors {

class PublishThrottle {
 public:
  using Clock = std::chrono::steady_clock;
  using Duration = Clock::duration;

  struct Decision {
    bool publish = false;                // publish a report now
    std::optional<Duration> flush_after;  // schedule a flush this long from now
  };

  explicit PublishThrottle(Duration interval) : interval_(interval) {}

  // Something the subscribers see changed at `now`.
  Decision changed(Clock::time_point now);
  // The flush that an earlier decision scheduled arrived.
  Decision flush(Clock::time_point now);

  Duration interval() const { return interval_; }

 private:
  Decision publish_at(Clock::time_point now);

  Duration interval_;
  Clock::time_point last_{};
  bool published_once_ = false;
  bool dirty_ = false;
  bool flush_pending_ = false;
};

}  // namespace ferry::actors
