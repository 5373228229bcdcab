// What the actor tests share: a request sink that records the engine's events, and an actor system
// on CAF's deterministic test scheduler.
#pragma once

#include <caf/all.hpp>

#include <memory>
#include <vector>

#include "actors/protocol.hpp"
#include "actors/step_planner.hpp"

namespace ferry::testing {

using EventLog = std::vector<actors::EngineEvent>;

inline actors::request_sink_actor::behavior_type recorder(actors::request_sink_actor::pointer,
                                                          std::shared_ptr<EventLog> log) {
  return {
      [log](const actors::RequestStarted& e) { log->emplace_back(e); },
      [log](const actors::TokensGenerated& e) { log->emplace_back(e); },
      [log](const actors::RequestFinished& e) { log->emplace_back(e); },
  };
}

inline caf::actor_system_config& test_config(caf::actor_system_config& cfg) {
  cfg.set("scheduler.policy", caf::atom("testing"));
  cfg.set("logger.file-verbosity", caf::atom("quiet"));
  return cfg;
}

}  // namespace ferry::testing
