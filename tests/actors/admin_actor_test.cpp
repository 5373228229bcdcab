// The admin actor in the engine graph (scheduler + stage over a scripted backend) on CAF's
// deterministic scheduler: the telemetry it gets without asking, the views it answers, and every
// command it takes.
#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <numeric>

#include "actors/bootstrap.hpp"
#include "tests/actors/engine_events.hpp"
#include "tests/actors/scripted_stage.hpp"

using namespace ferry::actors;
using ferry::testing::EventLog;
using ferry::testing::ScriptedStage;
using ferry::testing::recorder;
using ferry::testing::test_config;

namespace {

const ActorReport* find_actor(const AdminView& v, const std::string& name) {
  for (const auto& a : v.actors) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

class AdminActorTest : public ::testing::Test {
 protected:
  AdminActorTest() : sys(test_config(cfg)), sched(dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler())) {}

  void start(AdminHooks hooks = {}) {
    stage = std::make_shared<ScriptedStage>(2, 128, 1000);
    ferry::config::ServeConfig config;
    config.slots.count = 2;
    config.slots.prefill_chunk = 4;
    engine = spawn_engine(sys, config, ferry::actors::EngineModel{.pipeline = ferry::testing::pipeline_of({stage}).get()}, false, std::move(hooks));
    settle();
  }

  ~AdminActorTest() override {
    for (auto& s : sinks) caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
    stop_engine(engine);
    sched.run();
    spdlog::set_level(spdlog::level::info);
  }

  // Runs everything, the telemetry flushes (timeouts) too, until nothing is left.
  void settle() {
    sched.run();
    for (int i = 0; i < 20 && sched.has_pending_timeout(); ++i) {
      sched.trigger_timeouts();
      sched.run();
    }
  }

  template <class Reply, class... Ts>
  Reply ask(Ts... xs) {
    auto out = std::make_shared<Reply>();
    sys.spawn([this, out, xs...](caf::event_based_actor* self) {
      self->request(engine.admin, caf::infinite, xs...).then([out](Reply& r) { *out = std::move(r); });
    });
    sched.run();
    return *out;
  }

  AdminView view(uint64_t since = 0) { return ask<AdminView>(admin_view_atom_v, since); }

  void submit(RequestId id, uint32_t max_tokens, std::shared_ptr<EventLog> log) {
    auto sink = sys.spawn(recorder, std::move(log));
    sinks.push_back(sink);
    GenerateRequest r;
    r.id = id;
    r.prompt.resize(6);
    std::iota(r.prompt.begin(), r.prompt.end(), 10);
    r.max_tokens = max_tokens;
    caf::anon_send(engine.scheduler, submit_atom_v, std::move(r), sink);
  }

  caf::actor_system_config cfg;
  caf::actor_system sys;
  caf::scheduler::test_coordinator& sched;
  std::shared_ptr<ScriptedStage> stage;
  Engine engine;
  std::vector<request_sink_actor> sinks;
};

}  // namespace

TEST_F(AdminActorTest, KnowsTheGraphFromTelemetryAlone) {
  start();
  const AdminView v = view();
  EXPECT_TRUE(v.full);
  const ActorReport* scheduler = find_actor(v, "scheduler");
  const ActorReport* stage0 = find_actor(v, "stage 0");
  ASSERT_NE(scheduler, nullptr);
  ASSERT_NE(stage0, nullptr);
  ASSERT_NE(find_actor(v, "admin"), nullptr);
  EXPECT_EQ(scheduler->links, std::vector<std::string>{"stage 0"});
  EXPECT_EQ(stage0->links, std::vector<std::string>{"scheduler"});
  EXPECT_EQ(scheduler->doing, "idle");
  EXPECT_TRUE(v.engine_changed);
  EXPECT_EQ(v.engine.slots.size(), 2u);
  ASSERT_EQ(v.stages.size(), 1u);
  EXPECT_EQ(v.stages[0].status.layers, "layer 0");
}

TEST_F(AdminActorTest, ARequestShowsInTheDeltasAndTheStageReportsItsSteps) {
  start();
  const uint64_t seen = view().rev;
  auto log = std::make_shared<EventLog>();
  submit(1, 3, log);
  settle();
  ASSERT_TRUE(std::holds_alternative<RequestFinished>(log->back()));
  const AdminView d = view(seen);
  EXPECT_FALSE(d.full);
  ASSERT_TRUE(d.engine_changed);
  EXPECT_EQ(d.engine.generated_tokens, 3u);
  ASSERT_EQ(d.stages.size(), 1u);
  EXPECT_EQ(d.stages[0].status.steps, stage->steps.size());
  const ActorReport* stage0 = find_actor(d, "stage 0");
  ASSERT_NE(stage0, nullptr);
  EXPECT_EQ(stage0->doing, "idle");  // the last report, after the quiet flush
  // Nothing more happens: no timer is left (idle means asleep), and the next delta holds at most the
  // admin's own node (each ask of this test is a new console).
  EXPECT_FALSE(sched.has_pending_timeout());
  const AdminView quiet = view(view().rev);
  EXPECT_TRUE(quiet.removed.empty() && !quiet.engine_changed && quiet.stages.empty() && quiet.finished.empty());
  for (const auto& a : quiet.actors) EXPECT_EQ(a.name, "admin");
}

TEST_F(AdminActorTest, CancelIsAckedWithWhetherItWasLiveAndIsIdempotent) {
  start();
  auto log = std::make_shared<EventLog>();
  submit(5, 100, log);
  while (log->size() < 2 && sched.try_run_once()) {
  }
  const CancelResult first = ask<CancelResult>(AdminCancel{5});
  EXPECT_TRUE(first.was_live);
  EXPECT_EQ(first.id, 5u);
  settle();
  ASSERT_TRUE(std::holds_alternative<RequestFinished>(log->back()));
  EXPECT_EQ(std::get<RequestFinished>(log->back()).cause, EndCause::admin_cancelled);
  const size_t events = log->size();
  const CancelResult again = ask<CancelResult>(AdminCancel{5});
  EXPECT_FALSE(again.was_live);
  settle();
  EXPECT_EQ(log->size(), events);  // no second terminal event
}

TEST_F(AdminActorTest, ReleaseGoesToTheScheduler) {
  start();
  EXPECT_TRUE(ask<ReleaseResult>(ReleaseSlot{1}).ok);
  const ReleaseResult missing = ask<ReleaseResult>(ReleaseSlot{9});
  EXPECT_FALSE(missing.ok);
  EXPECT_NE(missing.message.find("slot 9 does not exist"), std::string::npos);
}

TEST_F(AdminActorTest, DrainWithoutAHookDrainsTheSchedulerOnce) {
  start();
  const DrainAck first = ask<DrainAck>(admin_drain_atom_v);
  EXPECT_TRUE(first.started);
  const DrainAck again = ask<DrainAck>(admin_drain_atom_v);
  EXPECT_FALSE(again.started);
  EXPECT_EQ(again.message, "already draining");
  settle();
  EXPECT_TRUE(view().engine.draining);
}

TEST_F(AdminActorTest, DrainWithAHookLeavesTheShutdownToIt) {
  auto calls = std::make_shared<int>(0);
  AdminHooks hooks;
  hooks.drain = [calls] { return ++*calls == 1; };
  start(hooks);
  EXPECT_TRUE(ask<DrainAck>(admin_drain_atom_v).started);
  EXPECT_FALSE(ask<DrainAck>(admin_drain_atom_v).started);
  EXPECT_EQ(*calls, 2);
  settle();
  EXPECT_FALSE(view().engine.draining);  // the hook's job (the serve command drains as on SIGTERM)
}

TEST_F(AdminActorTest, SetLogLevelTakesSpdlogNamesOnly) {
  start();
  const LogLevelResult ok = ask<LogLevelResult>(SetLogLevel{"debug"});
  EXPECT_TRUE(ok.ok);
  EXPECT_EQ(ok.previous, "info");
  EXPECT_EQ(spdlog::get_level(), spdlog::level::debug);
  const LogLevelResult bad = ask<LogLevelResult>(SetLogLevel{"loud"});
  EXPECT_FALSE(bad.ok);
  EXPECT_EQ(bad.level, "debug");
  EXPECT_NE(bad.message.find("trace, debug, info"), std::string::npos);
}

TEST_F(AdminActorTest, MemoryPlanNamesEachStageAndLeavesTheTiersToThePlanner) {
  start();
  const MemoryPlan plan = ask<MemoryPlan>(memory_plan_atom_v);
  EXPECT_EQ(plan.slots, 2u);
  ASSERT_EQ(plan.stages.size(), 1u);
  EXPECT_EQ(plan.stages[0].layers, "layer 0");
  EXPECT_EQ(plan.stages[0].slots_bytes_at_ctx, 2 * plan.stages[0].slot_bytes_at_ctx);
  EXPECT_TRUE(plan.tiers.empty());
  EXPECT_FALSE(plan.note.empty());
}

TEST_F(AdminActorTest, AReporterThatDiesWithoutItsLastReportLeavesTheGraph) {
  start();
  auto reporter = sys.spawn([this](caf::event_based_actor* self) {
    ActorReport r;
    r.name = "bridge 77";
    r.kind = ActorKind::bridge;
    self->send(caf::actor_cast<telemetry_sink_actor>(engine.admin), r);
    return caf::behavior{[](int) {}};  // alive until killed
  });
  sched.run();
  EXPECT_NE(find_actor(view(), "bridge 77"), nullptr);
  caf::anon_send_exit(reporter, caf::exit_reason::kill);
  sched.run();
  EXPECT_EQ(find_actor(view(), "bridge 77"), nullptr);
}
