// The scheduler's policy without actors or threads: admission, slot choice, step planning, applying
// outcomes, cancel idempotence and exactly one terminal event per request.
#include "actors/step_planner.hpp"

#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <random>
#include <set>

using namespace ferry::actors;

namespace {

TimePoint t0 = Clock::time_point{} + std::chrono::hours(1);

GenerateRequest make_request(RequestId id, size_t prompt_len, uint32_t max_tokens, int32_t first = 1) {
  GenerateRequest r;
  r.id = id;
  r.prompt.resize(prompt_len);
  std::iota(r.prompt.begin(), r.prompt.end(), first);
  r.max_tokens = max_tokens;
  return r;
}

// Answers a plan the way a backend would: the token after a row's last token.
StepOutcome answer(const StepPlan& plan, int32_t add = 1) {
  StepOutcome out;
  out.step = plan.step;
  for (const auto& row : plan.rows) {
    if (row.sample) out.sampled.push_back(SampledToken{row.slot, row.tokens.back() + add});
  }
  return out;
}

std::vector<RequestFinished> finished(const EngineEvents& events) {
  std::vector<RequestFinished> out;
  for (const auto& e : events) {
    if (auto* f = std::get_if<RequestFinished>(&e)) out.push_back(*f);
  }
  return out;
}

std::vector<int32_t> tokens_of(const EngineEvents& events, RequestId id) {
  std::vector<int32_t> out;
  for (const auto& e : events) {
    if (auto* t = std::get_if<TokensGenerated>(&e); t && t->id == id) out.insert(out.end(), t->tokens.begin(), t->tokens.end());
  }
  return out;
}

PlannerLimits limits(uint32_t slots = 3, uint32_t ctx = 256, uint32_t chunk = 8, uint32_t queue = 4) {
  PlannerLimits l;
  l.slots = slots;
  l.ctx = ctx;
  l.prefill_chunk = chunk;
  l.queue_limit = queue;
  l.vocab_size = 1000;
  return l;
}

}  // namespace

TEST(StepPlanner, RejectsWithTheRightCause) {
  StepPlanner p(limits(1, 32, 8, 1));
  auto too_long = finished(p.submit(make_request(1, 30, 3), t0));
  ASSERT_EQ(too_long.size(), 1u);
  EXPECT_EQ(too_long[0].status, RequestStatus::rejected);
  EXPECT_EQ(too_long[0].cause, EndCause::too_long);
  EXPECT_NE(too_long[0].message.find("exceeds the context of 32"), std::string::npos);

  auto bad = make_request(2, 4, 1);
  bad.prompt[2] = 5000;
  auto invalid = finished(p.submit(bad, t0));
  ASSERT_EQ(invalid.size(), 1u);
  EXPECT_EQ(invalid[0].cause, EndCause::invalid_request);
  EXPECT_NE(invalid[0].message.find("prompt token 2 = 5000"), std::string::npos);

  // One slot (idle) and a queue of one: two requests get in, the third finds the queue full.
  EXPECT_TRUE(p.submit(make_request(3, 4, 1), t0).empty());
  EXPECT_TRUE(p.submit(make_request(4, 4, 1), t0).empty());
  auto full = finished(p.submit(make_request(5, 4, 1), t0));
  ASSERT_EQ(full.size(), 1u);
  EXPECT_EQ(full[0].cause, EndCause::queue_full);

  auto dup = finished(p.submit(make_request(3, 4, 1), t0));
  ASSERT_EQ(dup.size(), 1u);
  EXPECT_EQ(dup[0].cause, EndCause::invalid_request);
  EXPECT_EQ(p.queued(), 2u);  // the duplicate did not disturb the original

  p.start_drain();
  auto draining = finished(p.submit(make_request(6, 4, 1), t0));
  ASSERT_EQ(draining.size(), 1u);
  EXPECT_EQ(draining[0].cause, EndCause::draining);
}

TEST(StepPlanner, OnePrefillChunkPerStepAndADecodeRowPerRunningSlot) {
  StepPlanner p(limits(3, 256, 8));
  ASSERT_TRUE(p.submit(make_request(1, 20, 50), t0).empty());
  ASSERT_TRUE(p.submit(make_request(2, 5, 50, 100), t0).empty());
  EngineEvents ev;
  auto plan = p.plan(t0, ev);
  ASSERT_TRUE(plan);
  EXPECT_EQ(ev.size(), 2u);  // both started (two idle slots)
  ASSERT_EQ(plan->rows.size(), 1u);
  EXPECT_EQ(plan->rows[0].tokens.size(), 8u);
  EXPECT_FALSE(plan->rows[0].sample);
  EXPECT_FALSE(p.plan(t0, ev));  // a step is in flight
  p.apply(answer(*plan), t0);

  plan = p.plan(t0, ev);  // request 1 is first come: its chunks go before request 2's prompt
  ASSERT_EQ(plan->rows.size(), 1u);
  EXPECT_EQ(plan->rows[0].start, 8u);
  p.apply(answer(*plan), t0);
  plan = p.plan(t0, ev);
  ASSERT_EQ(plan->rows.size(), 1u);
  EXPECT_EQ(plan->rows[0].tokens.size(), 4u);
  EXPECT_TRUE(plan->rows[0].sample);
  auto events = p.apply(answer(*plan), t0);
  EXPECT_EQ(tokens_of(events, 1), std::vector<int32_t>{21});

  // Now request 1 decodes every step while request 2 prefills beside it.
  plan = p.plan(t0, ev);
  ASSERT_EQ(plan->rows.size(), 2u);
  EXPECT_EQ(plan->rows[0].tokens, std::vector<int32_t>{21});
  EXPECT_EQ(plan->rows[0].start, 20u);
  EXPECT_EQ(plan->rows[1].tokens.size(), 5u);
  events = p.apply(answer(*plan), t0);
  EXPECT_EQ(tokens_of(events, 1), std::vector<int32_t>{22});
  EXPECT_EQ(tokens_of(events, 2), std::vector<int32_t>{105});
  plan = p.plan(t0, ev);
  EXPECT_EQ(plan->rows.size(), 2u);  // two decode rows, no prefill left
  for (const auto& row : plan->rows) EXPECT_EQ(row.tokens.size(), 1u);
}

TEST(StepPlanner, DecodeIsFairAcrossSlots) {
  StepPlanner p(limits(3, 256, 64));
  for (RequestId id = 1; id <= 3; ++id) ASSERT_TRUE(p.submit(make_request(id, 4, 100, 10 * id), t0).empty());
  std::map<RequestId, size_t> counts;
  EngineEvents ev;
  for (int step = 0; step < 60; ++step) {
    auto plan = p.plan(t0, ev);
    ASSERT_TRUE(plan);
    for (const auto& e : p.apply(answer(*plan), t0)) {
      if (auto* t = std::get_if<TokensGenerated>(&e)) counts[t->id] += t->tokens.size();
    }
  }
  // The three prompts take three steps (one chunk per step); after that every step serves everyone.
  EXPECT_EQ(counts[1], 60u);
  EXPECT_EQ(counts[2], 59u);
  EXPECT_EQ(counts[3], 58u);
}

TEST(StepPlanner, StopTokensMinTokensAndLengthLimits) {
  StepPlanner p(limits(2, 16, 16));
  auto stop = make_request(1, 3, 10);  // prompt 1,2,3: draws 4, 5, ...
  stop.stop_token_ids = {5};
  auto min = make_request(2, 3, 10, 11);  // draws 14, 15, 16 ...
  min.stop_token_ids = {14};
  min.min_tokens = 2;
  ASSERT_TRUE(p.submit(stop, t0).empty());
  ASSERT_TRUE(p.submit(min, t0).empty());
  EngineEvents all, ev;
  while (auto plan = p.plan(t0, ev)) {
    auto events = p.apply(answer(*plan), t0);
    all.insert(all.end(), events.begin(), events.end());
  }
  auto done = finished(all);
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].id, 1u);
  EXPECT_EQ(done[0].status, RequestStatus::finished_stop);
  EXPECT_EQ(done[0].usage.completion_tokens, 2u);  // 4, then the stop token 5
  EXPECT_EQ(tokens_of(all, 1), (std::vector<int32_t>{4, 5}));
  // 14 was drawn first but min_tokens 2 kept it going, until max_tokens.
  EXPECT_EQ(done[1].status, RequestStatus::finished_length);
  EXPECT_EQ(done[1].usage.completion_tokens, 10u);
}

TEST(StepPlanner, ContextLimitEndsWithLength) {
  StepPlanner p(limits(1, 8, 8));
  ASSERT_TRUE(p.submit(make_request(1, 5, 3), t0).empty());
  EngineEvents all, ev;
  while (auto plan = p.plan(t0, ev)) {
    for (const auto& row : plan->rows) EXPECT_LT(row.start + row.tokens.size(), 9u);
    auto events = p.apply(answer(*plan), t0);
    all.insert(all.end(), events.begin(), events.end());
  }
  auto done = finished(all);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, RequestStatus::finished_length);
  EXPECT_EQ(done[0].usage.prompt_tokens + done[0].usage.completion_tokens, 8u);
}

TEST(StepPlanner, CancelIsIdempotentAndDropsInFlightResults) {
  StepPlanner p(limits(1, 64, 8, 4));
  ASSERT_TRUE(p.submit(make_request(1, 4, 10), t0).empty());
  ASSERT_TRUE(p.submit(make_request(2, 4, 10), t0).empty());
  EngineEvents ev;
  auto plan = p.plan(t0, ev);
  ASSERT_TRUE(plan);

  auto first = finished(p.cancel(CancelRequest{1, EndCause::client_cancelled}, t0));
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].status, RequestStatus::cancelled);
  EXPECT_TRUE(p.cancel(CancelRequest{1, EndCause::client_cancelled}, t0).empty());  // duplicate
  EXPECT_TRUE(p.cancel(CancelRequest{99, EndCause::admin_cancelled}, t0).empty());   // unknown

  // The in-flight step's token for request 1 arrives after the cancel and is dropped.
  EXPECT_TRUE(p.apply(answer(*plan), t0).empty());
  // Queued request 2 can be cancelled too, and a late cancel after that is still a no-op.
  EXPECT_EQ(finished(p.cancel(CancelRequest{2, EndCause::client_cancelled}, t0)).size(), 1u);
  EXPECT_TRUE(p.cancel(CancelRequest{2, EndCause::client_cancelled}, t0).empty());
  EXPECT_TRUE(p.idle());
  EXPECT_EQ(p.queued(), 0u);
}

TEST(StepPlanner, ReusesTheLongestCachedPrefix) {
  StepPlanner p(limits(2, 256, 64));
  ASSERT_TRUE(p.submit(make_request(1, 6, 3), t0).empty());  // 1..6, draws 7 8 9
  EngineEvents all, ev;
  while (auto plan = p.plan(t0, ev)) {
    auto events = p.apply(answer(*plan), t0);
    all.insert(all.end(), events.begin(), events.end());
  }
  ASSERT_EQ(tokens_of(all, 1), (std::vector<int32_t>{7, 8, 9}));
  // The slot holds 1..8 (9 was drawn but never fed). A prompt extending it reuses 8 tokens.
  auto next = make_request(2, 12, 2);  // 1..12
  ASSERT_TRUE(p.submit(next, t0).empty());
  ev.clear();
  auto plan = p.plan(t0, ev);
  ASSERT_TRUE(plan);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(std::get<RequestStarted>(ev[0]).cached_tokens, 8u);
  EXPECT_TRUE(plan->reset_slots.empty());
  ASSERT_EQ(plan->rows.size(), 1u);
  EXPECT_EQ(plan->rows[0].start, 8u);
  EXPECT_EQ(plan->rows[0].tokens, (std::vector<int32_t>{9, 10, 11, 12}));
  auto done = finished(p.apply(answer(*plan), t0));
  EXPECT_TRUE(done.empty());

  // A different prompt does not match: it takes the empty slot, with no reset needed.
  ASSERT_TRUE(p.submit(make_request(3, 4, 1, 500), t0).empty());
  ev.clear();
  plan = p.plan(t0, ev);
  EXPECT_EQ(std::get<RequestStarted>(ev[0]).cached_tokens, 0u);
  EXPECT_TRUE(plan->reset_slots.empty());
}

TEST(StepPlanner, ReleaseCancelsAndResetsTheSlot) {
  StepPlanner p(limits(2, 64, 64));
  ASSERT_TRUE(p.submit(make_request(1, 4, 10), t0).empty());
  EngineEvents ev;
  auto plan = p.plan(t0, ev);
  p.apply(answer(*plan), t0);
  auto [bad, none] = p.release(7, t0);
  EXPECT_FALSE(bad.ok);
  EXPECT_NE(bad.message.find("slot 7 does not exist"), std::string::npos);
  auto [result, events] = p.release(0, t0);
  EXPECT_TRUE(result.ok);
  EXPECT_EQ(result.cancelled, 1u);
  auto done = finished(events);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].cause, EndCause::admin_cancelled);
  plan = p.plan(t0, ev);  // a plan with only the reset
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->reset_slots, std::vector<uint32_t>{0});
  EXPECT_TRUE(plan->rows.empty());
  EXPECT_TRUE(p.apply(answer(*plan), t0).empty());
  EXPECT_TRUE(p.idle());
  EXPECT_EQ(p.snapshot().slots[0].held_tokens, 0u);
}

TEST(StepPlanner, BackendFailureFailsEveryLiveRequestAndRejectsNewOnes) {
  StepPlanner p(limits(1, 64, 64));
  ASSERT_TRUE(p.submit(make_request(1, 4, 10), t0).empty());
  ASSERT_TRUE(p.submit(make_request(2, 4, 10), t0).empty());
  EngineEvents ev;
  auto plan = p.plan(t0, ev);
  StepOutcome broken;
  broken.step = plan->step;
  broken.error = "device lost";
  broken.code = ferry::ErrorCode::device_lost;
  broken.stage_dead = true;
  auto done = finished(p.apply(broken, t0));
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].id, 1u);
  EXPECT_EQ(done[0].status, RequestStatus::failed);
  EXPECT_NE(done[0].message.find("device lost"), std::string::npos);
  EXPECT_EQ(done[1].status, RequestStatus::rejected);
  EXPECT_TRUE(p.failed());
  auto later = finished(p.submit(make_request(3, 4, 1), t0));
  ASSERT_EQ(later.size(), 1u);
  EXPECT_EQ(later[0].cause, EndCause::backend_failed);
  EXPECT_TRUE(p.idle());
}

TEST(StepPlanner, AStepFailureThatLeavesTheStageAliveEndsOnlyThatStepsRequests) {
  StepPlanner p(limits(1, 64, 64));
  ASSERT_TRUE(p.submit(make_request(1, 4, 10), t0).empty());
  EngineEvents ev;
  auto first = p.plan(t0, ev);
  ASSERT_TRUE(first);
  ASSERT_TRUE(p.submit(make_request(2, 4, 3), t0).empty());
  StepOutcome broken;
  broken.step = first->step;
  broken.error = "out of memory in a workspace";
  broken.code = ferry::ErrorCode::out_of_memory;
  auto done = finished(p.apply(broken, t0));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].id, 1u);
  EXPECT_EQ(done[0].status, RequestStatus::failed);
  EXPECT_FALSE(p.failed());
  // The next request runs, in a slot that starts over (the failed step left the state unknown).
  EngineEvents all;
  bool reset = false;
  while (auto plan = p.plan(t0, ev)) {
    reset = reset || !plan->reset_slots.empty();
    auto events = p.apply(answer(*plan), t0);
    all.insert(all.end(), events.begin(), events.end());
  }
  ASSERT_EQ(finished(all).size(), 1u);
  EXPECT_EQ(finished(all)[0].status, RequestStatus::finished_length);
  EXPECT_TRUE(reset);
  EXPECT_TRUE(p.idle());
}

// Decode of 3 slots with 4 steps in flight: one micro-batch puts all 3 rows in one step (one device:
// its weights are read once for them); 3 micro-batches give each its own step, so that 3 stages on 3
// devices each work on a different slot. A request is never in two steps at once; outcomes may come
// back in any order.
TEST(StepPlanner, StepsInFlightTakeOnlyRequestsInNoOtherStep) {
  for (uint32_t groups : {1u, 3u}) {
    PlannerLimits l = limits(3, 256, 64);
    l.max_in_flight = 4;
    l.micro_batches = groups;
    StepPlanner p(l);
    EngineEvents ev;
    for (RequestId id = 1; id <= 3; ++id) ASSERT_TRUE(p.submit(make_request(id, 4, 20), t0).empty());
    // Prefill, one chunk per step (the planner takes at most one): three steps in flight.
    std::vector<StepPlan> plans;
    while (auto plan = p.plan(t0, ev)) plans.push_back(*plan);
    ASSERT_EQ(plans.size(), 3u);
    EXPECT_FALSE(p.plan(t0, ev));  // every request is in a step
    for (auto it = plans.rbegin(); it != plans.rend(); ++it) p.apply(answer(*it), t0);  // last first
    plans.clear();
    while (auto plan = p.plan(t0, ev)) plans.push_back(*plan);
    ASSERT_EQ(plans.size(), groups) << groups << " micro-batches";
    std::set<uint32_t> slots;
    for (const StepPlan& plan : plans) {
      EXPECT_EQ(plan.rows.size(), 3u / groups);
      for (const auto& row : plan.rows) EXPECT_TRUE(slots.insert(row.slot).second);
    }
    EXPECT_EQ(slots.size(), 3u);
    // One group back: only its slots go again.
    p.apply(answer(plans.back()), t0);
    auto again = p.plan(t0, ev);
    ASSERT_TRUE(again);
    ASSERT_EQ(again->rows.size(), plans.back().rows.size());
    EXPECT_EQ(again->rows[0].slot, plans.back().rows[0].slot);
  }
}

TEST(StepPlanner, ReportsTimingsAndUsage) {
  StepPlanner p(limits(1, 64, 2));
  ASSERT_TRUE(p.submit(make_request(1, 4, 2), t0).empty());
  EngineEvents ev, all;
  TimePoint now = t0 + std::chrono::milliseconds(5);
  while (auto plan = p.plan(now, ev)) {
    now += std::chrono::milliseconds(10);
    auto events = p.apply(answer(*plan), now);
    all.insert(all.end(), events.begin(), events.end());
  }
  auto done = finished(all);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].usage.prompt_tokens, 4u);
  EXPECT_EQ(done[0].usage.completion_tokens, 2u);
  EXPECT_DOUBLE_EQ(done[0].timings.queue_ms, 5);
  EXPECT_DOUBLE_EQ(done[0].timings.prompt_ms, 20);  // two chunks of 2
  EXPECT_DOUBLE_EQ(done[0].timings.predicted_ms, 10);
  EXPECT_DOUBLE_EQ(done[0].timings.ttft_ms, 25);
  auto snap = p.snapshot();
  EXPECT_EQ(snap.steps, 3u);
  EXPECT_EQ(snap.ttft_seconds.count, 1u);
  EXPECT_EQ(snap.itl_seconds.count, 1u);
  EXPECT_EQ(snap.finished_by_status[static_cast<size_t>(RequestStatus::finished_length)], 1u);
}

// Random submits, cancels, releases, failures-free steps: every request gets exactly one terminal
// event, nothing after it, and the planner ends idle.
TEST(StepPlanner, ExactlyOneTerminalEventPerRequestUnderRandomTraffic) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    std::mt19937 rng(seed);
    StepPlanner p(limits(3, 64, 5, 6));
    std::map<RequestId, int> terminal;
    std::map<RequestId, bool> ended;
    RequestId next_id = 1;
    auto record = [&](const EngineEvents& events) {
      for (const auto& e : events) {
        const RequestId id = event_request(e);
        ASSERT_FALSE(ended[id]) << "event after the terminal one for request " << id;
        if (std::holds_alternative<RequestFinished>(e)) {
          ++terminal[id];
          ended[id] = true;
        }
      }
    };
    std::optional<StepPlan> in_flight;
    for (int round = 0; round < 400; ++round) {
      const int action = static_cast<int>(rng() % 10);
      if (action < 3 && next_id < 150) {
        const RequestId id = next_id++;
        terminal[id];
        record(p.submit(make_request(id, 1 + rng() % 40, 1 + rng() % 20), t0));
      } else if (action < 5 && next_id > 1) {
        record(p.cancel(CancelRequest{1 + rng() % (next_id - 1), EndCause::client_cancelled}, t0));
      } else if (action == 5) {
        record(p.release(rng() % 3, t0).second);
      } else if (in_flight) {
        record(p.apply(answer(*in_flight, static_cast<int32_t>(rng() % 7)), t0));
        in_flight.reset();
      } else {
        EngineEvents ev;
        in_flight = p.plan(t0, ev);
        record(ev);
      }
    }
    // Let everything finish.
    for (int i = 0; i < 10000 && !p.idle(); ++i) {
      if (in_flight) {
        record(p.apply(answer(*in_flight), t0));
        in_flight.reset();
      }
      EngineEvents ev;
      in_flight = p.plan(t0, ev);
      record(ev);
    }
    ASSERT_TRUE(p.idle()) << "seed " << seed;
    for (const auto& [id, count] : terminal) EXPECT_EQ(count, 1) << "request " << id << " seed " << seed;
  }
}
