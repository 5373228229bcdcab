// The planner with MTP drafts (PlannerLimits::mtp): the prompt's last chunk asks for drafts, a decode
// row set carries them to be verified, accepted drafts come out as tokens in order with the draw after
// them, a rejection makes the next set start at the same position again with the kept rows, and the
// counts reach the request's timings and the snapshot; sampled requests verify drafts the same way.
// The policy: auto picks K from acceptance and turns drafting off where it does not pay or the batch
// is large.
#include <gtest/gtest.h>

#include <numeric>

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

TEST(SpecPolicy, AutoPicksKFromAcceptanceAndStopsWhereItDoesNotPay) {
  const MtpSetting a{true, true, 1};
  ferry::model::SpecCounts c;
  EXPECT_GE(drafts_for(a, c, 1), 1u);  // no history yet: the assumed acceptance pays
  c.drafted = 100, c.accepted = 95;
  EXPECT_EQ(drafts_for(a, c, 1), kMaxDrafts);
  c.accepted = 50;
  const uint32_t mid = drafts_for(a, c, 1);
  EXPECT_GE(mid, 1u);
  EXPECT_LT(mid, kMaxDrafts);
  c.accepted = 5;
  EXPECT_EQ(drafts_for(a, c, 1), 0u);
  c.accepted = 95;
  EXPECT_EQ(drafts_for(a, c, kMaxSpeculatingSlots + 1), 0u);  // a large batch
  EXPECT_EQ(drafts_for(MtpSetting{true, false, 2}, c, 1), 2u);
  EXPECT_EQ(drafts_for(MtpSetting{}, c, 1), 0u);
  EXPECT_FALSE(parse_mtp_setting("4"));
  EXPECT_FALSE(parse_mtp_setting("on"));
  EXPECT_TRUE(parse_mtp_setting("auto")->adaptive);
  EXPECT_FALSE(parse_mtp_setting("off")->enabled);
  EXPECT_EQ(parse_mtp_setting("3")->drafts, 3u);
}

}  // namespace
