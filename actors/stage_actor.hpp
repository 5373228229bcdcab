#pragma once
// The stage actor: owns one model::Stage and runs the steps that reach it, in order, on a thread of
// its own (spawned detached), so that the stages of a pipeline work on different steps at once. A
// step goes on to the next stage's actor (the scheduler's request is delegated, so the last stage's
// answer goes straight back), or is answered here when this stage is the last or fails it. An error
// that ends the stage (a device error) is answered for this and every later step.
#include <memory>
#include <optional>

#include "actors/protocol.hpp"
#include "actors/telemetry.hpp"
#include "config/serve_config.hpp"
#include "kv/checkpoint_store.hpp"
#include "model/stage.hpp"

namespace ferry::actors {

struct StageState {
  std::shared_ptr<model::Stage> stage;
  std::optional<stage_actor> next;
  std::optional<config::InjectedFault> fault;
  std::optional<expert_cache_actor> experts;  // where a tiered stage reports its routes
  kv::CheckpointStore checkpoints;            // this stage's part of the prefix cache's checkpoints
  StageStatus status;
  TelemetryPublisher telemetry;
  uint64_t steps_reported = 0;  // status.steps at the last report: more since then means it is working
  uint64_t last_step = 0;       // the plan's number
  size_t last_rows = 0;
  double last_step_ms = 0;      // wall time of the last step on this stage
};

// A tiered stage (one whose Stage::experts() is set) reports to `experts` after every step and
// starts the swaps it answers with between steps.
stage_actor::behavior_type stage(stage_actor::stateful_pointer<StageState> self, std::shared_ptr<model::Stage> stage,
                                 uint32_t index, std::optional<stage_actor> next, std::optional<config::InjectedFault> fault,
                                 std::optional<expert_cache_actor> experts,
                                 PublishThrottle::Duration telemetry_interval = kDefaultTelemetryInterval);

// The stage's telemetry (it advances `steps_reported`).
ActorReport stage_report(StageState& state, uint64_t mailbox);

// The step on one stage, without the actor: the plan's checkpoint drops, saves and spills, resets,
// restores, then its rows through the stage. A save the stage cannot make (a stage that keeps no
// state, no memory) does not fail the step: its id goes to `unsaved` and the checkpoint is not taken.
Expected<model::StageOutput> run_stage_step(model::Stage& stage, kv::CheckpointStore& checkpoints, const StepPlan& plan,
                                            const model::Handoff* in, std::vector<uint64_t>& unsaved);

}  // namespace ferry::actors
