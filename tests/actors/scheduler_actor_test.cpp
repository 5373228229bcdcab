// The engine graph (scheduler + stage over a scripted backend) on CAF's deterministic test scheduler:
// messages are injected, every job runs on the test thread, and the events each request's sink
// receives are checked one by one.
#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <gtest/gtest.h>

#include <memory>
#include <numeric>

#include "actors/bootstrap.hpp"
#include "actors/scheduler_actor.hpp"
#include "actors/stage_actor.hpp"
#include "tests/actors/engine_events.hpp"
#include "tests/actors/scripted_stage.hpp"

using namespace ferry::actors;
using ferry::testing::EventLog;
using ferry::testing::ScriptedStage;
using ferry::testing::recorder;
using ferry::testing::test_config;

namespace {

class SchedulerActorTest : public ::testing::Test {
 protected:
  SchedulerActorTest()
      : sys(test_config(cfg)), sched(dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler())) {}

  // `stages` scripted stages of one layer each; `backend` is the last (it draws the tokens).
  void start(uint32_t slots = 2, uint32_t queue = 4, uint32_t chunk = 4, uint32_t stages = 1,
             std::optional<ferry::config::InjectedFault> fault = std::nullopt) {
    std::vector<std::shared_ptr<ferry::model::Stage>> all;
    for (uint32_t i = 0; i < stages; ++i) {
      pipeline_stages.push_back(std::make_shared<ScriptedStage>(slots, 128, 1000, ferry::model::LayerRange{i, i + 1}, stages));
      all.push_back(pipeline_stages.back());
    }
    backend = pipeline_stages.back();
    ferry::config::ServeConfig config;
    config.slots.count = slots;
    config.slots.queue_limit = queue;
    config.slots.prefill_chunk = chunk;
    config.inject_fault = fault;
    engine = spawn_engine(sys, config, EngineModel{.pipeline = ferry::testing::pipeline_of(all).get()}, false);
    // These tests watch the scheduler's own timeouts: the admin actor and its telemetry (whose flushes
    // are timeouts too) are tested in admin_actor_test.cpp, so it leaves first.
    caf::anon_send_exit(engine.admin, caf::exit_reason::kill);
    sched.run();
    while (sched.has_pending_timeout()) {
      sched.trigger_timeouts();
      sched.run();
    }
  }

  ~SchedulerActorTest() override {
    for (auto& s : sinks) caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
    stop_engine(engine);
    sched.run();
  }

  request_sink_actor sink(std::shared_ptr<EventLog> log) {
    auto s = sys.spawn(recorder, std::move(log));
    sinks.push_back(s);
    return s;
  }

  void submit(RequestId id, size_t prompt_len, uint32_t max_tokens, const request_sink_actor& to) {
    GenerateRequest r;
    r.id = id;
    r.prompt.resize(prompt_len);
    std::iota(r.prompt.begin(), r.prompt.end(), 10);
    r.max_tokens = max_tokens;
    caf::anon_send(engine.scheduler, submit_atom_v, std::move(r), to);
  }

  EngineSnapshot snapshot() {
    auto out = std::make_shared<EngineSnapshot>();
    sys.spawn([this, out](caf::event_based_actor* self) {
      self->request(engine.scheduler, caf::infinite, snapshot_atom_v).then([out](EngineSnapshot& s) { *out = s; });
    });
    sched.run();
    return *out;
  }

  // Runs jobs one at a time until `done` holds (or nothing is left to run).
  template <class Pred>
  void run_until(Pred done) {
    while (!done() && sched.try_run_once()) {
    }
  }

  static size_t count_finished(const EventLog& log) {
    size_t n = 0;
    for (const auto& e : log) n += std::holds_alternative<RequestFinished>(e) ? 1 : 0;
    return n;
  }

  caf::actor_system_config cfg;
  caf::actor_system sys;
  caf::scheduler::test_coordinator& sched;
  std::shared_ptr<ScriptedStage> backend;
  std::vector<std::shared_ptr<ScriptedStage>> pipeline_stages;
  Engine engine;
  std::vector<request_sink_actor> sinks;
};

}  // namespace

TEST_F(SchedulerActorTest, StreamsTokensThenExactlyOneTerminalEvent) {
  start();
  auto log = std::make_shared<EventLog>();
  submit(1, 6, 3, sink(log));
  sched.run();
  ASSERT_EQ(log->size(), 5u);
  EXPECT_EQ(std::get<RequestStarted>((*log)[0]).slot, 0u);
  EXPECT_EQ(std::get<TokensGenerated>((*log)[1]).tokens, std::vector<int32_t>{16});  // prompt 10..15
  EXPECT_EQ(std::get<TokensGenerated>((*log)[2]).tokens, std::vector<int32_t>{17});
  EXPECT_EQ(std::get<TokensGenerated>((*log)[3]).tokens, std::vector<int32_t>{18});
  const auto& done = std::get<RequestFinished>((*log)[4]);
  EXPECT_EQ(done.status, RequestStatus::finished_length);
  EXPECT_EQ(done.usage.prompt_tokens, 6u);
  EXPECT_EQ(done.usage.completion_tokens, 3u);
  // Prefill in chunks of 4 (4 + 2 rows), then two decode steps: four steps in all.
  ASSERT_EQ(backend->steps.size(), 4u);
  EXPECT_EQ(backend->steps[0][0].tokens.size(), 4u);
  EXPECT_EQ(backend->steps[1][0].tokens.size(), 2u);
  EXPECT_FALSE(sched.has_job());  // idle means asleep: nothing scheduled once the work is done
}

TEST_F(SchedulerActorTest, TwoRequestsShareStepsAndBothFinish) {
  start();
  auto a = std::make_shared<EventLog>(), b = std::make_shared<EventLog>();
  submit(1, 3, 5, sink(a));
  submit(2, 3, 5, sink(b));
  sched.run();
  EXPECT_EQ(count_finished(*a), 1u);
  EXPECT_EQ(count_finished(*b), 1u);
  bool shared_step = false;
  for (const auto& rows : backend->steps) shared_step = shared_step || rows.size() == 2;
  EXPECT_TRUE(shared_step);  // continuous batching: one step carried both slots
}

TEST_F(SchedulerActorTest, CancelEndsOnceAndAgainIsANoOp) {
  start();
  auto log = std::make_shared<EventLog>();
  submit(1, 3, 100, sink(log));
  sched.run(12);  // a few steps in
  caf::anon_send(engine.scheduler, CancelRequest{1, EndCause::client_cancelled});
  caf::anon_send(engine.scheduler, CancelRequest{1, EndCause::client_cancelled});
  sched.run();
  ASSERT_EQ(count_finished(*log), 1u);
  const auto& done = std::get<RequestFinished>(log->back());
  EXPECT_EQ(done.status, RequestStatus::cancelled);
  EXPECT_LT(done.usage.completion_tokens, 100u);
  caf::anon_send(engine.scheduler, CancelRequest{1, EndCause::client_cancelled});  // late
  sched.run();
  EXPECT_EQ(count_finished(*log), 1u);
  for (const auto& slot : snapshot().slots) EXPECT_FALSE(slot.busy);
}

TEST_F(SchedulerActorTest, QueueFullIsRejectedAtOnce) {
  start(1, 1);
  auto a = std::make_shared<EventLog>(), b = std::make_shared<EventLog>(), c = std::make_shared<EventLog>();
  submit(1, 3, 50, sink(a));
  run_until([&] { return a->size() >= 2; });  // request 1 has its slot and a token
  submit(2, 3, 5, sink(b));  // waits in the queue
  submit(3, 3, 5, sink(c));  // finds the queue full
  run_until([&] { return !c->empty(); });
  ASSERT_EQ(c->size(), 1u);
  EXPECT_TRUE(b->empty());
  EXPECT_EQ(std::get<RequestFinished>((*c)[0]).cause, EndCause::queue_full);
  sched.run();
  EXPECT_EQ(count_finished(*a), 1u);
  EXPECT_EQ(count_finished(*b), 1u);
}

TEST_F(SchedulerActorTest, ASinkThatDiesFreesItsSlot) {
  start(1);
  auto log = std::make_shared<EventLog>();
  auto s = sink(log);
  submit(1, 3, 100, s);
  sched.run(8);
  caf::anon_send_exit(s, caf::exit_reason::kill);
  sched.run();
  const auto snap = snapshot();
  EXPECT_FALSE(snap.slots[0].busy);
  EXPECT_EQ(snap.finished_by_status[static_cast<size_t>(RequestStatus::cancelled)], 1u);
}

TEST_F(SchedulerActorTest, BackendFailureFailsTheRequestAndLaterOnesWithTheReason) {
  start();
  backend->fail_at_step = 2;
  auto a = std::make_shared<EventLog>(), b = std::make_shared<EventLog>();
  submit(1, 3, 10, sink(a));
  sched.run();
  ASSERT_EQ(count_finished(*a), 1u);
  const auto& done = std::get<RequestFinished>(a->back());
  EXPECT_EQ(done.status, RequestStatus::failed);
  EXPECT_NE(done.message.find("scripted device failure"), std::string::npos);
  submit(2, 3, 10, sink(b));
  sched.run();
  ASSERT_EQ(b->size(), 1u);
  EXPECT_EQ(std::get<RequestFinished>((*b)[0]).cause, EndCause::backend_failed);
  auto status = std::make_shared<StageStatus>();
  sys.spawn([this, status](caf::event_based_actor* self) {
    self->request(engine.stages[0], caf::infinite, status_atom_v).then([status](StageStatus& s) { *status = s; });
  });
  sched.run();
  EXPECT_TRUE(status->failed);
  EXPECT_NE(status->failure.find("scripted device failure"), std::string::npos);
  EXPECT_TRUE(snapshot().failed);
}

TEST_F(SchedulerActorTest, EveryStepGoesThroughEveryStageAndTheLastAnswers) {
  start(2, 4, 4, /*stages=*/3);
  auto a = std::make_shared<EventLog>(), b = std::make_shared<EventLog>();
  submit(1, 6, 3, sink(a));
  submit(2, 3, 4, sink(b));
  sched.run();
  ASSERT_EQ(count_finished(*a), 1u);
  ASSERT_EQ(count_finished(*b), 1u);
  EXPECT_EQ(std::get<RequestFinished>(a->back()).status, RequestStatus::finished_length);
  EXPECT_EQ(std::get<TokensGenerated>((*a)[1]).tokens, std::vector<int32_t>{16});
  for (const auto& s : pipeline_stages) EXPECT_EQ(s->steps, backend->steps);  // same rows, same order
  const EngineSnapshot snap = snapshot();
  ASSERT_EQ(snap.stages.size(), 3u);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(snap.stages[i].index, i);
    EXPECT_EQ(snap.stages[i].steps, backend->steps.size());
    EXPECT_FALSE(snap.stages[i].failed);
  }
}

TEST_F(SchedulerActorTest, AnInjectedDeviceErrorFailsItsRequestsAndNamesTheStage) {
  start(2, 4, 4, 3, ferry::config::InjectedFault{3, 1, ferry::ErrorCode::device_error});
  auto a = std::make_shared<EventLog>(), b = std::make_shared<EventLog>();
  submit(1, 3, 50, sink(a));
  sched.run();
  ASSERT_EQ(count_finished(*a), 1u);
  const auto& done = std::get<RequestFinished>(a->back());
  EXPECT_EQ(done.status, RequestStatus::failed);
  EXPECT_NE(done.message.find("stage 1 (layer 1"), std::string::npos) << done.message;
  EXPECT_NE(done.message.find("injected fault"), std::string::npos) << done.message;
  EXPECT_EQ(pipeline_stages[2]->steps.size(), 2u);  // step 3 never reached the last stage
  const EngineSnapshot snap = snapshot();
  EXPECT_TRUE(snap.failed);
  ASSERT_EQ(snap.stages.size(), 3u);
  EXPECT_TRUE(snap.stages[1].failed);
  EXPECT_FALSE(snap.stages[0].failed);
  submit(2, 3, 5, sink(b));  // nothing more runs: refused with the reason
  sched.run();
  ASSERT_EQ(b->size(), 1u);
  EXPECT_EQ(std::get<RequestFinished>((*b)[0]).cause, EndCause::backend_failed);
}

TEST_F(SchedulerActorTest, AnInjectedPlanErrorFailsOnlyItsStepAndTheEngineServesOn) {
  start(1, 4, 4, 2, ferry::config::InjectedFault{2, 0, ferry::ErrorCode::invalid_plan});
  auto a = std::make_shared<EventLog>(), b = std::make_shared<EventLog>();
  submit(1, 3, 5, sink(a));
  sched.run();
  ASSERT_EQ(count_finished(*a), 1u);
  EXPECT_EQ(std::get<RequestFinished>(a->back()).status, RequestStatus::failed);
  submit(2, 3, 4, sink(b));
  sched.run();
  ASSERT_EQ(count_finished(*b), 1u);
  EXPECT_EQ(std::get<RequestFinished>(b->back()).status, RequestStatus::finished_length);
  EXPECT_FALSE(snapshot().failed);
}

TEST_F(SchedulerActorTest, ReleaseCancelsTheRunningRequestAndResetsTheSlot) {
  start(1);
  auto log = std::make_shared<EventLog>();
  submit(1, 3, 100, sink(log));
  sched.run(8);
  auto result = std::make_shared<ReleaseResult>();
  sys.spawn([this, result](caf::event_based_actor* self) {
    self->request(engine.scheduler, caf::infinite, ReleaseSlot{0}).then([result](ReleaseResult& r) { *result = r; });
  });
  sched.run();
  EXPECT_TRUE(result->ok);
  EXPECT_EQ(result->cancelled, 1u);
  EXPECT_EQ(std::get<RequestFinished>(log->back()).cause, EndCause::admin_cancelled);
  ASSERT_FALSE(backend->resets.empty());
  EXPECT_EQ(backend->resets.back(), 0u);
  EXPECT_EQ(snapshot().slots[0].held_tokens, 0u);
}

TEST_F(SchedulerActorTest, DrainRefusesNewWorkAndCancelsAtTheDeadline) {
  start(1);
  auto a = std::make_shared<EventLog>(), b = std::make_shared<EventLog>();
  submit(1, 3, 100, sink(a));
  sched.run(8);
  auto done = std::make_shared<std::optional<DrainDone>>();
  sys.spawn([this, done](caf::event_based_actor* self) {
    self->request(engine.scheduler, caf::infinite, DrainRequest{5000}).then([done](DrainDone& d) { *done = d; });
  });
  run_until([&] { return sched.has_pending_timeout(); });  // the scheduler took the drain request
  submit(2, 3, 5, sink(b));
  run_until([&] { return !b->empty(); });
  ASSERT_EQ(b->size(), 1u);
  EXPECT_EQ(std::get<RequestFinished>((*b)[0]).cause, EndCause::draining);
  EXPECT_FALSE(done->has_value());
  sched.trigger_timeouts();  // the drain deadline
  sched.run();
  ASSERT_TRUE(done->has_value());
  EXPECT_EQ((*done)->cancelled, 1u);
  EXPECT_EQ(std::get<RequestFinished>(a->back()).cause, EndCause::drain_deadline);
  EXPECT_EQ(count_finished(*a), 1u);
}

TEST_F(SchedulerActorTest, DrainOfAnIdleEngineAnswersAtOnce) {
  start();
  auto done = std::make_shared<std::optional<DrainDone>>();
  sys.spawn([this, done](caf::event_based_actor* self) {
    self->request(engine.scheduler, caf::infinite, DrainRequest{60000}).then([done](DrainDone& d) { *done = d; });
  });
  sched.run();
  ASSERT_TRUE(done->has_value());
  EXPECT_EQ((*done)->finished + (*done)->cancelled, 0u);
}
