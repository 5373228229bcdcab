#include "actors/bootstrap.hpp"

#include <algorithm>
#include <thread>

#include <spdlog/spdlog.h>

#include "actors/expert_cache_actor.hpp"
#include "actors/memory_plan.hpp"
#include "actors/scheduler_actor.hpp"
#include "actors/stage_actor.hpp"

namespace ferry::actors {

CheckpointLimits checkpoint_limits(const config::SlotsConfig& slots, const model::Pipeline& pipeline) {
  CheckpointLimits c;
  c.budget_bytes = static_cast<uint64_t>(slots.checkpoint_budget_gib * double(1ull << 30));
  c.every = slots.checkpoint_every;
  // Bytes of a checkpoint over all stages, from their layouts: the fixed parts, and per token the rows
  // (pool rows spread over their tokens; `span` is a multiple of any pool size).
  constexpr uint32_t span = 1u << 12;
  uint64_t fixed = 0, spanned = 0;
  for (const auto& stage : pipeline.stages()) {
    const model::SlotStateLayout& layout = stage->state_layout();
    fixed += layout.image_floats(0, 0, true) * sizeof(float);
    spanned += layout.image_floats(span, span, true) * sizeof(float);
  }
  c.fixed_bytes = fixed;
  c.token_bytes = (spanned - fixed + span - 1) / span;
  return c;
}

PlannerLimits planner_limits(const config::ServeConfig& config, const model::Pipeline& pipeline) {
  PlannerLimits limits;
  limits.slots = config.slots.count;
  limits.ctx = std::min(config.slots.ctx, pipeline.max_context());
  limits.prefill_chunk = config.slots.prefill_chunk;
  limits.queue_limit = config.slots.queue_limit;
  limits.vocab_size = pipeline.hparams().vocab_size;
  limits.max_in_flight = static_cast<uint32_t>(pipeline.stages().size());
  const config::StageSplit& split = config.devices.split;
  limits.micro_batches = split.micro_batches != 0
                             ? split.micro_batches
                             : static_cast<uint32_t>(config::distinct_devices(split, pipeline.stages().size()));
  // Drafts where the last stage makes them (validate() checked the text); asked for elsewhere, said.
  if (auto mtp = parse_mtp_setting(config.slots.mtp); mtp && mtp->enabled) {
    const model::Stage& last = *pipeline.stages().back();
    if (last.drafts()) {
      limits.mtp = *mtp;
    } else {
      spdlog::warn("--mtp {}: speculative decoding is off: the last stage ({}) runs no MTP block (the model has none)",
                   config.slots.mtp, last.describe());
    }
  }
  limits.checkpoints = checkpoint_limits(config.slots, pipeline);
  return limits;
}

Engine spawn_engine(caf::actor_system& system, const config::ServeConfig& config, const EngineModel& model,
                    bool detached_stages, AdminHooks admin_hooks) {
  const model::Pipeline& pipeline = *model.pipeline;
  Engine engine;
  if (model.experts) {
    engine.experts = system.spawn(expert_cache, model.experts, model.expert_stage, config.memory.expert_stats);
  }
  engine.limits = planner_limits(config, pipeline);
  const auto telemetry = std::chrono::duration_cast<PublishThrottle::Duration>(
      std::chrono::duration<double, std::milli>(config.server.telemetry_interval_ms));
  const auto& stages = pipeline.stages();
  engine.stages.resize(stages.size());
  std::optional<stage_actor> next;
  for (size_t i = stages.size(); i-- > 0;) {
    const auto index = static_cast<uint32_t>(i);
    engine.stages[i] = detached_stages
                           ? system.spawn<caf::detached>(stage, stages[i], index, next, config.inject_fault,
                                                         engine.experts, telemetry)
                           : system.spawn(stage, stages[i], index, next, config.inject_fault, engine.experts, telemetry);
    next = engine.stages[i];
  }
  std::vector<StageStatus> statuses(stages.size());
  for (size_t i = 0; i < stages.size(); ++i) {
    statuses[i].index = static_cast<uint32_t>(i);
    statuses[i].layers = model::describe_layers(stages[i]->layers());
    statuses[i].backend = stages[i]->describe();
  }
  engine.scheduler = system.spawn(scheduler, engine.limits, engine.stages.front(), std::move(statuses), telemetry);
  // The KV-residency actor (issue 12) is to be spawned before the admin actor and given to it like the
  // stages, so that it subscribes to its telemetry too.
  if (admin_hooks.drain_timeout_ms <= 0) admin_hooks.drain_timeout_ms = config.server.drain_timeout_s * 1000;
  engine.admin = system.spawn(admin, engine.scheduler, engine.stages,
                              describe_memory(pipeline, engine.limits, model.memory_tiers),
                              std::move(admin_hooks));
  return engine;
}

void stop_engine(const Engine& engine) {
  if (engine.admin) caf::anon_send_exit(engine.admin, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(engine.scheduler, caf::exit_reason::user_shutdown);
  for (const stage_actor& s : engine.stages) caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
  if (engine.experts) caf::anon_send_exit(*engine.experts, caf::exit_reason::user_shutdown);
}

void configure_actor_system(caf::actor_system_config& cfg) {
  const size_t workers = std::clamp<size_t>(std::thread::hardware_concurrency(), 4, 16);
  cfg.set("scheduler.max-threads", workers);
  // Workers of the sharing policy block on one queue's condition variable: an idle server sleeps
  // (STYLE rule 13), where work stealing would keep polling.
  cfg.set("scheduler.policy", caf::atom("sharing"));
  cfg.set("logger.file-verbosity", caf::atom("quiet"));
}

}  // namespace ferry::actors
