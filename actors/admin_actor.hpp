#pragma once
// The admin actor: the engine's console (ARCHITECTURE: admin). It subscribes to the telemetry of the
// scheduler and every stage, takes the reports that bridges send from birth to exit, and keeps the
// live graph in an AdminGraph. It never asks an engine actor for anything on the hot path: the
// publishers push, throttled. Admin clients (the WebSocket side, http/admin_client_actor) ask it
// for views (what changed since the revision they saw) and send it commands, which it answers or
// forwards to the scheduler: cancel a request, release a slot, drain, set the log level, dump the
// memory plan.
#include <functional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "actors/admin_graph.hpp"
#include "actors/protocol.hpp"

namespace ferry::actors {

struct AdminHooks {
  // Starts the server's shutdown as SIGTERM does (refuse new requests, drain, exit); false when one
  // is already under way. Without it (tests, `ferry bench`) the admin asks the scheduler to drain.
  std::function<bool()> drain;
  double drain_timeout_ms = 0;  // 0: --drain-timeout
};

struct AdminState {
  AdminGraph graph;
  scheduler_actor scheduler;
  MemoryPlan memory;
  AdminHooks hooks;
  std::unordered_map<caf::actor_addr, std::string> reporters;  // monitored, for the down handler
  std::unordered_set<caf::actor_addr> clients;                 // actors that asked for views
  bool drain_started = false;
  uint64_t reports = 0;
  uint64_t commands = 0;
};

using admin_pointer = admin_actor::stateful_pointer<AdminState>;

admin_actor::behavior_type admin(admin_pointer self, scheduler_actor scheduler, std::vector<stage_actor> stages,
                                 MemoryPlan memory, AdminHooks hooks);

// The log levels SetLogLevel takes, in spdlog's names.
const std::vector<std::string>& log_level_names();

}  // namespace ferry::actors
