#pragma once
// Spawns the engine graph of a run from its configuration: the stage actor owning the backend, and
// the scheduler that drives it. HTTP bridges attach to the scheduler.
#include <caf/all.hpp>

#include <memory>

#include "actors/protocol.hpp"
#include "actors/step_planner.hpp"
#include "config/serve_config.hpp"
#include "model/backend.hpp"

namespace ferry::actors {

struct Engine {
  scheduler_actor scheduler;
  stage_actor stage;
  PlannerLimits limits;  // as effective: ctx clamped to what the backend can hold
};

// The scheduler's limits from the configuration and what the backend supports.
PlannerLimits planner_limits(const config::ServeConfig& config, const model::Backend& backend);

Engine spawn_engine(caf::actor_system& system, const config::ServeConfig& config,
                    std::shared_ptr<model::Backend> backend);

// Actor system settings for a server: enough scheduler workers that a stage blocked in a step leaves
// the scheduler and the bridges running.
void configure_actor_system(caf::actor_system_config& cfg);

}  // namespace ferry::actors
