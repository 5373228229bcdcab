#pragma once
// The scheduler's policy as a plain class (STYLE rule 4): admission into a bounded queue, slot choice
// (longest cached prefix), step planning (decode rows of the decoding slots + at most one prefill
// chunk) and applying a step's sampled tokens to the requests. No actors, no I/O, no clocks of its own:
// the caller passes `now`, so tests drive it step by step without threads.
//
// Several steps may be in flight at once, up to one per pipeline stage (as vLLM's batch queue): each
// step takes only requests that are in no other step in flight, and the decoding slots are split into
// `micro_batches` groups, so that with 3 slots over 3 devices each step carries one slot and every
// stage works on a different one. With one device one group is best: a step reads its weights once
// for all its rows.
//
// Every request ends with exactly one RequestFinished among the returned events; cancel is idempotent.
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "actors/checkpoint_planner.hpp"
#include "actors/engine_metrics.hpp"
#include "actors/messages.hpp"
#include "actors/spec_policy.hpp"
#include "model/speculative.hpp"

namespace ferry::actors {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;

struct PlannerLimits {
  uint32_t slots = 3;
  uint32_t ctx = 4096;             // tokens per slot: prompt + completion
  uint32_t prefill_chunk = 4096;   // prompt tokens per step
  uint32_t queue_limit = 64;       // requests waiting for a slot
  uint32_t vocab_size = 0;         // token ids must be below it (0: not checked)
  uint32_t max_in_flight = 1;      // steps in flight at once (the pipeline's stages)
  uint32_t micro_batches = 1;      // groups the decoding slots are split into, one group per step
  MtpSetting mtp;                  // speculative decoding with the MTP block's drafts
  CheckpointLimits checkpoints;    // the prefix cache's checkpoints (budget 0: none)
};

// An event for one request's sink (its HTTP bridge), in the order they must be delivered.
using EngineEvent = std::variant<RequestStarted, TokensGenerated, RequestFinished>;
using EngineEvents = std::vector<EngineEvent>;

RequestId event_request(const EngineEvent& e);

class StepPlanner {
 public:
  explicit StepPlanner(PlannerLimits limits);

  // Queues the request, or rejects it (the RequestFinished is returned) when the queue is full, the
  // server drains, the backend failed, or it cannot fit the context.
  EngineEvents submit(GenerateRequest request, TimePoint now);
  // Ends a live request as cancelled; a request that is unknown or already ended is left alone.
  EngineEvents cancel(const CancelRequest& cancel, TimePoint now);
  // Cancels what runs in the slot and forgets its state (the backend reset rides on the next plan).
  std::pair<ReleaseResult, EngineEvents> release(uint32_t slot, TimePoint now);

  // The next step, or nothing when there is no work for one or max_in_flight steps are in flight.
  // Admits queued requests into idle slots first. Events: RequestStarted for each request that got
  // a slot. Call again until it returns nothing: several steps may go out at once.
  std::optional<StepPlan> plan(TimePoint now, EngineEvents& events);
  // Applies an in-flight step's outcome (in any order): tokens to requests, finishes, or a failure:
  // one that ended a stage ends every request (nothing can run any more), another only the step's.
  EngineEvents apply(const StepOutcome& outcome, TimePoint now);

  void start_drain() { draining_ = true; }
  // Ends every live request (queued ones too) with `cause`; used at the drain deadline.
  EngineEvents cancel_all(EndCause cause, TimePoint now);

  bool step_in_flight() const { return !in_flight_.empty(); }
  size_t steps_in_flight() const { return in_flight_.size(); }
  bool idle() const { return live_.empty() && !step_in_flight(); }
  bool draining() const { return draining_; }
  bool failed() const { return failed_; }
  const std::string& failure() const { return failure_; }
  const kv::PrefixCache& prefix_cache() const { return checkpoints_.cache(); }
  size_t queued() const { return queue_.size(); }
  // A live request's status; nothing for one that is unknown or has ended.
  std::optional<RequestStatus> status(RequestId id) const;
  EngineSnapshot snapshot() const;

 private:
  struct Live {
    GenerateRequest request;
    RequestStatus status = RequestStatus::queued;
    int slot = -1;
    uint32_t prefilled = 0;  // prompt tokens the slot holds (cached ones included)
    uint32_t cached = 0;
    uint64_t admitted_seq = 0;  // order in which requests got a slot: prefill goes first come first
    uint64_t last_step = 0;     // the last step that carried its rows (decode groups take turns)
    bool in_flight = false;     // its rows are in a step not yet applied
    std::vector<int32_t> generated;
    std::optional<model::SpecDecoder> spec;  // decoding with drafts (from the prompt's last chunk on)
    TimePoint submitted, started, first_token, last_token;
  };
  struct Slot {
    std::vector<int32_t> held;  // tokens whose state the backend holds for this slot
    bool needs_reset = false;   // state unknown or released: reset before reuse
    RequestId request = 0;      // 0: idle
    uint64_t last_used = 0;
  };
  struct InFlightRow {
    uint32_t slot;
    RequestId request;
    uint32_t prompt_tokens;  // >0: a prefill chunk of this many prompt tokens; 0: a decode row
    bool sample;
    std::optional<model::SlotRows> spec;  // a speculative decode row set as sent
  };
  struct InFlightStep {
    std::vector<InFlightRow> rows;
    TimePoint planned;
    bool alone = false;  // no other step in flight when planned: plan to outcome is its own time
  };

  // The terminal event of `live` (frees its slot); end() also forgets the live request.
  RequestFinished finish(Live& live, RequestStatus status, EndCause cause, std::string message,
                         TimePoint now);
  RequestFinished end(RequestId id, RequestStatus status, EndCause cause, std::string message, TimePoint now);
  EngineEvents reject(const GenerateRequest& request, EndCause cause, std::string message, TimePoint now);
  void admit_queued(TimePoint now, EngineEvents& events);
  uint32_t choose_slot(const std::vector<int32_t>& prompt, bool reuse_prefix) const;
  void take_token(Live& live, int32_t token, TimePoint now, EngineEvents& events);
  // A speculative row set's result: its confirmed tokens, in order, until the request ends.
  void take_spec(Live& live, const InFlightRow& row, const SampledToken& result, TimePoint now, EngineEvents& events);
  // A step that failed: its requests end with the error; one that ended a stage ends all of them.
  EngineEvents fail_step(uint64_t step, const std::vector<InFlightRow>& rows, const std::string& error, bool fatal,
                         TimePoint now);
  // A checkpoint of a reusable prompt longer than what the chosen slot holds: restored into a slot.
  uint32_t restore_checkpoint(Live& live, uint32_t chosen);
  void mark_landed(const std::vector<InFlightRow>& rows);
  void record_cost(const InFlightStep& step, TimePoint now);
  // The step costs --mtp auto weighs drafts by; none where micro-batched steps overlap (no step
  // runs alone to be timed).
  const StepCosts* measured_costs() const { return limits_.micro_batches > 1 ? nullptr : &costs_; }

  PlannerLimits limits_;
  std::unordered_map<RequestId, Live> live_;
  std::deque<RequestId> queue_;
  std::vector<Slot> slots_;
  std::vector<uint32_t> pending_resets_;
  std::map<uint64_t, InFlightStep> in_flight_;
  uint64_t next_step_ = 1;
  uint64_t next_admitted_seq_ = 1;
  uint64_t use_counter_ = 0;
  bool draining_ = false;
  bool failed_ = false;
  std::string failure_;
  EngineMetrics metrics_;
  CheckpointPlanner checkpoints_;
  StepCosts costs_;  // decode steps' times by rows, for --mtp auto
};

}  // namespace ferry::actors
