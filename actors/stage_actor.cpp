#include "actors/stage_actor.hpp"

#include <chrono>
#include <exception>

namespace ferry::actors {

StepOutcome run_step(model::Backend& backend, const StepPlan& plan) {
  StepOutcome outcome;
  outcome.step = plan.step;
  const auto begin = std::chrono::steady_clock::now();
  try {
    for (uint32_t slot : plan.reset_slots) backend.reset_slot(slot);
    if (!plan.rows.empty()) {
      const std::vector<model::SlotResult> results = backend.step(plan.rows);
      if (results.size() != plan.rows.size()) {
        outcome.error = "backend returned " + std::to_string(results.size()) + " results for " +
                        std::to_string(plan.rows.size()) + " rows";
        return outcome;
      }
      for (size_t i = 0; i < results.size(); ++i) {
        if (plan.rows[i].sample) outcome.sampled.push_back(SampledToken{results[i].slot, results[i].sampled});
      }
    }
  } catch (const std::exception& e) {
    outcome.sampled.clear();
    outcome.error = e.what();
    if (outcome.error.empty()) outcome.error = "unknown backend error";
  }
  outcome.compute_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count();
  return outcome;
}

stage_actor::behavior_type stage(stage_actor::stateful_pointer<StageState> self,
                                 std::shared_ptr<model::Backend> backend) {
  self->state.status.backend = backend->describe();
  self->state.backend = std::move(backend);
  return {
      // Runs on a scheduler worker for the length of the step: the CPU backend's own threads do the
      // work; the actor system is configured with workers to spare (actors/bootstrap.cpp).
      [self](step_atom, const StepPlan& plan) -> StepOutcome {
        StageState& st = self->state;
        if (st.status.failed) {
          StepOutcome refused;
          refused.step = plan.step;
          refused.error = st.status.failure;
          return refused;
        }
        StepOutcome outcome = run_step(*st.backend, plan);
        ++st.status.steps;
        if (!outcome.error.empty()) {
          st.status.failed = true;
          st.status.failure = outcome.error;
        }
        return outcome;
      },
      [self](status_atom) -> StageStatus { return self->state.status; },
  };
}

}  // namespace ferry::actors
