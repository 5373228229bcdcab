#include "actors/scheduler_actor.hpp"

#include <algorithm>
#include <chrono>

namespace ferry::actors {
namespace {

EngineSnapshot engine_snapshot(const SchedulerState& st) {
  EngineSnapshot snap = st.planner.snapshot();
  snap.stages = st.stages.statuses;
  return snap;
}

void publish(scheduler_pointer self) {
  SchedulerState& st = self->state;
  const EngineSnapshot snap = engine_snapshot(st);
  const ActorReport report = scheduler_report(st, snap, own_mailbox_depth(self));
  for (const auto& sink : st.telemetry.subscribers) self->send(sink, report, snap);
}

void telemetry_changed(scheduler_pointer self) {
  actors::telemetry_changed(self, self->state.telemetry, [self] { publish(self); });
}

void deliver(scheduler_pointer self, EngineEvents events) {
  SchedulerState& st = self->state;
  for (EngineEvent& event : events) {
    const RequestId id = event_request(event);
    auto it = st.sinks.find(id);
    if (it == st.sinks.end()) continue;  // its owner is gone: nobody to tell
    const request_sink_actor sink = it->second;
    if (auto* done = std::get_if<RequestFinished>(&event)) {
      if (st.planner.draining()) {
        (done->status == RequestStatus::cancelled ? st.drained.cancelled : st.drained.finished) += 1;
      }
      self->demonitor(sink.address());
      st.sink_requests.erase(sink->address());
      st.sinks.erase(it);
    }
    std::visit([&](auto& e) { self->send(sink, std::move(e)); }, event);
  }
}

void answer_drained(scheduler_pointer self) {
  SchedulerState& st = self->state;
  if (!st.planner.draining() || !st.planner.idle()) return;
  for (auto& promise : st.drain_waiters) promise.deliver(st.drained);
  st.drain_waiters.clear();
}

// The step loop (STYLE rule 1): plan -> execute down the stages -> apply -> emit. Steps go out while
// the planner gives them (up to one per stage); each outcome is applied as it comes back and plans
// again. With nothing to plan the actor just waits for its next message.
void next_steps(scheduler_pointer self) {
  SchedulerState& st = self->state;
  for (;;) {
    EngineEvents started;
    std::optional<StepPlan> plan = st.planner.plan(Clock::now(), started);
    deliver(self, std::move(started));
    if (!plan) break;
    const uint64_t step = plan->step;
    StageWork work{std::make_shared<const StepPlan>(std::move(*plan)), nullptr, {}, {}};
    self->request(st.first_stage, caf::infinite, step_atom_v, std::move(work))
        .then(
            [self](StepOutcome& outcome) {
              self->state.stages.note(outcome.stages);
              deliver(self, self->state.planner.apply(outcome, Clock::now()));
              next_steps(self);
            },
            [self, step](caf::error& err) {
              StepOutcome lost;
              lost.step = step;
              lost.error = "the stage did not answer: " + self->system().render(err);
              lost.stage_dead = true;
              deliver(self, self->state.planner.apply(lost, Clock::now()));
              next_steps(self);
            });
  }
  answer_drained(self);
  telemetry_changed(self);
}

}  // namespace

ActorReport scheduler_report(const SchedulerState& st, const EngineSnapshot& snap, uint64_t mailbox) {
  ActorReport r;
  r.name = "scheduler";
  r.kind = ActorKind::scheduler;
  if (!st.stages.statuses.empty()) r.links.push_back(stage_name(0));
  std::vector<RequestId> sinks;
  for (const auto& [id, sink] : st.sinks) sinks.push_back(id);
  std::sort(sinks.begin(), sinks.end());
  for (RequestId id : sinks) r.links.push_back(bridge_name(id));
  r.mailbox = mailbox;
  uint32_t decoding = 0, prefilling = 0;
  for (const SlotSnapshot& s : snap.slots) {
    if (!s.busy) continue;
    (s.status == RequestStatus::prefilling ? prefilling : decoding) += 1;
  }
  const size_t in_flight = st.planner.steps_in_flight();
  if (snap.failed) {
    r.doing = "failed: " + snap.failure;
  } else if (in_flight == 0 && decoding + prefilling == 0) {
    r.doing = snap.draining ? "drained" : snap.queued > 0 ? "waiting for a slot" : "idle";
  } else {
    r.doing = std::string(snap.draining ? "draining: " : "") + std::to_string(in_flight) +
              (in_flight == 1 ? " step" : " steps") + " in flight, " + std::to_string(decoding) + " decoding, " +
              std::to_string(prefilling) + " prefilling";
  }
  r.counters = {
      {"steps_in_flight", static_cast<double>(in_flight)},
      {"requests_live", static_cast<double>(st.sinks.size())},
      {"queued", static_cast<double>(snap.queued)},
      {"steps", static_cast<double>(snap.steps)},
      {"generated_tokens", static_cast<double>(snap.generated_tokens)},
      {"prompt_tokens", static_cast<double>(snap.prompt_tokens)},
      {"cached_tokens", static_cast<double>(snap.cached_tokens)},
  };
  return r;
}

scheduler_actor::behavior_type scheduler(scheduler_pointer self, PlannerLimits limits, stage_actor first_stage,
                                         std::vector<StageStatus> stages, PublishThrottle::Duration telemetry_interval) {
  self->state.planner = StepPlanner(limits);
  self->state.telemetry.throttle = PublishThrottle(telemetry_interval);
  self->state.first_stage = std::move(first_stage);
  self->state.stages.statuses = std::move(stages);
  // A sink that dies without cancelling (a crashed bridge) must not keep its slot busy.
  self->set_down_handler([self](const caf::down_msg& down) {
    SchedulerState& st = self->state;
    st.telemetry.unsubscribe(down.source);
    auto it = st.sink_requests.find(down.source);
    if (it == st.sink_requests.end()) return;
    const RequestId id = it->second;
    st.sink_requests.erase(it);
    st.sinks.erase(id);
    deliver(self, st.planner.cancel(CancelRequest{id, EndCause::client_cancelled}, Clock::now()));
    next_steps(self);
  });
  return {
      [self](submit_atom, GenerateRequest& request, request_sink_actor& sink) {
        SchedulerState& st = self->state;
        const RequestId id = request.id;
        EngineEvents rejected = st.planner.submit(std::move(request), Clock::now());
        if (rejected.empty() && st.sinks.count(id) == 0) {
          st.sinks.emplace(id, sink);
          st.sink_requests.emplace(sink->address(), id);
          self->monitor(sink);
        }
        for (EngineEvent& e : rejected) std::visit([&](auto& x) { self->send(sink, std::move(x)); }, e);
        next_steps(self);
      },
      [self](const CancelRequest& cancel) {
        deliver(self, self->state.planner.cancel(cancel, Clock::now()));
        next_steps(self);
        answer_drained(self);
      },
      [self](const ReleaseSlot& release) -> ReleaseResult {
        auto [result, events] = self->state.planner.release(release.slot, Clock::now());
        deliver(self, std::move(events));
        next_steps(self);
        return result;
      },
      [self](const DrainRequest& drain) -> caf::typed_response_promise<DrainDone> {
        SchedulerState& st = self->state;
        auto promise = self->make_response_promise<DrainDone>();
        st.drain_waiters.push_back(promise);
        if (!st.planner.draining()) {
          st.planner.start_drain();
          const auto timeout = std::chrono::duration<double, std::milli>(drain.timeout_ms);
          self->delayed_send(self, std::chrono::duration_cast<std::chrono::milliseconds>(timeout),
                             drain_deadline_atom_v);
        }
        answer_drained(self);
        telemetry_changed(self);
        return promise;
      },
      [self](drain_deadline_atom) {
        deliver(self, self->state.planner.cancel_all(EndCause::drain_deadline, Clock::now()));
        answer_drained(self);
        telemetry_changed(self);
      },
      [self](snapshot_atom) -> EngineSnapshot { return engine_snapshot(self->state); },
      [self](const AdminCancel& cancel) -> CancelResult {
        CancelResult result;
        result.id = cancel.id;
        if (const auto status = self->state.planner.status(cancel.id)) {
          result.was_live = true;
          result.status = *status;
        }
        deliver(self, self->state.planner.cancel(CancelRequest{cancel.id, EndCause::admin_cancelled}, Clock::now()));
        next_steps(self);
        answer_drained(self);
        return result;
      },
      [self](subscribe_atom, const telemetry_sink_actor& sink) {
        self->state.telemetry.subscribe(sink);
        self->monitor(sink);
        publish(self);  // the subscriber's first view of this actor, then changes as they come
      },
      [self](telemetry_flush_atom) {
        actors::telemetry_flush(self, self->state.telemetry, [self] { publish(self); });
      },
  };
}

}  // namespace ferry::actors
