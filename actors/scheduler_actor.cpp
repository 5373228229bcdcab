#include "actors/scheduler_actor.hpp"

#include <chrono>

namespace ferry::actors {
namespace {

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
    StageWork work{std::make_shared<const StepPlan>(std::move(*plan)), nullptr, {}};
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
}

}  // namespace

scheduler_actor::behavior_type scheduler(scheduler_pointer self, PlannerLimits limits, stage_actor first_stage,
                                         std::vector<StageStatus> stages) {
  self->state.planner = StepPlanner(limits);
  self->state.first_stage = std::move(first_stage);
  self->state.stages.statuses = std::move(stages);
  // A sink that dies without cancelling (a crashed bridge) must not keep its slot busy.
  self->set_down_handler([self](const caf::down_msg& down) {
    SchedulerState& st = self->state;
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
        return promise;
      },
      [self](drain_deadline_atom) {
        deliver(self, self->state.planner.cancel_all(EndCause::drain_deadline, Clock::now()));
        answer_drained(self);
      },
      [self](snapshot_atom) -> EngineSnapshot {
        EngineSnapshot snap = self->state.planner.snapshot();
        snap.stages = self->state.stages.statuses;
        return snap;
      },
  };
}

}  // namespace ferry::actors
