#include "model/cpu/dsa.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

using namespace ferry::model;

TEST(Indexer, SelectsTheBestPoolsInAscendingOrder) {
  const std::vector<float> scores = {0.1f, 0.9f, -0.3f, 0.5f, 0.7f};
  std::vector<uint32_t> out;
  select_pools(scores, 3, out);
  EXPECT_EQ(out, (std::vector<uint32_t>{1, 3, 4}));
}

TEST(Indexer, TiesGoToTheLowerPoolIndex) {
  // ReLU zeros: pools 0, 2 and 3 all score exactly 0; one slot is left after pool 1.
  const std::vector<float> scores = {0.0f, 0.4f, 0.0f, 0.0f};
  std::vector<uint32_t> out;
  select_pools(scores, 2, out);
  EXPECT_EQ(out, (std::vector<uint32_t>{0, 1}));
  const std::vector<float> equal(6, 1.0f);
  select_pools(equal, 3, out);
  EXPECT_EQ(out, (std::vector<uint32_t>{0, 1, 2}));
}

TEST(Indexer, KeepsEveryPoolWithinBudget) {
  std::vector<uint32_t> out;
  select_pools(std::vector<float>{3.0f, 1.0f}, 4, out);
  EXPECT_EQ(out, (std::vector<uint32_t>{0, 1}));
  select_pools(std::vector<float>{}, 4, out);
  EXPECT_TRUE(out.empty());
}

TEST(Indexer, ExpandsPoolsAndAppendsTheTail) {
  std::vector<uint32_t> tokens;
  // kpool 4, query at 13: pools 0..2 are complete (tokens 0..11); its own pool holds 12, 13.
  expand_selection(std::vector<uint32_t>{0, 2}, 13, 4, true, tokens);
  EXPECT_EQ(tokens, (std::vector<uint32_t>{0, 1, 2, 3, 8, 9, 10, 11, 12, 13}));
  // The last token of a complete pool has no tail: its pool is a candidate like the others.
  expand_selection(std::vector<uint32_t>{1}, 11, 4, true, tokens);
  EXPECT_EQ(tokens, (std::vector<uint32_t>{4, 5, 6, 7}));
  expand_selection(std::vector<uint32_t>{0}, 13, 4, false, tokens);
  EXPECT_EQ(tokens, (std::vector<uint32_t>{0, 1, 2, 3}));
  // Before the first pool completes only the tail is there.
  expand_selection(std::vector<uint32_t>{}, 2, 4, true, tokens);
  EXPECT_EQ(tokens, (std::vector<uint32_t>{0, 1, 2}));
}

TEST(Indexer, PoolKeyIsAPerChannelSoftmaxWeightedSum) {
  // Two tokens, two channels. Channel 0: equal logits -> the mean. Channel 1: the APE favours token 1.
  const float keys[4] = {1.0f, 2.0f, 3.0f, 4.0f};  // token 0: (1, 2), token 1: (3, 4)
  const float gates[4] = {0.5f, 0.0f, 0.5f, 0.0f};
  const float ape[4] = {0.0f, 0.0f, 0.0f, 1.0f};
  float out[2];
  pool_key(keys, gates, ape, 2, 2, out);
  EXPECT_FLOAT_EQ(out[0], 2.0f);
  const float w1 = std::exp(1.0f) / (1.0f + std::exp(1.0f));
  EXPECT_NEAR(out[1], 2.0f * (1 - w1) + 4.0f * w1, 1e-6f);
}
