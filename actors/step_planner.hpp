#pragma once
// The scheduler's policy as a plain class (STYLE rule 4): admission into a bounded queue, slot choice
// (longest cached prefix), step planning (one decode row per decoding slot + at most one prefill chunk)
// and applying a step's sampled tokens to the requests. No actors, no I/O, no clocks of its own: the
// caller passes `now`, so tests drive it step by step without threads.
//
// Every request ends with exactly one RequestFinished among the returned events; cancel is idempotent.
#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "actors/engine_metrics.hpp"
#include "actors/messages.hpp"

namespace ferry::actors {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;

struct PlannerLimits {
  uint32_t slots = 3;
  uint32_t ctx = 4096;             // tokens per slot: prompt + completion
  uint32_t prefill_chunk = 4096;   // prompt tokens per step
  uint32_t queue_limit = 64;       // requests waiting for a slot
  uint32_t vocab_size = 0;         // token ids must be below it (0: not checked)
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

  // The next step, or nothing when there is no work or a step is still in flight. Admits queued
  // requests into idle slots first. Events: RequestStarted for each request that got a slot.
  std::optional<StepPlan> plan(TimePoint now, EngineEvents& events);
  // Applies the in-flight step's outcome: tokens to requests, finishes, or a backend failure.
  EngineEvents apply(const StepOutcome& outcome, TimePoint now);

  void start_drain() { draining_ = true; }
  // Ends every live request (queued ones too) with `cause`; used at the drain deadline.
  EngineEvents cancel_all(EndCause cause, TimePoint now);

  bool step_in_flight() const { return !in_flight_.empty() || in_flight_resets_only_; }
  bool idle() const { return live_.empty() && !step_in_flight(); }
  bool draining() const { return draining_; }
  bool failed() const { return failed_; }
  const std::string& failure() const { return failure_; }
  size_t queued() const { return queue_.size(); }
  EngineSnapshot snapshot() const;

 private:
  struct Live {
    GenerateRequest request;
    RequestStatus status = RequestStatus::queued;
    int slot = -1;
    uint32_t prefilled = 0;  // prompt tokens the slot holds (cached ones included)
    uint32_t cached = 0;
    uint64_t admitted_seq = 0;  // order in which requests got a slot: prefill goes first come first
    std::vector<int32_t> generated;
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
  };

  // The terminal event of `live` (frees its slot); end() also forgets the live request.
  RequestFinished finish(Live& live, RequestStatus status, EndCause cause, std::string message,
                         TimePoint now);
  RequestFinished end(RequestId id, RequestStatus status, EndCause cause, std::string message, TimePoint now);
  EngineEvents reject(const GenerateRequest& request, EndCause cause, std::string message, TimePoint now);
  void admit_queued(TimePoint now, EngineEvents& events);
  uint32_t choose_slot(const std::vector<int32_t>& prompt, bool reuse_prefix) const;
  void take_token(Live& live, int32_t token, TimePoint now, EngineEvents& events);
  EngineEvents fail_step(const std::string& error, TimePoint now);

  PlannerLimits limits_;
  std::unordered_map<RequestId, Live> live_;
  std::deque<RequestId> queue_;
  std::vector<Slot> slots_;
  std::vector<uint32_t> pending_resets_;
  std::vector<InFlightRow> in_flight_;
  bool in_flight_resets_only_ = false;
  uint64_t in_flight_step_ = 0;
  uint64_t next_step_ = 1;
  uint64_t next_admitted_seq_ = 1;
  uint64_t use_counter_ = 0;
  bool draining_ = false;
  bool failed_ = false;
  std::string failure_;
  EngineMetrics metrics_;
};

}  // namespace ferry::actors
