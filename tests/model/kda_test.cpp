#include "model/cpu/kda.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

using namespace ferry::model;

namespace {

struct Inputs {
  size_t t, dk, dv;
  std::vector<float> q, k, v, g, beta, s0;
};

// Normalised q/k, gates in (-5, 0) with some near 0 (slow channels), a non-zero initial state.
Inputs make(size_t t, size_t dk, size_t dv, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  Inputs in{t, dk, dv, {}, {}, {}, {}, {}, {}};
  auto normed = [&](std::vector<float>& x, float scale) {
    x.resize(t * dk);
    for (size_t r = 0; r < t; ++r) {
      double ss = 0;
      for (size_t c = 0; c < dk; ++c) ss += std::pow(x[r * dk + c] = n(rng), 2);
      for (size_t c = 0; c < dk; ++c) x[r * dk + c] *= scale / static_cast<float>(std::sqrt(ss));
    }
  };
  normed(in.q, 1.0f / std::sqrt(static_cast<float>(dk)));
  normed(in.k, 1.0f);
  in.v.resize(t * dv);
  for (float& x : in.v) x = n(rng);
  in.g.resize(t * dk);
  for (size_t i = 0; i < in.g.size(); ++i) in.g[i] = -5.0f / (1.0f + std::exp(-(4.0f * u(rng) - 3.0f)));
  in.beta.resize(t);
  for (float& b : in.beta) b = u(rng);
  in.s0.resize(dk * dv);
  for (float& x : in.s0) x = 0.3f * n(rng);
  return in;
}

}  // namespace

TEST(Kda, ChunkedEqualsRecurrentAcrossChunkBoundaries) {
  for (size_t chunk : {1u, 7u, 64u}) {
    Inputs in = make(150, 16, 12, 11);
    std::vector<float> s_rec = in.s0, s_chk = in.s0, o_rec(in.t * in.dv), o_chk(in.t * in.dv);
    kda_recurrent(in.t, in.dk, in.dv, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), s_rec.data(),
                  o_rec.data());
    kda_chunked(in.t, in.dk, in.dv, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), s_chk.data(),
                o_chk.data(), chunk);
    for (size_t i = 0; i < o_rec.size(); ++i) ASSERT_NEAR(o_rec[i], o_chk[i], 2e-5f) << "chunk " << chunk << " at " << i;
    for (size_t i = 0; i < s_rec.size(); ++i) ASSERT_NEAR(s_rec[i], s_chk[i], 2e-5f) << "chunk " << chunk << " state " << i;
  }
}

TEST(Kda, SplittingASequenceContinuesTheState) {
  Inputs in = make(100, 8, 8, 5);
  std::vector<float> s_one = in.s0, s_two = in.s0, o_one(in.t * in.dv), o_two(in.t * in.dv);
  kda_chunked(in.t, in.dk, in.dv, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), s_one.data(),
              o_one.data(), 64);
  const size_t a = 37;
  kda_chunked(a, in.dk, in.dv, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), s_two.data(),
              o_two.data(), 64);
  kda_recurrent(in.t - a, in.dk, in.dv, in.q.data() + a * in.dk, in.k.data() + a * in.dk, in.v.data() + a * in.dv,
                in.g.data() + a * in.dk, in.beta.data() + a, s_two.data(), o_two.data() + a * in.dv);
  for (size_t i = 0; i < o_one.size(); ++i) ASSERT_NEAR(o_one[i], o_two[i], 2e-5f) << i;
}

TEST(Kda, StrongDecayForgetsTheInitialState) {
  // With g at the lower bound (-5) for 64 steps every channel decays by e^-320: the chunked form must
  // neither overflow nor produce NaN, and the initial state no longer matters.
  Inputs in = make(64, 4, 4, 2);
  std::fill(in.g.begin(), in.g.end(), -5.0f);
  std::vector<float> s = in.s0, zero(in.s0.size(), 0.0f), o(in.t * in.dv), o0(in.t * in.dv);
  kda_chunked(in.t, in.dk, in.dv, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), s.data(), o.data(), 64);
  kda_chunked(in.t, in.dk, in.dv, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), zero.data(),
              o0.data(), 64);
  for (size_t i = 0; i < s.size(); ++i) {
    ASSERT_TRUE(std::isfinite(s[i]));
    ASSERT_NEAR(s[i], zero[i], 1e-6f);
  }
  for (size_t i = in.dv * 8; i < o.size(); ++i) ASSERT_NEAR(o[i], o0[i], 1e-6f);
}
