#pragma once
// The stage actor: owns a Backend and runs one step per StepPlan message. A backend exception fails
// that step (the scheduler fails the requests in it) and every later one, with the backend's message;
// status_atom reports it for /health.
#include <memory>

#include "actors/protocol.hpp"
#include "model/backend.hpp"

namespace ferry::actors {

struct StageState {
  std::shared_ptr<model::Backend> backend;
  StageStatus status;
};

stage_actor::behavior_type stage(stage_actor::stateful_pointer<StageState> self,
                                 std::shared_ptr<model::Backend> backend);

// The step itself, without the actor: resets, rows through the backend, sampled tokens out.
StepOutcome run_step(model::Backend& backend, const StepPlan& plan);

}  // namespace ferry::actors
