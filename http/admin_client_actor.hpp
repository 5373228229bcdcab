#pragma once
// One actor per admin console (ARCHITECTURE: admin WebSocket). It reads the console's messages
// (http/admin_json.hpp documents them), checks the token when the upgrade did not carry it, sends
// a snapshot and then, at the console's rate, what changed since the revision it last sent, and
// turns commands into requests to the admin actor, answering each with an ack or an error. It
// quits when the console goes, when it is dropped for not reading, or when the admin actor stops.
#include <atomic>
#include <memory>
#include <string>

#include "actors/protocol.hpp"
#include "http/admin_channel.hpp"
#include "http/admin_json.hpp"
#include "http/server_context.hpp"

namespace ferry::http {

struct AdminClientJob {
  std::shared_ptr<AdminChannel> channel;
  std::shared_ptr<const ServerContext> context;
  bool authenticated = false;  // the upgrade carried the token, or the console needs none
};

// Counts the actor in AdminMetrics::client_actors for as long as its state lives.
struct AdminClientCount {
  std::atomic<int64_t>* count = nullptr;
  AdminClientCount() = default;
  AdminClientCount(const AdminClientCount&) = delete;
  AdminClientCount& operator=(const AdminClientCount&) = delete;
  ~AdminClientCount() {
    if (count != nullptr) count->fetch_sub(1);
  }
};

struct AdminClientState {
  AdminClientCount counted;  // first: destroyed last, after the job has released the channel
  AdminClientJob job;
  double rate_hz = kAdminDefaultRateHz;
  uint64_t rev = 0;             // the revision the console has seen
  uint64_t tick = 0;            // the current tick's number (a new rate starts a new series)
  bool tick_scheduled = false;  // a tick of the current number is on its way
  bool view_pending = false;    // a view is asked for: ticks wait for it
  bool started = false;         // the first snapshot went out
  bool closed = false;
  actors::ThroughputSample last_throughput;
};

using admin_client_pointer = actors::admin_client_actor::stateful_pointer<AdminClientState>;

actors::admin_client_actor::behavior_type admin_client(admin_client_pointer self, AdminClientJob job);

// Whether `token` is the configured admin token; the comparison takes the same time wherever they differ.
bool admin_token_matches(const std::string& configured, const std::string& token);

}  // namespace ferry::http
