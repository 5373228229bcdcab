// The planner with MTP drafts (PlannerLimits::mtp): the prompt's last chunk asks for drafts, a decode
// row set carries them to be verified, accepted drafts come out as tokens in order with the draw after
// them, a rejection makes the next set start at the same position again with the kept rows, and the
// counts reach the request's timings and the snapshot; sampled requests verify drafts the same way.
// The policy: auto picks K from acceptance and the measured step costs (planted here: StepCosts and
// the planner's plan-to-outcome times), and turns drafting off where it does not pay or the batch is
// large.
#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <set>

#include "actors/spec_policy.hpp"
#include "actors/step_planner.hpp"

using namespace ferry::actors;

namespace {

TimePoint t0 = Clock::time_point{} + std::chrono::hours(1);

std::vector<int32_t> tokens_of(const EngineEvents& events) {
  std::vector<int32_t> out;
  for (const auto& e : events) {
    if (auto* t = std::get_if<TokensGenerated>(&e)) out.insert(out.end(), t->tokens.begin(), t->tokens.end());
  }
  return out;
}

StepOutcome outcome(const StepPlan& plan, int32_t token, uint32_t accepted, std::vector<int32_t> drafts) {
  StepOutcome out;
  out.step = plan.step;
  out.sampled.push_back(SampledToken{plan.rows[0].slot, token, accepted, std::move(drafts)});
  return out;
}

TEST(SpecPlanner, DraftsRideInDecodeRowsAndARejectionRestartsAtTheSamePosition) {
  PlannerLimits l;
  l.slots = 1;
  l.ctx = 64;
  l.vocab_size = 1000;
  l.mtp = MtpSetting{true, false, 1};
  StepPlanner p(l);
  GenerateRequest r;
  r.id = 1;
  r.prompt = {5, 6, 7, 8};
  r.max_tokens = 6;
  EXPECT_TRUE(p.submit(r, t0).empty());
  EngineEvents ev;
  auto plan = p.plan(t0, ev);
  ASSERT_TRUE(plan);
  ASSERT_EQ(plan->rows.size(), 1u);
  EXPECT_EQ(plan->rows[0].draft, 1u);
  EXPECT_EQ(plan->rows[0].verify, 0u);
  EXPECT_EQ(tokens_of(p.apply(outcome(*plan, 100, 0, {101}), t0)), std::vector<int32_t>{100});

  // [100, draft 101] from 4: the draft is accepted and 102 drawn after it.
  plan = p.plan(t0, ev);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->rows[0].start, 4u);
  EXPECT_EQ(plan->rows[0].tokens, (std::vector<int32_t>{100, 101}));
  EXPECT_EQ(plan->rows[0].verify, 1u);
  EXPECT_EQ(tokens_of(p.apply(outcome(*plan, 102, 1, {103}), t0)), (std::vector<int32_t>{101, 102}));

  // [102, draft 103] from 6: rejected, 200 drawn instead; the next set starts at 6 again.
  plan = p.plan(t0, ev);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->rows[0].start, 6u);
  EXPECT_EQ(tokens_of(p.apply(outcome(*plan, 200, 0, {201}), t0)), std::vector<int32_t>{200});
  EXPECT_EQ(p.snapshot().slots[0].held_tokens, 6u);
  plan = p.plan(t0, ev);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->rows[0].start, 6u);
  EXPECT_EQ(plan->rows[0].tokens, (std::vector<int32_t>{102, 200, 201}));
  EXPECT_EQ(plan->rows[0].verify, 1u);
  // Accepted: 201 and 202 are tokens 5 and 6, the last the request takes.
  const EngineEvents done = p.apply(outcome(*plan, 202, 1, {203}), t0);
  EXPECT_EQ(tokens_of(done), (std::vector<int32_t>{201, 202}));
  const auto* fin = std::get_if<RequestFinished>(&done.back());
  ASSERT_NE(fin, nullptr);
  EXPECT_EQ(fin->usage.completion_tokens, 6u);
  EXPECT_EQ(fin->timings.draft_n, 3u);
  EXPECT_EQ(fin->timings.draft_n_accepted, 2u);
  EXPECT_EQ(p.snapshot().draft_tokens, 3u);
  EXPECT_EQ(p.snapshot().accepted_tokens, 2u);
  EXPECT_EQ(p.snapshot().slots[0].held_tokens, 9u);  // 4 prompt + 100 101 102 200 201
}

TEST(SpecPlanner, SampledRequestsVerifyDraftsToo) {
  PlannerLimits l;
  l.slots = 1;
  l.ctx = 64;
  l.mtp = MtpSetting{true, false, 1};
  StepPlanner p(l);
  GenerateRequest r;
  r.id = 1;
  r.prompt = {5, 6};
  r.max_tokens = 3;
  r.sampling.temperature = 0.8f;
  r.sampling.seed = 4;
  p.submit(r, t0);
  EngineEvents ev;
  auto plan = p.plan(t0, ev);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->rows[0].draft, 1u);
  p.apply(outcome(*plan, 9, 0, {10}), t0);
  plan = p.plan(t0, ev);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->rows[0].tokens, (std::vector<int32_t>{9, 10}));
  EXPECT_EQ(plan->rows[0].verify, 1u);
  EXPECT_EQ(plan->rows[0].sampling, r.sampling);
}

// A StepCosts whose row counts `ms` took those times (each past its warm-up and sample count).
StepCosts planted(const std::map<uint32_t, double>& ms) {
  StepCosts c;
  for (const auto& [rows, t] : ms) {
    for (uint32_t i = 0; i < kCostWarmup + kCostSamples; ++i) c.record(rows, t);
  }
  return c;
}

// --mtp auto's drafts for `slots` decoding slots at those counts, with those step times measured.
uint32_t auto_k(const ferry::model::SpecCounts& c, size_t slots, const std::map<uint32_t, double>& ms) {
  const StepCosts costs = planted(ms);
  return drafts_for(MtpSetting{true, true, 1}, c, slots, &costs);
}

TEST(StepCosts, SkipTheWarmUpThenAverage) {
  StepCosts c;
  c.record(1, 50.0);  // eager, then the graph's capture
  c.record(1, 40.0);
  for (uint32_t i = 0; i + 1 < kCostSamples; ++i) c.record(1, i % 2 ? 3.0 : 3.4);
  EXPECT_FALSE(c.ms(1));  // not enough counted steps yet
  c.record(1, kCostSamples % 2 ? 3.4 : 3.0);
  ASSERT_TRUE(c.ms(1));
  EXPECT_NEAR(*c.ms(1), 3.2, 1e-9);
  EXPECT_FALSE(c.ratio(2, 1));
  for (uint32_t i = 0; i < kCostWarmup + kCostSamples; ++i) c.record(2, 4.8);
  ASSERT_TRUE(c.ratio(2, 1));
  EXPECT_NEAR(*c.ratio(2, 1), 1.5, 1e-9);
  // A changed load shows: the mean moves to the new time over about kCostWindow steps.
  for (uint32_t i = 0; i < 8 * kCostWindow; ++i) c.record(1, 6.4);
  EXPECT_NEAR(*c.ms(1), 6.4, 0.01);
  EXPECT_NEAR(*c.ratio(2, 1), 0.75, 0.01);
  c.record(3, -1.0);  // not a time
  c.record(0, 1.0);   // no rows
  EXPECT_FALSE(c.ms(3));
  EXPECT_FALSE(c.ms(0));
}

TEST(SpecPolicy, AutoPicksKFromAcceptanceAndMeasuredCosts) {
  const MtpSetting a{true, true, 1};
  ferry::model::SpecCounts c;
  const StepCosts none;
  // No plain step measured yet: none drafts (plain steps are the measure of a draft's cost).
  EXPECT_EQ(drafts_for(a, c, 1, &none), 0u);
  EXPECT_EQ(drafts_for(MtpSetting{true, false, 2}, c, 1, &none), 2u);  // a fixed K stays
  // Only the plain step measured: each K at the goal's cost, the assumed acceptance pays.
  EXPECT_GE(auto_k(c, 1, {{1, 3.2}}), 1u);
  c.drafted = 1000, c.accepted = 883;
  // The H200's 12-layer figures (gpu/PERF.md): 1 row 3.20 ms, 2 rows 4.75, 4 rows 7.41. K = 2 (3
  // rows) is not measured: at the goal's 1.2x it looks best, so auto tries it.
  EXPECT_EQ(auto_k(c, 1, {{1, 3.2}, {2, 4.75}, {4, 7.41}}), 2u);
  // Measured too (1.9x): 1 + 3 drafts pays most (3.35 tokens for 2.32x).
  EXPECT_EQ(auto_k(c, 1, {{1, 3.2}, {2, 4.75}, {3, 6.1}, {4, 7.41}}), 3u);
  // Rows near their byte floor: K = 3 at 88% acceptance.
  EXPECT_EQ(auto_k(c, 1, {{1, 3.2}, {2, 3.5}, {3, 3.8}, {4, 4.1}}), kMaxDrafts);
  // Drafts that cost a full step each do not pay at any acceptance below 1: drafting stops.
  const StepCosts dear = planted({{1, 3.2}, {2, 6.4}, {3, 9.6}, {4, 12.8}});
  EXPECT_EQ(drafts_for(a, c, 1, &dear), 0u);
  c.accepted = 990;
  EXPECT_EQ(drafts_for(a, c, 1, &dear), 0u);
  // Low acceptance: even cheap rows do not pay for K > 1, nor at 5% for any K.
  const StepCosts cheap = planted({{1, 3.2}, {2, 3.5}, {3, 3.8}, {4, 4.1}});
  c.accepted = 150;
  EXPECT_EQ(drafts_for(a, c, 1, &cheap), 1u);
  c.accepted = 50;
  EXPECT_EQ(drafts_for(a, c, 1, &cheap), 0u);
  // Two slots decoding: their 2-row step against their 4-row one (1 draft each).
  c.accepted = 883;
  EXPECT_EQ(auto_k(c, 2, {{1, 3.2}}), 0u);  // their plain step not measured yet
  EXPECT_EQ(auto_k(c, 2, {{1, 3.2}, {2, 3.4}}), kMaxDrafts);  // the wider ones not: the goal's
  EXPECT_EQ(auto_k(c, 2, {{2, 3.4}, {4, 6.8}, {6, 10.2}, {8, 13.6}}), 0u);
  // Nothing measurable (micro-batched steps): every K at the goal's cost, as before measuring.
  EXPECT_EQ(drafts_for(a, c, 1, nullptr), kMaxDrafts);
  c.accepted = 95, c.drafted = 100;
  EXPECT_EQ(drafts_for(a, c, kMaxSpeculatingSlots + 1, &cheap), 0u);  // a large batch
  EXPECT_EQ(drafts_for(MtpSetting{}, c, 1, &cheap), 0u);
  EXPECT_FALSE(parse_mtp_setting("4"));
  EXPECT_FALSE(parse_mtp_setting("on"));
  EXPECT_TRUE(parse_mtp_setting("auto")->adaptive);
  EXPECT_FALSE(parse_mtp_setting("off")->enabled);
  EXPECT_EQ(parse_mtp_setting("3")->drafts, 3u);
}

// The planner under --mtp auto with planted step times (plan to outcome, by the step's rows): it
// decodes plainly until a plain step's cost is known, then drafts; where drafts are cheap it settles
// on kMaxDrafts, where each draft row costs a full step it tries each K once measured and stops.
std::vector<uint32_t> auto_drafts(double (*step_ms)(size_t rows)) {
  PlannerLimits l;
  l.slots = 1;
  l.ctx = 2048;
  l.vocab_size = 1000;
  l.mtp = MtpSetting{true, true, 1};
  StepPlanner p(l);
  GenerateRequest r;
  r.id = 1;
  r.prompt = {5, 6, 7, 8};
  r.max_tokens = 1000;
  EXPECT_TRUE(p.submit(r, t0).empty());
  std::vector<uint32_t> drafts;
  TimePoint now = t0;
  EngineEvents ev;
  for (int i = 0; i < 80; ++i) {
    auto plan = p.plan(now, ev);
    if (!plan) break;
    const auto& row = plan->rows.at(0);
    drafts.push_back(row.draft);
    now += std::chrono::microseconds(static_cast<int64_t>(1000 * step_ms(row.tokens.size())));
    // Every draft accepted; the block drafts what the row asked for.
    p.apply(outcome(*plan, 100 + i, row.verify, std::vector<int32_t>(row.draft, 300 + i)), now);
  }
  return drafts;
}

TEST(SpecPlanner, AutoDraftsFromMeasuredStepTimes) {
  const std::vector<uint32_t> cheap = auto_drafts([](size_t rows) { return 3.2 + 0.3 * double(rows - 1); });
  ASSERT_EQ(cheap.size(), 80u);
  // The prompt's step and the plain steps that measure a 1-row step ask for none.
  for (uint32_t i = 0; i <= kCostWarmup + kCostSamples; ++i) EXPECT_EQ(cheap[i], 0u) << "step " << i;
  EXPECT_GT(cheap[kCostWarmup + kCostSamples + 1], 0u);
  for (size_t i = 60; i < cheap.size(); ++i) EXPECT_EQ(cheap[i], kMaxDrafts) << "step " << i;

  const std::vector<uint32_t> dear = auto_drafts([](size_t rows) { return 3.2 * 1.1 * double(rows); });
  ASSERT_EQ(dear.size(), 80u);
  std::set<uint32_t> tried(dear.begin(), dear.end());
  EXPECT_EQ(tried, (std::set<uint32_t>{0, 1, 2, 3}));  // each K measured once it looked best
  for (size_t i = 60; i < dear.size(); ++i) EXPECT_EQ(dear[i], 0u) << "step " << i;
}

}  // namespace
