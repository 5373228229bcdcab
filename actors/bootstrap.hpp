#pragma once
// Spawns the engine graph of a run from its configuration: one stage actor per stage of the model's
// pipeline (each on a thread of its own, so that they work on different steps at once), chained from
// the first to the last, the scheduler that drives them, and the expert-cache actor when some stage
// keeps an expert pool. HTTP bridges attach to the scheduler.
#include <caf/all.hpp>

#include <memory>
#include <optional>
#include <vector>

#include "actors/admin_actor.hpp"
#include "actors/protocol.hpp"
#include "actors/step_planner.hpp"
#include "config/serve_config.hpp"
#include "model/expert_policy.hpp"
#include "model/pipeline.hpp"

namespace ferry::actors {

struct Engine {
  scheduler_actor scheduler;
  std::vector<stage_actor> stages;            // in pipeline order
  std::optional<expert_cache_actor> experts;  // when some stage keeps an expert pool
  admin_actor admin;                          // subscribed to the scheduler's and the stages' telemetry
  PlannerLimits limits;                       // as effective
};

// What the engine runs: the model's stages, and the policy of their expert pools when some stage has
// one (gpu::OpenedModel has all three).
struct EngineModel {
  const model::Pipeline* pipeline = nullptr;
  std::shared_ptr<model::ExpertPolicy> experts{};
  std::vector<int> expert_stage{};  // per stage: its number in the policy, -1 none
  std::vector<MemoryTier> memory_tiers{};  // the memory plan's pools and host store, for the admin console
};

// The scheduler's limits from the configuration and the pipeline: one step in flight per stage, one
// decode micro-batch per device in use unless --micro-batches says otherwise.
PlannerLimits planner_limits(const config::ServeConfig& config, const model::Pipeline& pipeline);
// The prefix cache's checkpoints from --checkpoint-budget / --checkpoint-every and the stages' layouts.
CheckpointLimits checkpoint_limits(const config::SlotsConfig& slots, const model::Pipeline& pipeline);

// Stage actors run detached (a thread each); `detached_stages` false puts them on the actor system's
// scheduler like any actor, for the deterministic test scheduler. `admin_hooks` lets the admin
// actor's drain command shut the server down as SIGTERM does.
Engine spawn_engine(caf::actor_system& system, const config::ServeConfig& config, const EngineModel& model,
                    bool detached_stages = true, AdminHooks admin_hooks = {});

// Ends every actor of the engine (shutdown).
void stop_engine(const Engine& engine);

// Actor system settings for a server: scheduler workers for the scheduler, the bridges and the admin
// handlers (the stages run on threads of their own).
void configure_actor_system(caf::actor_system_config& cfg);

}  // namespace ferry::actors
