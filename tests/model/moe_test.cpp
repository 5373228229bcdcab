#include "model/cpu/moe.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

using namespace ferry::model;

namespace {
float logit(float p) { return std::log(p / (1.0f - p)); }
}  // namespace

TEST(Router, PicksTopByBiasedScoreButWeighsByUnbiased) {
  RouterConfig c{4, 2, 1, 1, true, 2.5f};
  const float logits[4] = {logit(0.9f), logit(0.5f), logit(0.6f), logit(0.1f)};
  const float bias[4] = {0.0f, 0.3f, 0.0f, 0.0f};  // expert 1 chosen over 2 only through the bias
  uint32_t e[2];
  float w[2];
  route_token(c, logits, bias, e, w);
  EXPECT_EQ(e[0], 0u);
  EXPECT_EQ(e[1], 1u);
  EXPECT_NEAR(w[0], 0.9f / 1.4f * 2.5f, 1e-5f);
  EXPECT_NEAR(w[1], 0.5f / 1.4f * 2.5f, 1e-5f);
}

TEST(Router, GroupFilterKeepsGroupsByTheirTwoBestScores) {
  // 3 groups of 2. Group 0 holds the single best expert (0.95) but its pair sums to 1.0; groups 1
  // (0.8 + 0.7) and 2 (0.6 + 0.6) win with topk_group 2, so expert 0 cannot be chosen.
  RouterConfig c{6, 2, 3, 2, true, 1.0f};
  const float p[6] = {0.95f, 0.05f, 0.8f, 0.7f, 0.6f, 0.6f};
  float logits[6], bias[6] = {0, 0, 0, 0, 0, 0};
  for (int i = 0; i < 6; ++i) logits[i] = logit(p[i]);
  uint32_t e[2];
  float w[2];
  route_token(c, logits, bias, e, w);
  EXPECT_EQ(e[0], 2u);
  EXPECT_EQ(e[1], 3u);
  EXPECT_NEAR(w[0] + w[1], 1.0f, 1e-6f);
  // With every group kept, expert 0 wins.
  c.topk_group = 3;
  route_token(c, logits, bias, e, w);
  EXPECT_EQ(e[0], 0u);
}

TEST(Router, TiesGoToTheLowerIndexAndUnnormalisedWeightsAreScaledSigmoids) {
  RouterConfig c{4, 2, 1, 1, false, 1.5f};
  const float logits[4] = {0.0f, 1.0f, 1.0f, 1.0f};
  const float bias[4] = {0, 0, 0, 0};
  uint32_t e[2];
  float w[2];
  route_token(c, logits, bias, e, w);
  EXPECT_EQ(e[0], 1u);
  EXPECT_EQ(e[1], 2u);
  EXPECT_NEAR(w[0], 1.5f / (1.0f + std::exp(-1.0f)), 1e-6f);
}

TEST(SwigluClamp, ClampsGateAboveAndUpBothWays) {
  float gate[3] = {20.0f, -3.0f, 1.0f};
  const float up[3] = {-50.0f, 2.0f, 30.0f};
  swiglu_clamped(gate, up, 3, 10.0f);
  EXPECT_NEAR(gate[0], silu(10.0f) * -10.0f, 1e-4f);
  EXPECT_NEAR(gate[1], silu(-3.0f) * 2.0f, 1e-6f);
  EXPECT_NEAR(gate[2], silu(1.0f) * 10.0f, 1e-5f);
}
