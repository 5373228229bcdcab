#pragma once
// The scheduler actor: a thin shell around StepPlanner (STYLE rule 4). It keeps at most one step in
// flight at the stage, delivers each request's events to its sink, and sleeps on its mailbox when
// there is nothing to do (rule 13).
#include <unordered_map>
#include <vector>

#include "actors/protocol.hpp"
#include "actors/step_planner.hpp"

namespace ferry::actors {

struct SchedulerState {
  StepPlanner planner{PlannerLimits{}};  // replaced with the configured one at spawn
  stage_actor stage;
  std::unordered_map<RequestId, request_sink_actor> sinks;
  std::unordered_map<caf::actor_addr, RequestId> sink_requests;  // for the down handler
  std::vector<caf::typed_response_promise<DrainDone>> drain_waiters;
  DrainDone drained;
};

using scheduler_pointer = scheduler_actor::stateful_pointer<SchedulerState>;

scheduler_actor::behavior_type scheduler(scheduler_pointer self, PlannerLimits limits, stage_actor stage);

}  // namespace ferry::actors
