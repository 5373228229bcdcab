#include "actors/stage_actor.hpp"

#include <chrono>
#include <cstdio>

#include <spdlog/spdlog.h>

namespace ferry::actors {
namespace {

void note_counters(StageStatus& status, model::Stage& stage) {
  const model::StageCounters c = stage.counters();
  status.steps = c.steps;
  status.rows = c.rows;
  status.handoff_bytes = c.handoff_bytes;
  status.handoff_ms = c.handoff_ms;
  status.compute_ms = c.compute_ms;
  status.kv = {c.kv_window_rows,      c.kv_resident_rows,     c.kv_windowed_steps,     c.kv_hits,
               c.kv_fetched_rows,     c.kv_fetched_bytes,     c.kv_last_fetched_rows,  c.kv_last_fetched_bytes,
               c.kv_host_slot_bytes};
  if (model::ExpertTier* tier = stage.experts()) {
    status.tiered = true;
    status.experts = tier->counters();
  }
}

using stage_pointer = stage_actor::stateful_pointer<StageState>;

void publish(stage_pointer self) {
  StageState& st = self->state;
  const ActorReport report = stage_report(st, own_mailbox_depth(self));
  for (const auto& sink : st.telemetry.subscribers) self->send(sink, report, st.status);
}

}  // namespace

ActorReport stage_report(StageState& st, uint64_t mailbox) {
  ActorReport r;
  r.name = stage_name(st.status.index);
  r.kind = ActorKind::stage;
  r.links = {st.next ? stage_name(st.status.index + 1) : std::string("scheduler")};
  r.mailbox = mailbox;
  char ms[32];
  std::snprintf(ms, sizeof ms, "%.2f", st.last_step_ms);
  if (st.status.failed) {
    r.doing = "failed: " + st.status.failure;
  } else if (st.status.steps > st.steps_reported || mailbox > 0) {
    r.doing = "stepping: step " + std::to_string(st.last_step) + ", " + std::to_string(st.last_rows) + " rows in " +
              ms + " ms";
  } else {
    r.doing = "idle";
  }
  st.steps_reported = st.status.steps;
  r.counters = {
      {"steps", static_cast<double>(st.status.steps)},
      {"rows", static_cast<double>(st.status.rows)},
      {"compute_ms", st.status.compute_ms},
      {"handoff_ms", st.status.handoff_ms},
      {"handoff_bytes", static_cast<double>(st.status.handoff_bytes)},
      {"last_step_ms", st.last_step_ms},
  };
  return r;
}

Expected<model::StageOutput> run_stage_step(model::Stage& stage, kv::CheckpointStore& checkpoints, const StepPlan& plan,
                                            const model::Handoff* in, std::vector<uint64_t>& unsaved) {
  auto before_rows = [&]() -> Status {
    for (uint64_t id : plan.drop_checkpoints) checkpoints.drop(id);
    // What a checkpoint costs the step that carries it (the stage is busy meanwhile), for the log.
    // `rows`: the log gives the copied rows' image (a spill), else the checkpoint's own.
    auto timed = [&](const char* what, const CheckpointOp& op, bool rows, auto&& run) -> Status {
      const auto began = std::chrono::steady_clock::now();
      if (auto e = run()) return e;
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count();
      if (const model::SlotStateImage* image = rows ? checkpoints.rows(op.id) : checkpoints.find(op.id)) {
        spdlog::info("{}: checkpoint {} {} slot {} ({} tokens, {:.1f} MiB) in {:.1f} ms",
                     model::describe_layers(stage.layers()), op.id, what, op.slot, image->tokens,
                     static_cast<double>(image->data.size() * sizeof(float)) / double(1 << 20), ms);
      }
      return std::nullopt;
    };
    for (const CheckpointOp& op : plan.save_checkpoints) {
      if (auto e = timed("saved from", op, false, [&] { return checkpoints.save(stage, op.slot, op.id, op.tokens); })) {
        if (ends_stage(e->code)) return e;
        spdlog::warn("{}: checkpoint {} of slot {} not taken: {}", model::describe_layers(stage.layers()), op.id,
                     op.slot, e->message);
        unsaved.push_back(op.id);
      }
    }
    for (const CheckpointSpill& spill : plan.spill_checkpoints) {
      if (spill.ids.empty()) continue;
      const CheckpointOp first{spill.ids.front(), spill.slot};
      if (auto e = timed("rows spilled for", first, true, [&] { return checkpoints.spill(stage, spill.slot, spill.ids); })) {
        return e;
      }
    }
    for (uint32_t slot : plan.reset_slots) {
      if (auto e = stage.reset_slot(slot)) return e;
    }
    for (const CheckpointOp& op : plan.restore_checkpoints) {
      if (auto e = timed("restored into", op, false, [&] { return checkpoints.restore(stage, op.slot, op.id); })) return e;
    }
    return std::nullopt;
  };
  if (auto e = before_rows()) {
    if (in != nullptr) stage.discard(*in);
    return *e;
  }
  return stage.run(plan.rows, in);
}

namespace {

// One step on this stage: answered here (the last stage, or an error) or delegated to the next.
caf::result<StepOutcome> run_step(stage_pointer self, StageWork& work) {
  StageState& st = self->state;
  const StepPlan& plan = *work.plan;
  st.last_step = plan.step;
  st.last_rows = plan.rows.size();
  auto answer_error = [&](const Error& e) {
    StepOutcome out;
    out.step = plan.step;
    out.code = e.code;
    out.stage_dead = ends_stage(e.code);
    out.error = "stage " + std::to_string(st.status.index) + " (" + st.status.layers + ", " + st.status.backend +
                "): " + e.message;
    if (out.stage_dead && !st.status.failed) {
      st.status.failed = true;
      st.status.failure = out.error;
    }
    out.stages = std::move(work.stages);
    out.stages.push_back(st.status);
    return out;
  };
  if (st.status.failed) {
    if (work.handoff) st.stage->discard(*work.handoff);
    return answer_error(Error(ErrorCode::device_error, st.status.failure));
  }
  if (st.fault && st.fault->step == plan.step && st.fault->stage == st.status.index) {
    if (work.handoff) st.stage->discard(*work.handoff);
    return answer_error(Error(st.fault->code, "injected fault (--inject-fault) at step " +
                                                  std::to_string(plan.step) + ": " +
                                                  std::string(error_code_name(st.fault->code))));
  }
  auto output = run_stage_step(*st.stage, st.checkpoints, plan, work.handoff.get(), work.unsaved);
  note_counters(st.status, *st.stage);
  if (!output) return answer_error(output.error());
  if (model::ExpertTier* tier = st.stage->experts(); tier != nullptr && st.experts) {
    self->send(*st.experts, ExpertReport{st.status.index, tier->take_route_counts(), tier->take_finished_moves()});
  }
  work.stages.push_back(st.status);
  if (st.next) {
    return self->delegate(*st.next, step_atom_v,
                          StageWork{work.plan, std::move(output->handoff), std::move(work.stages), std::move(work.unsaved)});
  }
  StepOutcome out;
  out.step = plan.step;
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    model::SlotResult& r = output->results[i];
    if (plan.rows[i].sample) out.sampled.push_back(SampledToken{r.slot, r.sampled, r.accepted, std::move(r.drafts)});
  }
  out.stages = std::move(work.stages);
  out.unsaved_checkpoints = std::move(work.unsaved);
  return out;
}

}  // namespace

stage_actor::behavior_type stage(stage_actor::stateful_pointer<StageState> self, std::shared_ptr<model::Stage> stage,
                                 uint32_t index, std::optional<stage_actor> next, std::optional<config::InjectedFault> fault,
                                 std::optional<expert_cache_actor> experts, PublishThrottle::Duration telemetry_interval) {
  StageState& st = self->state;
  st.telemetry.throttle = PublishThrottle(telemetry_interval);
  st.status.index = index;
  st.status.layers = model::describe_layers(stage->layers());
  st.status.backend = stage->describe();
  st.stage = std::move(stage);
  st.next = std::move(next);
  st.fault = fault;
  st.experts = std::move(experts);
  note_counters(st.status, *st.stage);
  self->set_down_handler([self](const caf::down_msg& down) { self->state.telemetry.unsubscribe(down.source); });
  return {
      [self](step_atom, StageWork& work) -> caf::result<StepOutcome> {
        const auto began = std::chrono::steady_clock::now();
        caf::result<StepOutcome> result = run_step(self, work);
        StageState& st = self->state;
        st.last_step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count();
        telemetry_changed(self, st.telemetry, [self] { publish(self); });
        return result;
      },
      [self](status_atom) -> StageStatus { return self->state.status; },
      [self](const ExpertMoves& m) {
        StageState& st = self->state;
        model::ExpertTier* tier = st.stage->experts();
        if (tier == nullptr || st.status.failed) return;
        tier->start_moves(m.moves);
      },
      [self](subscribe_atom, const telemetry_sink_actor& sink) {
        self->state.telemetry.subscribe(sink);
        self->monitor(sink);
        publish(self);
      },
      [self](telemetry_flush_atom) { telemetry_flush(self, self->state.telemetry, [self] { publish(self); }); },
  };
}

}  // namespace ferry::actors
