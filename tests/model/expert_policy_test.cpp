// The expert policy without threads or devices: the first placement (cold: an even spread; warm:
// from saved counts), swaps only past the margin, a host copy for every evicted expert, shadow copies
// taken back oldest first, nothing proposed while a stage's swaps are out, counts saved and read back.
#include "model/expert_policy.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

namespace ferry::model {
namespace {

// One stage with MoE layers 1 and 2 of 8 experts, a pool of `slots`, `host` host slots.
ExpertPolicy policy(uint32_t slots, uint32_t host, ExpertPolicyOptions o = {}) {
  return ExpertPolicy(3, 8, {{1, 2}}, {slots}, host, o);
}

RouteCounts routes(std::vector<std::pair<ExpertId, uint32_t>> hits) {
  RouteCounts c;
  c.layers = {1, 2};
  c.experts = 8;
  c.counts.assign(16, 0);
  for (auto [id, n] : hits) c.counts[(id.layer - 1) * 8 + id.expert] += n;
  return c;
}

TEST(ExpertPolicy, ColdPlacementSpreadsThePoolEvenlyAndHostsTheRest) {
  ExpertPolicy p = policy(6, 12);
  const ExpertPlacement placed = p.place();
  ASSERT_EQ(placed.pooled.size(), 1u);
  ASSERT_EQ(placed.pooled[0].size(), 6u);
  uint32_t per_layer[3] = {0, 0, 0};
  for (const ExpertId& id : placed.pooled[0]) ++per_layer[id.layer];
  EXPECT_EQ(per_layer[1], 3u);
  EXPECT_EQ(per_layer[2], 3u);
  // Every expert no pool holds has a host slot, all different; layer 0 (not a MoE layer here) none.
  std::set<int64_t> used;
  for (uint32_t l = 1; l <= 2; ++l) {
    for (uint32_t e = 0; e < 8; ++e) {
      const int64_t h = placed.host_slot[l * 8 + e];
      if (!p.pooled({l, e})) {
        EXPECT_GE(h, 0) << l << "," << e;
      }
      if (h >= 0) {
        EXPECT_TRUE(used.insert(h).second);
      }
    }
  }
  for (uint32_t e = 0; e < 8; ++e) EXPECT_EQ(placed.host_slot[e], -1);
  // 10 experts outside the pool, 12 slots: one shadow copy, and one slot kept free for evictions.
  EXPECT_EQ(used.size(), 11u);
  EXPECT_EQ(p.free_host_slots(), 1u);
}

TEST(ExpertPolicy, SwapsOnlyPastTheMarginAndEveryEvictedExpertHasAHostCopy) {
  ExpertPolicyOptions o;
  o.decay = 1.0;
  ExpertPolicy p = policy(2, 15, o);
  p.place();  // pool: expert 0 of layers 1 and 2
  ASSERT_TRUE(p.pooled({1, 0}) && p.pooled({2, 0}));
  p.observe(0, routes({{{1, 0}, 10}, {{2, 0}, 10}, {{1, 5}, 12}}));  // 12 < 10 * 1.25: stay
  EXPECT_TRUE(p.propose(0).empty());
  p.observe(0, routes({{{1, 5}, 20}}));  // 32 routes now: past the margin over 10
  const std::vector<ExpertMove> moves = p.propose(0);
  ASSERT_EQ(moves.size(), 1u);
  EXPECT_EQ(moves[0].promote, (ExpertId{1, 5}));
  EXPECT_EQ(moves[0].promote_host, static_cast<uint32_t>(p.host_slot({1, 5})));
  const ExpertId out = moves[0].evict;
  EXPECT_TRUE(out == (ExpertId{1, 0}) || out == (ExpertId{2, 0}));
  EXPECT_TRUE(p.propose(0).empty());  // nothing more while a swap is out
  p.finished(0, moves);
  EXPECT_TRUE(p.pooled({1, 5}));
  EXPECT_FALSE(p.pooled(out));
  EXPECT_EQ(p.host_slot(out), static_cast<int64_t>(moves[0].evict_host));
  EXPECT_GE(p.host_slot({1, 5}), 0);  // its host copy stays: a shadow
}

TEST(ExpertPolicy, AnEvictionWithoutACopyTakesTheOldestShadowSlot) {
  ExpertPolicyOptions o;
  o.decay = 1.0;
  o.moves_per_report = 1;
  ExpertPolicy p = policy(4, 13, o);  // 12 outside the pool + 1 slot: no shadow copies at start
  p.place();
  EXPECT_EQ(p.free_host_slots(), 1u);
  // First swap: the evicted expert gets the free slot.
  p.observe(0, routes({{{1, 7}, 50}}));
  auto m1 = p.propose(0);
  ASSERT_EQ(m1.size(), 1u);
  EXPECT_TRUE(m1[0].copy_evicted);
  EXPECT_EQ(p.free_host_slots(), 0u);
  p.finished(0, m1);
  // Second swap: no free slot; the shadow copy of expert (1,7), pooled just now, is the only one.
  p.observe(0, routes({{{2, 7}, 60}}));
  auto m2 = p.propose(0);
  ASSERT_EQ(m2.size(), 1u);
  EXPECT_TRUE(m2[0].copy_evicted);
  EXPECT_NE(m2[0].evict, (ExpertId{1, 7}));
  EXPECT_EQ(m2[0].evict_host, m1[0].promote_host);
  EXPECT_EQ(p.host_slot({1, 7}), -1);
  p.finished(0, m2);
  EXPECT_TRUE(p.pooled({2, 7}));
}

TEST(ExpertPolicy, CountsDecayAndAOneOffRouteMovesNothing) {
  ExpertPolicy p = policy(2, 15);
  p.place();
  p.observe(0, routes({{{1, 3}, 1}}));
  EXPECT_TRUE(p.propose(0).empty());  // below min_score
  for (int i = 0; i < 200; ++i) p.observe(0, routes({}));
  EXPECT_LT(p.score({1, 3}), 0.05);
}

TEST(ExpertPolicy, SavedCountsPlaceTheNextStartsPool) {
  const auto file = std::filesystem::temp_directory_path() / ("expert_counts_" + std::to_string(::getpid()));
  {
    ExpertPolicy p = policy(3, 14);
    p.place();
    p.observe(0, routes({{{2, 6}, 9}, {{2, 5}, 8}, {{1, 4}, 7}, {{1, 1}, 1}}));
    ASSERT_FALSE(p.save_counts(file));
  }
  ExpertPolicy warm = policy(3, 14);
  ASSERT_FALSE(warm.load_counts(file));
  const ExpertPlacement placed = warm.place();
  std::vector<ExpertId> want = {{2, 6}, {2, 5}, {1, 4}};
  EXPECT_EQ(placed.pooled[0], want);
  // Counts of another shape are refused, naming what was expected.
  ExpertPolicy other(4, 8, {{1}}, {1}, 9);
  const Status e = other.load_counts(file);
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("not route counts of this model"), std::string::npos);
  std::ofstream(file) << "garbage";
  EXPECT_TRUE(warm.load_counts(file));
  std::filesystem::remove(file);
  EXPECT_EQ(warm.load_counts(file)->code, ErrorCode::io);
}

}  // namespace
}  // namespace ferry::model
