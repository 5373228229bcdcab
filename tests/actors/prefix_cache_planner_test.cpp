// The planner with prefix-cache checkpoints, against a model of the stages: every slot's state is the
// token sequence it has seen (its rows: one per token), a checkpoint the sequence at its boundary plus,
// once spilled, a copy of the slot's rows, and a drawn token a function of the whole sequence (as a
// model's is). Each plan is carried out in the stages' order (drops, saves, spills, resets, restores,
// rows); a restore without spilled rows into a slot whose rows differ, or a row that does not continue
// its slot's sequence, fails the test. So a wrong restore, a missing spill or a save of the wrong moment
// shows, and the drawn tokens must equal an uncached run's.
#include "actors/step_planner.hpp"

#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <numeric>

using namespace ferry::actors;

namespace {

TimePoint t0 = Clock::time_point{} + std::chrono::hours(1);

struct ModelStages {
  struct Checkpoint {
    std::vector<int32_t> state;
    std::optional<std::vector<int32_t>> rows;
  };
  std::map<uint32_t, std::vector<int32_t>> slots;
  std::map<uint64_t, Checkpoint> checkpoints;
  uint32_t restores = 0, spills = 0;

  static bool is_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
    return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
  }

  static int32_t draw(const std::vector<int32_t>& seq) {
    uint64_t h = 1469598103934665603ull;
    for (int32_t t : seq) h = (h ^ static_cast<uint64_t>(t)) * 1099511628211ull;
    return static_cast<int32_t>(h % 900) + 50;
  }

  StepOutcome run(const StepPlan& plan) {
    for (uint64_t id : plan.drop_checkpoints) checkpoints.erase(id);
    for (const CheckpointOp& op : plan.save_checkpoints) checkpoints[op.id] = Checkpoint{slots[op.slot], std::nullopt};
    for (const CheckpointSpill& spill : plan.spill_checkpoints) {
      ++spills;
      for (uint64_t id : spill.ids) {
        if (checkpoints.count(id) == 0) continue;
        EXPECT_TRUE(is_prefix(checkpoints[id].state, slots[spill.slot])) << "spill of checkpoint " << id;
        checkpoints[id].rows = slots[spill.slot];
      }
    }
    for (uint32_t s : plan.reset_slots) slots[s].clear();
    for (const CheckpointOp& op : plan.restore_checkpoints) {
      EXPECT_EQ(checkpoints.count(op.id), 1u) << "restore of checkpoint " << op.id << " that no stage holds";
      const Checkpoint& c = checkpoints[op.id];
      if (c.rows) slots[op.slot] = *c.rows;
      EXPECT_TRUE(is_prefix(c.state, slots[op.slot])) << "checkpoint " << op.id << " restored into slot " << op.slot
                                                      << " without its rows";
      slots[op.slot] = c.state;
      ++restores;
    }
    StepOutcome out;
    out.step = plan.step;
    for (const auto& row : plan.rows) {
      std::vector<int32_t>& seq = slots[row.slot];
      EXPECT_EQ(row.start, seq.size()) << "slot " << row.slot << " at step " << plan.step;
      seq.insert(seq.end(), row.tokens.begin(), row.tokens.end());
      if (row.sample) out.sampled.push_back(SampledToken{row.slot, draw(seq)});
    }
    return out;
  }
};

struct Result {
  std::vector<int32_t> tokens;
  RequestFinished done;
};

// Runs the planner until every submitted request has finished; each request's tokens and end.
std::map<RequestId, Result> drive(StepPlanner& p, ModelStages& stages, std::vector<GenerateRequest> requests) {
  std::map<RequestId, Result> out;
  for (auto& r : requests) EXPECT_TRUE(p.submit(std::move(r), t0).empty());
  for (int guard = 0; guard < 10000 && !p.idle(); ++guard) {
    EngineEvents ev;
    auto plan = p.plan(t0, ev);
    if (!plan) break;
    for (const auto& e : p.apply(stages.run(*plan), t0)) {
      if (auto* t = std::get_if<TokensGenerated>(&e)) out[t->id].tokens.insert(out[t->id].tokens.end(), t->tokens.begin(), t->tokens.end());
      if (auto* f = std::get_if<RequestFinished>(&e)) out[f->id].done = *f;
    }
  }
  // The saves of the last step ride on one more plan.
  EngineEvents ev;
  while (auto plan = p.plan(t0, ev)) p.apply(stages.run(*plan), t0);
  EXPECT_TRUE(p.idle());
  return out;
}

GenerateRequest request(RequestId id, std::vector<int32_t> prompt, uint32_t max_tokens = 4) {
  GenerateRequest r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  return r;
}

std::vector<int32_t> seq(size_t n, int32_t first) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

std::vector<int32_t> cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

PlannerLimits limits(uint32_t slots, uint64_t budget = 1ull << 30) {
  PlannerLimits l;
  l.slots = slots;
  l.ctx = 1024;
  l.prefill_chunk = 48;
  l.vocab_size = 1000;
  l.checkpoints.budget_bytes = budget;
  l.checkpoints.every = 64;
  l.checkpoints.block_tokens = 16;
  l.checkpoints.fixed_bytes = 1000;
  l.checkpoints.token_bytes = 10;
  return l;
}

// The same requests one after another with no cache: what every cached run must draw.
std::vector<int32_t> uncached(const std::vector<int32_t>& prompt, uint32_t max_tokens = 4) {
  StepPlanner p(limits(1, 0));
  ModelStages stages;
  return drive(p, stages, {request(1, prompt, max_tokens)})[1].tokens;
}

}  // namespace

TEST(PrefixCachePlanner, SameRequestAgainComputesOnlyItsLastToken) {
  StepPlanner p(limits(2));
  ModelStages stages;
  const auto prompt = seq(150, 1);
  auto first = drive(p, stages, {request(1, prompt)});
  EXPECT_EQ(first[1].done.usage.cached_tokens, 0u);
  EXPECT_EQ(first[1].tokens, uncached(prompt));
  // Checkpoints at 64, 128 (every), 149 (the prompt but its last token) and the end of generation.
  EXPECT_EQ(p.prefix_cache().size(), 4u);
  auto again = drive(p, stages, {request(2, prompt)});
  EXPECT_EQ(again[2].done.usage.cached_tokens, 149u);
  EXPECT_EQ(again[2].tokens, first[1].tokens);
  EXPECT_EQ(stages.restores, 1u);
  EXPECT_EQ(stages.spills, 0u);  // restored in place: slot 0 still holds the rows
}

TEST(PrefixCachePlanner, MultiTurnResumesAtTheEndOfGeneration) {
  StepPlanner p(limits(1));
  ModelStages stages;
  const auto prompt = seq(100, 1);
  auto first = drive(p, stages, {request(1, prompt, 6)});
  // The next turn: the answer appended, then new tokens. The slot still holds the sequence.
  const auto turn2 = cat(cat(prompt, first[1].tokens), seq(23, 600));
  auto second = drive(p, stages, {request(2, turn2)});
  EXPECT_EQ(second[2].done.usage.cached_tokens, 105u);  // prompt + answer but its last token
  EXPECT_EQ(second[2].tokens, uncached(turn2));
}

TEST(PrefixCachePlanner, CheckpointOutlivesItsSlotBeingReused) {
  StepPlanner p(limits(1));
  ModelStages stages;
  const auto a = seq(130, 1);
  auto ra = drive(p, stages, {request(1, a)});
  // Another conversation takes the only slot.
  const auto b = seq(90, 300);
  auto rb = drive(p, stages, {request(2, b)});
  EXPECT_EQ(rb[2].done.usage.cached_tokens, 0u);
  EXPECT_EQ(stages.spills, 1u);  // A's rows copied out once, for all of A's checkpoints
  // A's next turn diverges from A's answer (a tool result in its place): it resumes from the prompt's
  // checkpoint, one token short of A's prompt.
  const auto a2 = cat(a, seq(40, 700));
  auto ra2 = drive(p, stages, {request(3, a2)});
  EXPECT_EQ(ra2[3].done.usage.cached_tokens, 129u);
  EXPECT_EQ(ra2[3].tokens, uncached(a2));
  // A prompt diverging inside A's prompt resumes from the checkpoint below the divergence.
  auto a3 = a;
  a3[100] = 999;
  auto ra3 = drive(p, stages, {request(4, a3)});
  EXPECT_EQ(ra3[4].done.usage.cached_tokens, 64u);
  EXPECT_EQ(ra3[4].tokens, uncached(a3));
}

TEST(PrefixCachePlanner, InterleavedConversationsOverSlotsKeepHitting) {
  StepPlanner p(limits(3));
  ModelStages stages;
  std::vector<std::vector<int32_t>> conv = {seq(120, 1), seq(120, 200), seq(120, 400)};
  RequestId id = 1;
  for (int turn = 0; turn < 3; ++turn) {
    for (size_t c = 0; c < conv.size(); ++c) {
      const RequestId rid = id++;
      auto r = drive(p, stages, {request(rid, conv[c])});
      if (turn > 0) {
        EXPECT_GT(r[rid].done.usage.cached_tokens, conv[c].size() - 30) << "conversation " << c;
      }
      EXPECT_EQ(r[rid].tokens, uncached(conv[c]));
      conv[c] = cat(cat(conv[c], r[rid].tokens), seq(20, 800 + static_cast<int32_t>(c)));
    }
  }
}

TEST(PrefixCachePlanner, CachePromptFalseNeitherTakesNorUsesCheckpoints) {
  StepPlanner p(limits(2));
  ModelStages stages;
  const auto prompt = seq(100, 1);
  auto req = request(1, prompt);
  req.reuse_prefix = false;
  drive(p, stages, {req});
  EXPECT_EQ(p.prefix_cache().size(), 0u);
  drive(p, stages, {request(2, prompt)});
  EXPECT_GT(p.prefix_cache().size(), 0u);
  auto off = request(3, prompt);
  off.reuse_prefix = false;
  auto r = drive(p, stages, {off});
  EXPECT_EQ(r[3].done.usage.cached_tokens, 0u);
  EXPECT_EQ(stages.restores, 0u);
}

TEST(PrefixCachePlanner, ReleaseFreesTheSlotsCheckpoints) {
  StepPlanner p(limits(2));
  ModelStages stages;
  const auto prompt = seq(100, 1);
  drive(p, stages, {request(1, prompt)});
  ASSERT_GT(p.prefix_cache().size(), 0u);
  const size_t held = stages.checkpoints.size();
  EXPECT_EQ(held, p.prefix_cache().size());
  EXPECT_TRUE(p.release(0, t0).first.ok);
  EXPECT_EQ(p.prefix_cache().size(), 0u);
  EngineEvents ev;
  auto plan = p.plan(t0, ev);  // the drops and the reset go out with the next plan
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->drop_checkpoints.size(), held);
  p.apply(stages.run(*plan), t0);
  EXPECT_TRUE(stages.checkpoints.empty());
  auto r = drive(p, stages, {request(2, prompt)});
  EXPECT_EQ(r[2].done.usage.cached_tokens, 0u);
}

TEST(PrefixCachePlanner, EvictionKeepsTheBudgetAndTheStoresInStep) {
  // Room for about two checkpoints of ~130 tokens (1000 + 10 * T + 4 * T bytes each).
  StepPlanner p(limits(1, 6000));
  ModelStages stages;
  for (RequestId id = 1; id <= 4; ++id) {
    drive(p, stages, {request(id, seq(130, static_cast<int32_t>(id) * 100))});
    EXPECT_LE(p.prefix_cache().used_bytes(), 6000u);
    EXPECT_EQ(stages.checkpoints.size(), p.prefix_cache().size());
  }
}

TEST(PrefixCachePlanner, AFailedSaveIsNeverMatched) {
  StepPlanner p(limits(1));
  ModelStages stages;
  const auto prompt = seq(70, 1);
  ASSERT_TRUE(p.submit(request(1, prompt), t0).empty());
  EngineEvents ev;
  // The prefill chunks until the one that carries the save of 64 tokens; that step fails.
  for (;;) {
    auto plan = p.plan(t0, ev);
    ASSERT_TRUE(plan);
    if (!plan->save_checkpoints.empty()) {
      StepOutcome failed;
      failed.step = plan->step;
      failed.error = "stage 0: out of memory";
      failed.code = ferry::ErrorCode::out_of_memory;
      p.apply(failed, t0);
      break;
    }
    p.apply(stages.run(*plan), t0);
  }
  EXPECT_TRUE(p.idle());
  EXPECT_EQ(p.prefix_cache().size(), 0u);
  auto plan = p.plan(t0, ev);  // the drop of what some stages may have saved
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->drop_checkpoints.size(), 1u);
  p.apply(stages.run(*plan), t0);
  auto r = drive(p, stages, {request(2, prompt)});
  EXPECT_EQ(r[2].done.usage.cached_tokens, 0u);
  EXPECT_EQ(r[2].tokens, uncached(prompt));
}

TEST(PrefixCachePlanner, ACutKeepsWhatAnotherRequestRestoresInTheSamePlan) {
  // Slot 0 holds conversation A past two checkpoints; a request resuming at the earlier one and one
  // resuming at the later one are admitted together: the first cuts slot 0 back, the second's
  // checkpoint must survive the cut (its rows are copied out) and land in slot 1.
  StepPlanner p(limits(2));
  ModelStages stages;
  const auto a = seq(140, 1);
  drive(p, stages, {request(1, a)});
  auto shorter = a;
  shorter.resize(70);  // resumes at 64
  auto longer = cat(a, seq(10, 900));  // resumes at 139 or the end of generation
  auto r = drive(p, stages, {request(2, cat(shorter, seq(5, 700))), request(3, longer)});
  EXPECT_EQ(r[2].done.usage.cached_tokens, 64u);
  EXPECT_GE(r[3].done.usage.cached_tokens, 139u);
  EXPECT_EQ(r[2].tokens, uncached(cat(shorter, seq(5, 700))));
  EXPECT_EQ(r[3].tokens, uncached(longer));
}
