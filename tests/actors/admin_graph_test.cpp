// The admin's model of the graph, without actors: revisions, deltas, removals, finished requests,
// step times and throughput.
#include <gtest/gtest.h>

#include "actors/admin_graph.hpp"

using namespace ferry::actors;
using namespace std::chrono_literals;

namespace {

ActorReport report(std::string name, ActorKind kind, std::string doing = "idle") {
  ActorReport r;
  r.name = std::move(name);
  r.kind = kind;
  r.doing = std::move(doing);
  return r;
}

const AdminGraph::Clock::time_point t0 = AdminGraph::Clock::time_point{} + 100s;

}  // namespace

TEST(AdminGraph, FullViewThenOnlyWhatChanged) {
  AdminGraph g;
  g.note(report("scheduler", ActorKind::scheduler), t0);
  StageStatus s0;
  s0.index = 0;
  g.note(report("stage 0", ActorKind::stage), s0, t0);
  const AdminView full = g.view(0, t0);
  EXPECT_TRUE(full.full);
  EXPECT_EQ(full.actors.size(), 2u);
  EXPECT_EQ(full.stages.size(), 1u);
  // The same report again changes nothing: no revision, an empty delta.
  g.note(report("scheduler", ActorKind::scheduler), t0);
  EXPECT_EQ(g.revision(), full.rev);
  EXPECT_TRUE(g.view(full.rev, t0).empty());
  g.note(report("scheduler", ActorKind::scheduler, "1 step in flight"), t0);
  const AdminView delta = g.view(full.rev, t0);
  EXPECT_FALSE(delta.full);
  EXPECT_EQ(delta.since, full.rev);
  ASSERT_EQ(delta.actors.size(), 1u);
  EXPECT_EQ(delta.actors[0].doing, "1 step in flight");
  EXPECT_TRUE(delta.stages.empty());
}

TEST(AdminGraph, AnEndedBridgeIsRemovedAndListedAsFinished) {
  AdminGraph g;
  ActorReport b = report("bridge 7", ActorKind::bridge, "streaming in slot 0");
  b.request = 7;
  g.note(b, t0);
  const uint64_t seen = g.revision();
  b.ended = true;
  b.doing = "finished: stop";
  g.note(b, t0);
  EXPECT_FALSE(g.has("bridge 7"));
  const AdminView d = g.view(seen, t0);
  ASSERT_EQ(d.removed, std::vector<std::string>{"bridge 7"});
  ASSERT_EQ(d.finished.size(), 1u);
  EXPECT_EQ(d.finished[0].request, 7u);
  EXPECT_EQ(d.finished[0].doing, "finished: stop");
  // A full view lists no removals (the client starts over) but keeps the finished list.
  const AdminView full = g.view(0, t0);
  EXPECT_TRUE(full.removed.empty());
  EXPECT_EQ(full.finished.size(), 1u);
}

TEST(AdminGraph, AClientTooFarBehindGetsAFullView) {
  AdminGraph::Limits limits;
  limits.removed = 2;
  AdminGraph g(limits);
  g.note(report("scheduler", ActorKind::scheduler), t0);
  const uint64_t seen = g.revision();
  for (int i = 0; i < 4; ++i) {
    g.note(report("bridge " + std::to_string(i), ActorKind::bridge), t0);
    g.forget("bridge " + std::to_string(i));
  }
  EXPECT_TRUE(g.view(seen, t0).full);  // the first removals are forgotten: a delta would miss them
  EXPECT_FALSE(g.view(g.revision() - 1, t0).full);
  EXPECT_TRUE(g.view(g.revision() + 5, t0).full);  // a revision from another server's life
}

TEST(AdminGraph, StepTimeIsComputeTimeOverStepsBetweenReports) {
  AdminGraph g;
  StageStatus s;
  s.index = 0;
  s.steps = 10;
  s.compute_ms = 20;
  g.note(report("stage 0", ActorKind::stage), s, t0);
  s.steps = 30;
  s.compute_ms = 80;
  g.note(report("stage 0", ActorKind::stage, "stepping"), s, t0);
  const AdminView v = g.view(0, t0);
  ASSERT_EQ(v.stages.size(), 1u);
  EXPECT_DOUBLE_EQ(v.stages[0].step_ms, 3.0);
}

TEST(AdminGraph, ThroughputOverTheLastSecondFallsToZeroAtRest) {
  AdminGraph g;
  EngineSnapshot e;
  for (int i = 0; i <= 20; ++i) {  // 100 tokens per 50 ms for a second: 2000 t/s
    e.generated_tokens = static_cast<uint64_t>(i) * 100;
    e.prompt_tokens = 50;
    g.note(report("scheduler", ActorKind::scheduler), e, t0 + std::chrono::milliseconds(50 * i));
  }
  const auto end = t0 + 1000ms;
  EXPECT_NEAR(g.throughput(end).generated_per_s, 2000, 1e-6);
  EXPECT_NEAR(g.throughput(end).prompt_per_s, 0, 1e-6);
  EXPECT_NEAR(g.throughput(end + 500ms).generated_per_s, 1000, 1e-6);
  EXPECT_EQ(g.throughput(end + 2s).generated_per_s, 0);  // nothing reported since: nothing drawn
}
