#pragma once
// The actor interfaces of the engine graph, declared once: the atoms that tag messages and the typed
// handles of each actor. The message structs themselves are in actors/messages.hpp.
//
//   bridge (http/, one per request) --submit / CancelRequest--> scheduler
//   scheduler --StageWork--> stage 0 --StageWork--> stage 1 --> ... --> last stage
//   scheduler <--StepOutcome-- the last stage (or the stage that failed the step): each stage
//     delegates the request to the next, so the reply reaches the scheduler straight from the end
//   bridge <--RequestStarted / TokensGenerated / RequestFinished-- scheduler
//   admin (http/ handlers) --ReleaseSlot / CancelRequest / snapshot--> scheduler, status --> stages
//   main --DrainRequest--> scheduler (the reply comes when every slot is idle)
//   tiered stage --ExpertReport--> expert cache --ExpertMoves--> that stage (between its steps)
#include <caf/all.hpp>

#include "actors/messages.hpp"

CAF_ADD_ATOM(ferry, ferry::actors, submit_atom, "submit")
CAF_ADD_ATOM(ferry, ferry::actors, step_atom, "step")
CAF_ADD_ATOM(ferry, ferry::actors, snapshot_atom, "snapshot")
CAF_ADD_ATOM(ferry, ferry::actors, status_atom, "status")
CAF_ADD_ATOM(ferry, ferry::actors, drain_deadline_atom, "drain_dl")
CAF_ADD_ATOM(ferry, ferry::actors, client_gone_atom, "gone")

// A step between the stages of one host (it holds a hand-off, which names device memory).
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::actors::StageWork)

namespace ferry::actors {

// What a request's owner receives from the scheduler: RequestStarted (optional), any number of
// TokensGenerated, then exactly one RequestFinished.
using request_sink_actor = caf::typed_actor<caf::reacts_to<RequestStarted>, caf::reacts_to<TokensGenerated>,
                                            caf::reacts_to<RequestFinished>>;

// The HTTP side's per-request actor: a sink that also learns when its client went away.
using bridge_actor = request_sink_actor::extend<caf::reacts_to<client_gone_atom>>;

// Owns one stage; runs one step per message and passes it on (or answers, when last or failed).
using stage_actor = caf::typed_actor<caf::replies_to<step_atom, StageWork>::with<StepOutcome>,
                                     caf::replies_to<status_atom>::with<StageStatus>,
                                     caf::reacts_to<ExpertMoves>>;

// Owns the expert policy: learns from the tiered stages' reports, answers with swaps.
using expert_cache_actor = caf::typed_actor<caf::reacts_to<ExpertReport>>;

// Admission, slot choice, step planning; forwards tokens to each request's sink.
using scheduler_actor =
    caf::typed_actor<caf::reacts_to<submit_atom, GenerateRequest, request_sink_actor>,
                     caf::reacts_to<CancelRequest>,
                     caf::replies_to<ReleaseSlot>::with<ReleaseResult>,
                     caf::replies_to<DrainRequest>::with<DrainDone>,
                     caf::replies_to<snapshot_atom>::with<EngineSnapshot>,
                     caf::reacts_to<drain_deadline_atom>>;

}  // namespace ferry::actors
