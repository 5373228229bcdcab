#include "model/cpu/mhc.hpp"

#include <gtest/gtest.h>

#include <random>
#include <vector>

using namespace ferry::model;

TEST(Mhc, SinkhornMakesPositiveMatricesDoublyStochastic) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(0.05f, 3.0f);
  for (uint32_t h : {2u, 4u, 6u}) {
    std::vector<float> m(h * h);
    for (float& x : m) x = u(rng);
    sinkhorn(m.data(), h, 60, 1e-6f);
    for (uint32_t i = 0; i < h; ++i) {
      float row = 0, col = 0;
      for (uint32_t j = 0; j < h; ++j) row += m[i * h + j], col += m[j * h + i];
      EXPECT_NEAR(row, 1.0f, 1e-4f) << "h " << h << " row " << i;
      EXPECT_NEAR(col, 1.0f, 1e-5f) << "h " << h << " column " << i;
    }
  }
}

TEST(Mhc, SinkhornOneIterationIsOneColumnPass) {
  std::vector<float> m = {1, 3, 1, 1};
  sinkhorn(m.data(), 2, 1, 0.0f);
  EXPECT_FLOAT_EQ(m[0], 0.5f);
  EXPECT_FLOAT_EQ(m[1], 0.75f);
  EXPECT_FLOAT_EQ(m[2], 0.5f);
  EXPECT_FLOAT_EQ(m[3], 0.25f);
}

// Expected values from an independent float64 numpy evaluation of transformers' formulas.
TEST(Mhc, CoefficientsMatchNumpy) {
  MhcConfig c;
  c.streams = 2;
  c.sinkhorn_iters = 20;
  c.eps = 1e-6f;
  const float m[8] = {0.3f, -1.2f, 0.8f, 0.5f, 1.0f, 0.0f, -2.0f, 0.7f};
  const float base[8] = {0.1f, -0.2f, 0.3f, 0.05f, -0.5f, 0.25f, 0.4f, -0.1f};
  const float scale[3] = {0.9f, 1.1f, 1.3f};
  float pre[2], post[2], comb[4];
  mhc_coefficients(c, m, base, scale, pre, post, comb);
  EXPECT_NEAR(pre[0], 0.59145998f, 1e-6f);
  EXPECT_NEAR(pre[1], 0.21755122f, 1e-6f);
  EXPECT_NEAR(post[0], 1.52989561f, 1e-6f);
  EXPECT_NEAR(post[1], 1.29131261f, 1e-6f);
  EXPECT_NEAR(comb[0], 0.85569492f, 1e-6f);
  EXPECT_NEAR(comb[1], 0.14430454f, 1e-6f);
  EXPECT_NEAR(comb[2], 0.14430408f, 1e-6f);
  EXPECT_NEAR(comb[3], 0.85569446f, 1e-6f);
}

TEST(Mhc, PostMixesStreamsByTheTransposedComb) {
  // Two streams of width 1: new R[j] = post[j] * y + sum_i comb[i][j] R[i].
  MhcConfig c;
  c.streams = 2;
  ThreadPool pool(1);
  float streams[2] = {1.0f, 10.0f};
  const float y[1] = {2.0f};
  const float post[2] = {0.5f, 1.5f};
  const float comb[4] = {0.9f, 0.1f, 0.2f, 0.8f};
  mhc_post(c, y, post, comb, 1, 1, streams, pool);
  EXPECT_FLOAT_EQ(streams[0], 0.5f * 2 + 0.9f * 1 + 0.2f * 10);
  EXPECT_FLOAT_EQ(streams[1], 1.5f * 2 + 0.1f * 1 + 0.8f * 10);
}
