#include "model/sampler.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

using namespace ferry::model;

TEST(Sampler, GreedyTiesGoToTheLowestId) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f};
  SamplingParams p;
  EXPECT_EQ(sample_token(logits, p, 7), 1);
  EXPECT_EQ(argmax_token(logits), 1);
}

TEST(Sampler, SameSeedAndPositionGiveTheSameToken) {
  std::vector<float> logits(50);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(float(i));
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 42;
  for (uint64_t pos = 0; pos < 20; ++pos) EXPECT_EQ(sample_token(logits, p, pos), sample_token(logits, p, pos));
  // Different positions do not all draw the same token.
  std::vector<int32_t> seen;
  for (uint64_t pos = 0; pos < 40; ++pos) seen.push_back(sample_token(logits, p, pos));
  EXPECT_GT(std::set<int32_t>(seen.begin(), seen.end()).size(), 5u);
}

TEST(Sampler, FiltersLeaveOnlyTheBestToken) {
  const std::vector<float> logits = {1.0f, 5.0f, 0.0f, 4.9f};
  SamplingParams p;
  p.temperature = 1.0f;
  for (uint64_t pos = 0; pos < 30; ++pos) {
    p.top_k = 1;
    EXPECT_EQ(sample_token(logits, p, pos), 1);
    p.top_k = 0;
    p.top_p = 0.01f;
    EXPECT_EQ(sample_token(logits, p, pos), 1);
    p.top_p = 1.0f;
    p.min_p = 0.99f;
    EXPECT_EQ(sample_token(logits, p, pos), 1);
    p.min_p = 0.0f;
  }
}

TEST(Sampler, DrawsFollowTheDistribution) {
  // p = (0.5, 0.25, 0.25): frequencies over many positions within a few percent.
  const std::vector<float> logits = {std::log(2.0f), 0.0f, 0.0f};
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 9;
  int count[3] = {0, 0, 0};
  const int n = 20000;
  for (int pos = 0; pos < n; ++pos) ++count[sample_token(logits, p, pos)];
  EXPECT_NEAR(count[0] / double(n), 0.5, 0.02);
  EXPECT_NEAR(count[1] / double(n), 0.25, 0.02);
  EXPECT_NEAR(count[2] / double(n), 0.25, 0.02);
}
