#include "actors/bootstrap.hpp"

#include <algorithm>
#include <thread>

#include "actors/scheduler_actor.hpp"
#include "actors/stage_actor.hpp"

namespace ferry::actors {

PlannerLimits planner_limits(const config::ServeConfig& config, const model::Backend& backend) {
  PlannerLimits limits;
  limits.slots = config.slots.count;
  limits.ctx = std::min(config.slots.ctx, backend.max_context());
  limits.prefill_chunk = config.slots.prefill_chunk;
  limits.queue_limit = config.slots.queue_limit;
  limits.vocab_size = backend.hparams().vocab_size;
  return limits;
}

Engine spawn_engine(caf::actor_system& system, const config::ServeConfig& config,
                    std::shared_ptr<model::Backend> backend) {
  Engine engine;
  engine.limits = planner_limits(config, *backend);
  engine.stage = system.spawn(stage, std::move(backend));
  engine.scheduler = system.spawn(scheduler, engine.limits, engine.stage);
  return engine;
}

void configure_actor_system(caf::actor_system_config& cfg) {
  // One worker may sit in a backend step for its whole length; the rest serve the scheduler, the
  // bridges and the admin handlers.
  const size_t workers = std::clamp<size_t>(std::thread::hardware_concurrency(), 4, 16);
  cfg.set("scheduler.max-threads", workers);
  // Workers of the sharing policy block on one queue's condition variable: an idle server sleeps
  // (STYLE rule 13), where work stealing would keep polling.
  cfg.set("scheduler.policy", caf::atom("sharing"));
  cfg.set("logger.file-verbosity", caf::atom("quiet"));
}

}  // namespace ferry::actors
