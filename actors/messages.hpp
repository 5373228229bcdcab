#pragma once
// Every message type of the engine, in one place (STYLE rule 2). The structs are plain data with CAF
// 0.17 `inspect` overloads (so they may cross a host later), except StageWork, which carries a stage's
// hand-off and stays on its host; this header includes no CAF so that the
// policy classes (step planner, lifecycle) can use the same types without the actor runtime. The atoms
// that tag messages and the typed actor interfaces are in actors/protocol.hpp.
//
// The engine speaks token ids only (STYLE rule 8): text, templates, stop strings and the output
// parser live in the HTTP bridge.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "actors/request_lifecycle.hpp"
#include "config/expected.hpp"
#include "model/stage.hpp"

namespace ferry::model {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SamplingParams& x) {
  return f(x.temperature, x.top_k, x.top_p, x.min_p, x.seed);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SlotRows& x) {
  return f(x.slot, x.start, x.tokens, x.logits_all, x.sample, x.sampling, x.verify, x.draft);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ExpertId& x) {
  return f(x.layer, x.expert);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ExpertMove& x) {
  return f(x.promote, x.promote_host, x.evict, x.evict_host, x.copy_evicted);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RouteCounts& x) {
  return f(x.layers, x.experts, x.counts);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ExpertTierCounters& x) {
  return f(x.routes, x.hits, x.misses_mapped, x.misses_uploaded, x.bytes_mapped, x.bytes_uploaded, x.promotions,
           x.evictions, x.pool_slots, x.pool_used, x.swaps_in_flight);
}

}  // namespace ferry::model

namespace ferry::actors {

using RequestId = uint64_t;

// ---- bridge -> scheduler ----------------------------------------------------------------------

// A request as the engine sees it: token ids, sampling, and when to stop.
struct GenerateRequest {
  RequestId id = 0;
  std::vector<int32_t> prompt;
  model::SamplingParams sampling;
  std::vector<int32_t> stop_token_ids;  // drawing one ends the request (finish_reason "stop")
  uint32_t max_tokens = 0;              // completion tokens at most (the terminal one included)
  uint32_t min_tokens = 0;              // stop tokens are ignored before this many
  bool reuse_prefix = true;             // may continue a slot's cached prefix
};

// Idempotent: cancelling an unknown or ended request does nothing (STYLE rule 9).
struct CancelRequest {
  RequestId id = 0;
  EndCause cause = EndCause::client_cancelled;
};

// ---- admin -> scheduler -----------------------------------------------------------------------

// Frees a slot's state (its cached prefix); a request running in it is cancelled first.
struct ReleaseSlot {
  uint32_t slot = 0;
};

struct ReleaseResult {
  bool ok = false;
  RequestId cancelled = 0;  // the request that was running in the slot, 0 when it was idle
  std::string message;      // why not, when !ok
};

// Shutdown: refuse new requests, let live ones run for `timeout_ms`, then cancel the rest. The
// reply comes when every slot is idle and no step is in flight.
struct DrainRequest {
  double timeout_ms = 0;
};

struct DrainDone {
  uint32_t finished = 0;   // requests that ended normally while draining
  uint32_t cancelled = 0;  // requests cancelled at the deadline
};

// ---- scheduler -> bridge (the request's sink) -------------------------------------------------

// The request left the queue and got a slot; `cached_tokens` of its prompt were already computed.
struct RequestStarted {
  RequestId id = 0;
  uint32_t slot = 0;
  uint32_t cached_tokens = 0;
};

// Tokens drawn for the request in one step (one per step today; more with MTP drafts).
struct TokensGenerated {
  RequestId id = 0;
  std::vector<int32_t> tokens;
};

struct RequestUsage {
  uint32_t prompt_tokens = 0;
  uint32_t cached_tokens = 0;      // prompt tokens reused from the slot's previous sequence
  uint32_t completion_tokens = 0;  // tokens drawn, a final stop token included
};

struct RequestTimings {
  double queue_ms = 0;      // submitted -> got a slot
  double prompt_ms = 0;     // got a slot -> first token (prefill of the uncached prompt)
  double predicted_ms = 0;  // first token -> last token
  double ttft_ms = 0;       // submitted -> first token
  uint32_t draft_n = 0;           // MTP drafts verified (llama.cpp's names)
  uint32_t draft_n_accepted = 0;  // of them, accepted
};

// The terminal event: every request gets exactly one, after its last TokensGenerated.
struct RequestFinished {
  RequestId id = 0;
  RequestStatus status = RequestStatus::rejected;
  EndCause cause = EndCause::none;
  std::string message;  // for rejected / failed / cancelled: what happened, for the client
  RequestUsage usage;
  RequestTimings timings;
};

// ---- scheduler <-> stages ----------------------------------------------------------------------

// A prefix-cache checkpoint (kv::PrefixCache's id) and the slot it is saved from or restored into.
struct CheckpointOp {
  uint64_t id = 0;
  uint32_t slot = 0;
  uint32_t tokens = 0;  // a save: the positions the slot must hold (its state is not kept otherwise)
};

// A slot's rows copied to host RAM once for the checkpoints of its that still rely on them, before
// the slot is given to another sequence.
struct CheckpointSpill {
  uint32_t slot = 0;
  std::vector<uint64_t> ids;
};

// One step, on every stage in this order: checkpoints to drop, slots to save as checkpoints (their
// state after the earlier steps, without rows), rows to spill, slots to forget, checkpoints to
// restore into slots, then every slot's rows through the model's stages.
struct StepPlan {
  uint64_t step = 0;
  std::vector<uint64_t> drop_checkpoints;
  std::vector<CheckpointOp> save_checkpoints;
  std::vector<CheckpointSpill> spill_checkpoints;
  std::vector<uint32_t> reset_slots;
  std::vector<CheckpointOp> restore_checkpoints;
  std::vector<model::SlotRows> rows;
};

// A stage's resident KV window (model::StageCounters has the meaning of each): all zero where every
// row stays on the stage's device.
struct KvWindowStatus {
  uint64_t window_rows = 0, resident_rows = 0, windowed_steps = 0, hits = 0, fetched_rows = 0, fetched_bytes = 0;
  uint64_t last_fetched_rows = 0, last_fetched_bytes = 0;
  std::vector<uint64_t> host_slot_bytes;  // per slot (empty: no host tier)
  bool operator==(const KvWindowStatus&) const = default;
};

// What a stage publishes with every step it passes on: who it is and what it has done.
struct StageStatus {
  uint32_t index = 0;
  std::string layers;    // "layers 0-10"
  std::string backend;   // Stage::describe()
  bool failed = false;
  std::string failure;   // the error that ended the stage, when failed
  uint64_t steps = 0;
  uint64_t rows = 0;
  uint64_t handoff_bytes = 0;
  double handoff_ms = 0;
  double compute_ms = 0;
  bool tiered = false;                  // the stage keeps a pool of routed experts
  model::ExpertTierCounters experts;    // when tiered
  KvWindowStatus kv;
  bool operator==(const StageStatus&) const = default;
};

// ---- stages <-> expert cache ---------------------------------------------------------------------

// A tiered stage's routes since its last report, and the swaps it finished (after every step).
struct ExpertReport {
  uint32_t stage = 0;  // in the pipeline
  model::RouteCounts routes;
  std::vector<model::ExpertMove> finished;
};

// Swaps for a stage to start; they finish over its next steps.
struct ExpertMoves {
  std::vector<model::ExpertMove> moves;
};

// A step on its way down the pipeline: the plan, the previous stage's output, and the statuses of
// the stages it passed. Local only: it holds the hand-off, which names device memory of this host.
struct StageWork {
  std::shared_ptr<const StepPlan> plan;
  std::shared_ptr<const model::Handoff> handoff;  // null into stage 0
  std::vector<StageStatus> stages;
  std::vector<uint64_t> unsaved;  // checkpoints a stage it passed could not save
};

struct SampledToken {
  uint32_t slot = 0;
  int32_t token = -1;
  uint32_t accepted = 0;        // of the row set's drafts to verify (SlotResult)
  std::vector<int32_t> drafts{};  // the MTP block's drafts after `token`
};

struct StepOutcome {
  uint64_t step = 0;
  std::vector<SampledToken> sampled;  // one per row that asked to sample, in row order
  std::string error;                  // non-empty: a stage failed this step; `sampled` is empty
  ErrorCode code = ErrorCode::internal;
  bool stage_dead = false;            // the error ended the stage: nothing more can run
  std::vector<StageStatus> stages;    // of the stages the step reached
  std::vector<uint64_t> unsaved_checkpoints;  // saves some stage could not make: not taken
};

// ---- snapshots for /health, /slots, /metrics --------------------------------------------------

struct SlotSnapshot {
  uint32_t index = 0;
  bool busy = false;
  RequestStatus status = RequestStatus::queued;  // meaningful when busy
  RequestId request = 0;
  uint32_t prompt_tokens = 0;
  uint32_t prefilled_tokens = 0;  // prompt tokens computed so far (cached ones included)
  uint32_t cached_tokens = 0;
  uint32_t generated_tokens = 0;
  uint32_t held_tokens = 0;       // tokens whose state the slot holds (a cached prefix when idle)
  double decode_ms = 0;           // its first token to its last so far (decode speed: generated - 1 over it)
  bool operator==(const SlotSnapshot&) const = default;
};

// Cumulative Prometheus-style histogram: counts[i] = observations <= bounds[i]; the last count
// (one more than bounds) is +Inf.
struct HistogramSnapshot {
  std::vector<double> bounds;
  std::vector<uint64_t> counts;
  double sum = 0;
  uint64_t count = 0;
  bool operator==(const HistogramSnapshot&) const = default;
};

struct EngineSnapshot {
  std::vector<SlotSnapshot> slots;
  std::vector<StageStatus> stages;  // as each last reported
  uint32_t queued = 0;
  std::vector<RequestId> queued_requests;  // in queue order
  uint32_t queue_limit = 0;
  bool draining = false;
  bool failed = false;
  std::string failure;
  uint64_t steps = 0;
  uint64_t prompt_tokens = 0;      // computed (uncached) prompt tokens
  uint64_t cached_tokens = 0;
  uint64_t generated_tokens = 0;
  uint64_t draft_tokens = 0;     // MTP drafts verified
  uint64_t accepted_tokens = 0;  // of them, accepted
  std::vector<uint64_t> finished_by_status;  // indexed by RequestStatus
  HistogramSnapshot step_seconds;
  HistogramSnapshot ttft_seconds;
  HistogramSnapshot itl_seconds;
  HistogramSnapshot queue_seconds;
  bool operator==(const EngineSnapshot&) const = default;
};

// ---- telemetry: every actor -> the admin actor ----------------------------------------------------

// The kinds of actor in the graph. The expert-cache and KV-residency actors (issues 11 and 12) publish
// ActorReports of their own kind once they exist: their figures (pool bytes, hits, misses, window
// rows) go in `counters`, which the admin page shows for any actor; a typed record of theirs, if one
// is wanted, rides beside the report as StageStatus does for a stage (admin_actor in protocol.hpp).
enum class ActorKind : uint8_t { scheduler, stage, bridge, admin, expert_cache, kv_residency };

// One figure an actor reports: a snake_case name with its unit where it has one ("compute_ms").
struct Counter {
  std::string name;
  double value = 0;
  bool operator==(const Counter&) const = default;
};

// What an actor publishes about itself. Publishers throttle (actors/telemetry.hpp): at most one report
// per interval while they work, and one more when they go quiet; the admin actor keeps the last of
// each and never asks for one.
struct ActorReport {
  std::string name;                // unique in the graph: "scheduler", "stage 0", "bridge 42"
  ActorKind kind = ActorKind::scheduler;
  std::vector<std::string> links;  // names of the actors it sends work to
  uint64_t mailbox = 0;            // messages waiting in its mailbox when it reported
  std::string doing;               // "idle", "2 steps in flight: 3 decoding", "streaming (slot 1)"
  std::vector<Counter> counters;
  RequestId request = 0;           // a bridge: its request
  bool ended = false;              // the actor is quitting: its last report
  bool operator==(const ActorReport&) const = default;
};

// ---- admin clients <-> the admin actor ---------------------------------------------------------

// A stage as the admin shows it: its last status and the mean time of its recent steps.
struct StageView {
  StageStatus status;
  double step_ms = 0;  // (compute + hand-off) ms per step between its last two reports that ran steps
};

struct ThroughputSample {
  double generated_per_s = 0;  // tokens drawn per second over the last second
  double prompt_per_s = 0;     // prompt tokens computed (cache hits excluded) per second, same window
  bool operator==(const ThroughputSample&) const = default;
};

// The graph as a client last saw it, brought up to date: everything that changed after revision
// `since` (full: everything, when since is 0 or too old for the removals kept).
struct AdminView {
  uint64_t rev = 0;
  uint64_t since = 0;
  bool full = false;
  std::vector<ActorReport> actors;     // added or changed
  std::vector<std::string> removed;    // actors gone
  bool engine_changed = false;
  EngineSnapshot engine;               // slots, queue, totals; meaningful when engine_changed
  std::vector<StageView> stages;       // changed
  std::vector<ActorReport> finished;   // requests' bridges that ended (their last reports), oldest first
  ThroughputSample throughput;         // now
  bool empty() const { return actors.empty() && removed.empty() && !engine_changed && stages.empty() && finished.empty(); }
};

// Cancel a request and say whether it was live (the request's sink hears RequestFinished as usual).
struct AdminCancel {
  RequestId id = 0;
};

struct CancelResult {
  RequestId id = 0;
  bool was_live = false;   // false: unknown or already ended, nothing done (idempotent)
  RequestStatus status = RequestStatus::queued;  // what it was doing, when live
};

struct SetLogLevel {
  std::string level;  // trace, debug, info, warn, error, critical, off
};

struct LogLevelResult {
  bool ok = false;
  std::string previous;
  std::string level;
  std::string message;  // why not, when !ok
};

struct DrainAck {
  bool started = false;  // false: a drain was already under way (idempotent)
  std::string message;
};

// What the engine knows of its memory today. The planner of issue 11 / 12 (expert pools, host expert
// store, KV tiers, the RAM guard) fills `tiers` and the weights; until then each stage's per-slot
// state is what is known. actors/memory_plan.hpp makes it.
struct StageMemory {
  uint32_t index = 0;
  std::string layers;
  std::string backend;                  // device and threads, as the stage describes itself
  uint64_t slot_fixed_bytes = 0;        // per slot whatever its length: KDA conv and recurrent state (f32)
  uint64_t slot_bytes_per_token = 0;    // per slot and token: DSA latent, indexer rows, pool keys (f32)
  uint64_t slot_bytes_at_ctx = 0;       // one slot at the full context
  uint64_t slots_bytes_at_ctx = 0;      // every slot at the full context
};

struct MemoryTier {
  std::string name;     // "gpu0 expert pool", "host expert store", "kv host"
  uint64_t budget_bytes = 0;
  uint64_t used_bytes = 0;
};

struct MemoryPlan {
  uint32_t slots = 0;
  uint32_t ctx = 0;
  std::vector<StageMemory> stages;
  std::vector<MemoryTier> tiers;  // empty until the memory planner reports
  std::string note;
};

// ---- inspect (CAF 0.17 style) --------------------------------------------------------------------

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, GenerateRequest& x) {
  return f(x.id, x.prompt, x.sampling, x.stop_token_ids, x.max_tokens, x.min_tokens, x.reuse_prefix);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, CancelRequest& x) {
  return f(x.id, x.cause);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ReleaseSlot& x) {
  return f(x.slot);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ReleaseResult& x) {
  return f(x.ok, x.cancelled, x.message);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, DrainRequest& x) {
  return f(x.timeout_ms);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, DrainDone& x) {
  return f(x.finished, x.cancelled);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RequestStarted& x) {
  return f(x.id, x.slot, x.cached_tokens);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, TokensGenerated& x) {
  return f(x.id, x.tokens);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RequestUsage& x) {
  return f(x.prompt_tokens, x.cached_tokens, x.completion_tokens);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RequestTimings& x) {
  return f(x.queue_ms, x.prompt_ms, x.predicted_ms, x.ttft_ms, x.draft_n, x.draft_n_accepted);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RequestFinished& x) {
  return f(x.id, x.status, x.cause, x.message, x.usage, x.timings);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, CheckpointOp& x) {
  return f(x.id, x.slot);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, CheckpointSpill& x) {
  return f(x.slot, x.ids);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StepPlan& x) {
  return f(x.step, x.drop_checkpoints, x.save_checkpoints, x.spill_checkpoints, x.reset_slots, x.restore_checkpoints,
           x.rows);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SampledToken& x) {
  return f(x.slot, x.token, x.accepted, x.drafts);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, KvWindowStatus& x) {
  return f(x.window_rows, x.resident_rows, x.windowed_steps, x.hits, x.fetched_rows, x.fetched_bytes,
           x.last_fetched_rows, x.last_fetched_bytes, x.host_slot_bytes);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StageStatus& x) {
  return f(x.index, x.layers, x.backend, x.failed, x.failure, x.steps, x.rows, x.handoff_bytes, x.handoff_ms,
           x.compute_ms, x.tiered, x.experts, x.kv);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ExpertReport& x) {
  return f(x.stage, x.routes, x.finished);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ExpertMoves& x) {
  return f(x.moves);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StepOutcome& x) {
  return f(x.step, x.sampled, x.error, x.code, x.stage_dead, x.stages, x.unsaved_checkpoints);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SlotSnapshot& x) {
  return f(x.index, x.busy, x.status, x.request, x.prompt_tokens, x.prefilled_tokens, x.cached_tokens,
           x.generated_tokens, x.held_tokens, x.decode_ms);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, HistogramSnapshot& x) {
  return f(x.bounds, x.counts, x.sum, x.count);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, EngineSnapshot& x) {
  return f(x.slots, x.stages, x.queued, x.queued_requests, x.queue_limit, x.draining, x.failed, x.failure, x.steps, x.prompt_tokens,
           x.cached_tokens, x.generated_tokens, x.draft_tokens, x.accepted_tokens, x.finished_by_status, x.step_seconds, x.ttft_seconds,
           x.itl_seconds, x.queue_seconds);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Counter& x) {
  return f(x.name, x.value);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ActorReport& x) {
  return f(x.name, x.kind, x.links, x.mailbox, x.doing, x.counters, x.request, x.ended);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StageView& x) {
  return f(x.status, x.step_ms);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ThroughputSample& x) {
  return f(x.generated_per_s, x.prompt_per_s);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, AdminView& x) {
  return f(x.rev, x.since, x.full, x.actors, x.removed, x.engine_changed, x.engine, x.stages, x.finished, x.throughput);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, AdminCancel& x) {
  return f(x.id);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, CancelResult& x) {
  return f(x.id, x.was_live, x.status);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SetLogLevel& x) {
  return f(x.level);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, LogLevelResult& x) {
  return f(x.ok, x.previous, x.level, x.message);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, DrainAck& x) {
  return f(x.started, x.message);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StageMemory& x) {
  return f(x.index, x.layers, x.backend, x.slot_fixed_bytes, x.slot_bytes_per_token, x.slot_bytes_at_ctx,
           x.slots_bytes_at_ctx);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, MemoryTier& x) {
  return f(x.name, x.budget_bytes, x.used_bytes);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, MemoryPlan& x) {
  return f(x.slots, x.ctx, x.stages, x.tiers, x.note);
}

}  // namespace ferry::actors
