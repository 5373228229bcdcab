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
//
// Telemetry (actors/telemetry.hpp): the admin actor subscribes to the scheduler and every stage;
// each publishes ActorReports to its subscribers (throttled), the scheduler with its EngineSnapshot
// and a stage with its StageStatus; bridges publish to the engine's admin actor from birth to exit.
// The KV-residency actor will subscribe the same way when it exists.
//   scheduler / stage i --ActorReport [+ EngineSnapshot | StageStatus]--> admin
//   bridge --ActorReport--> admin
//   admin client (http/, one per WebSocket) --admin_view_atom, AdminCancel, ReleaseSlot,
//     admin_drain_atom, SetLogLevel, memory_plan_atom--> admin --AdminCancel / ReleaseSlot--> scheduler
#include <caf/all.hpp>

#include "actors/messages.hpp"

CAF_ADD_ATOM(ferry, ferry::actors, submit_atom, "submit")
CAF_ADD_ATOM(ferry, ferry::actors, step_atom, "step")
CAF_ADD_ATOM(ferry, ferry::actors, snapshot_atom, "snapshot")
CAF_ADD_ATOM(ferry, ferry::actors, status_atom, "status")
CAF_ADD_ATOM(ferry, ferry::actors, drain_deadline_atom, "drain_dl")
CAF_ADD_ATOM(ferry, ferry::actors, client_gone_atom, "gone")
CAF_ADD_ATOM(ferry, ferry::actors, subscribe_atom, "subscribe")
CAF_ADD_ATOM(ferry, ferry::actors, telemetry_flush_atom, "tel_flush")
CAF_ADD_ATOM(ferry, ferry::actors, admin_view_atom, "adm_view")
CAF_ADD_ATOM(ferry, ferry::actors, admin_drain_atom, "adm_drain")
CAF_ADD_ATOM(ferry, ferry::actors, memory_plan_atom, "mem_plan")
CAF_ADD_ATOM(ferry, ferry::actors, admin_text_atom, "adm_text")
CAF_ADD_ATOM(ferry, ferry::actors, admin_tick_atom, "adm_tick")
CAF_ADD_ATOM(ferry, ferry::actors, auth_deadline_atom, "auth_dl")

// A step between the stages of one host (it holds a hand-off, which names device memory).
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::actors::StageWork)

namespace ferry::actors {

// What a request's owner receives from the scheduler: RequestStarted (optional), any number of
// TokensGenerated, then exactly one RequestFinished.
using request_sink_actor = caf::typed_actor<caf::reacts_to<RequestStarted>, caf::reacts_to<TokensGenerated>,
                                            caf::reacts_to<RequestFinished>>;

// The HTTP side's per-request actor: a sink that also learns when its client went away.
// It publishes its telemetry to the engine's admin actor (telemetry_flush_atom: its throttle).
using bridge_actor = request_sink_actor::extend<caf::reacts_to<client_gone_atom>, caf::reacts_to<telemetry_flush_atom>>;

// Where telemetry goes: the admin actor (or a test's probe). A stage's report comes with its
// StageStatus, the scheduler's with its EngineSnapshot. Later publishers (expert cache, KV
// residency) add their pair here, e.g. reacts_to<ActorReport, ExpertPoolStatus>.
using telemetry_sink_actor = caf::typed_actor<caf::reacts_to<ActorReport>, caf::reacts_to<ActorReport, EngineSnapshot>,
                                              caf::reacts_to<ActorReport, StageStatus>>;

// Owns one stage; runs one step per message and passes it on (or answers, when last or failed).
using stage_actor = caf::typed_actor<caf::replies_to<step_atom, StageWork>::with<StepOutcome>,
                                     caf::replies_to<status_atom>::with<StageStatus>,
                                     caf::reacts_to<ExpertMoves>,
                                     caf::reacts_to<subscribe_atom, telemetry_sink_actor>,
                                     caf::reacts_to<telemetry_flush_atom>>;

// Owns the expert policy: learns from the tiered stages' reports, answers with swaps.
using expert_cache_actor = caf::typed_actor<caf::reacts_to<ExpertReport>>;

// Admission, slot choice, step planning; forwards tokens to each request's sink.
using scheduler_actor =
    caf::typed_actor<caf::reacts_to<submit_atom, GenerateRequest, request_sink_actor>,
                     caf::reacts_to<CancelRequest>,
                     caf::replies_to<ReleaseSlot>::with<ReleaseResult>,
                     caf::replies_to<DrainRequest>::with<DrainDone>,
                     caf::replies_to<snapshot_atom>::with<EngineSnapshot>,
                     caf::reacts_to<drain_deadline_atom>,
                     caf::replies_to<AdminCancel>::with<CancelResult>,
                     caf::reacts_to<subscribe_atom, telemetry_sink_actor>,
                     caf::reacts_to<telemetry_flush_atom>>;

// The HTTP side's actor per admin console (a WebSocket): the client's text messages, its ticks (the
// delta rate it asked for; the number tells a current tick from one of an earlier rate) and the
// deadline for its first (auth) message.
using admin_client_actor = caf::typed_actor<caf::reacts_to<admin_text_atom, std::string>, caf::reacts_to<client_gone_atom>,
                                            caf::reacts_to<admin_tick_atom, uint64_t>, caf::reacts_to<auth_deadline_atom>>;

// The admin actor (actors/admin_actor.hpp): keeps the live graph from the telemetry it gets and
// answers the admin clients: a view of what changed since a revision, and the commands.
using admin_actor = telemetry_sink_actor::extend<caf::replies_to<admin_view_atom, uint64_t>::with<AdminView>,
                                                 caf::replies_to<AdminCancel>::with<CancelResult>,
                                                 caf::replies_to<ReleaseSlot>::with<ReleaseResult>,
                                                 caf::replies_to<admin_drain_atom>::with<DrainAck>,
                                                 caf::replies_to<SetLogLevel>::with<LogLevelResult>,
                                                 caf::replies_to<memory_plan_atom>::with<MemoryPlan>>;

}  // namespace ferry::actors
