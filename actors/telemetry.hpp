#pragma once
// How an actor publishes its telemetry: it keeps a TelemetryPublisher (its subscribers and a
// PublishThrottle), calls telemetry_changed() after anything its report shows changed, and forwards
// telemetry_flush_atom to telemetry_flush(). Both call `publish()` (which builds the report and
// sends it to every subscriber) only when the throttle says so, so the hot path pays a clock read
// and a comparison per step, and nothing at all while no one subscribes.
#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "actors/protocol.hpp"
#include "actors/publish_throttle.hpp"

namespace ferry::actors {

// The interval at which a busy actor reports, unless configured otherwise (--telemetry-interval).
constexpr std::chrono::milliseconds kDefaultTelemetryInterval{50};

struct TelemetryPublisher {
  std::vector<telemetry_sink_actor> subscribers;
  PublishThrottle throttle{kDefaultTelemetryInterval};

  bool active() const { return !subscribers.empty(); }
  void subscribe(const telemetry_sink_actor& sink) {
    if (std::find(subscribers.begin(), subscribers.end(), sink) == subscribers.end()) subscribers.push_back(sink);
  }
  void unsubscribe(const caf::actor_addr& address) {
    std::erase_if(subscribers, [&](const telemetry_sink_actor& s) { return s.address() == address; });
  }
};

template <class Self>
void schedule_telemetry_flush(Self* self, const PublishThrottle::Decision& d) {
  if (!d.flush_after) return;
  // At least a millisecond: a zero delay would come back at once and find nothing to do.
  const auto delay = std::max(std::chrono::duration_cast<std::chrono::milliseconds>(*d.flush_after),
                              std::chrono::milliseconds(1));
  self->delayed_send(self, delay, telemetry_flush_atom_v);
}

template <class Self, class Publish>
void telemetry_changed(Self* self, TelemetryPublisher& p, Publish&& publish) {
  if (!p.active()) return;
  const PublishThrottle::Decision d = p.throttle.changed(PublishThrottle::Clock::now());
  if (d.publish) publish();
  schedule_telemetry_flush(self, d);
}

template <class Self, class Publish>
void telemetry_flush(Self* self, TelemetryPublisher& p, Publish&& publish) {
  if (!p.active()) return;
  const PublishThrottle::Decision d = p.throttle.flush(PublishThrottle::Clock::now());
  if (d.publish) publish();
  schedule_telemetry_flush(self, d);
}

// Messages waiting in the calling actor's own mailbox (only the actor itself may ask: the count
// moves messages from the lock-free inbox into its queue).
template <class Self>
uint64_t own_mailbox_depth(Self* self) {
  return static_cast<uint64_t>(self->mailbox().size());
}

inline std::string stage_name(uint32_t index) { return "stage " + std::to_string(index); }
inline std::string bridge_name(RequestId id) { return "bridge " + std::to_string(id); }

}  // namespace ferry::actors
