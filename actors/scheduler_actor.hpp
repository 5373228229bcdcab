#pragma once
// The scheduler actor: a thin shell around StepPlanner (STYLE rule 4). It sends the planner's steps to
// the first stage (up to one per stage in flight), delivers each request's events to its sink, keeps
// the stages' last published statuses for the snapshot, and sleeps on its mailbox when there is
// nothing to do (rule 13).
#include <unordered_map>
#include <vector>

#include "actors/protocol.hpp"
#include "actors/step_planner.hpp"
#include "actors/telemetry.hpp"

namespace ferry::actors {

// The stages as they last reported, by index.
struct StageStatuses {
  std::vector<StageStatus> statuses;
  void note(const std::vector<StageStatus>& reported) {
    for (const StageStatus& s : reported) {
      if (s.index < statuses.size()) statuses[s.index] = s;
    }
  }
};

struct SchedulerState {
  StepPlanner planner{PlannerLimits{}};  // replaced with the configured one at spawn
  stage_actor first_stage;
  StageStatuses stages;
  std::unordered_map<RequestId, request_sink_actor> sinks;
  std::unordered_map<caf::actor_addr, RequestId> sink_requests;  // for the down handler
  std::vector<caf::typed_response_promise<DrainDone>> drain_waiters;
  DrainDone drained;
  TelemetryPublisher telemetry;  // the admin actor: this actor's report with the engine snapshot
};

using scheduler_pointer = scheduler_actor::stateful_pointer<SchedulerState>;

// `stages`: each stage's status before its first step (index, layers, backend).
scheduler_actor::behavior_type scheduler(scheduler_pointer self, PlannerLimits limits, stage_actor first_stage,
                                         std::vector<StageStatus> stages,
                                         PublishThrottle::Duration telemetry_interval = kDefaultTelemetryInterval);

// The scheduler's telemetry: who it is, what it is doing and its counters, from its snapshot.
ActorReport scheduler_report(const SchedulerState& state, const EngineSnapshot& snapshot, uint64_t mailbox);

}  // namespace ferry::actors
