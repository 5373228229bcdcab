#pragma once
// Manifold-constrained hyper-connections (mHC): glm5_next keeps hc_mult residual streams per token
// and wraps each sublayer (attention, FFN) in a mixer computed from the streams themselves:
//   flat = unweighted_rmsnorm(concat streams); m = fn @ flat, split into pre (H), post (H), comb (H x H)
//   pre  = sigmoid(m_pre * scale0 + base_pre) + eps        (collapse weights: u = sum_h pre[h] R[h])
//   post = 2 sigmoid(m_post * scale1 + base_post)          (where the sublayer output goes)
//   comb = Sinkhorn(softmax_row(m_comb * scale2 + base_comb) + eps)   (stream mixer)
//   new R[j] = post[j] * y + sum_i comb[i][j] R[i]
#include <cstddef>
#include <cstdint>

#include "model/cpu/cpu_ops.hpp"

namespace ferry::model {

struct MhcConfig {
  uint32_t streams = 4;          // hc_mult
  uint32_t sinkhorn_iters = 20;  // one column pass after the softmax, then iters-1 (row, column) rounds
  float eps = 1e-6f;             // hc_eps
  float norm_eps = 1e-5f;        // the unweighted RMSNorm of the flattened streams (rms_norm_eps)
};

// From one token's mixing logits m [(2+H)*H] and the learned base [(2+H)*H] and scale [3]:
// pre [H], post [H] and the doubly-stochastic comb [H*H] (row i = input stream, column j = output).
void mhc_coefficients(const MhcConfig& c, const float* m, const float* base, const float* scale, float* pre,
                      float* post, float* comb);

// Sinkhorn-Knopp as glm5_next runs it, in place on an H x H matrix of positive entries: one column
// normalisation, then iters-1 rounds of (row, column), each dividing by (sum + eps).
void sinkhorn(float* comb, uint32_t h, uint32_t iters, float eps);

// The pre site for `tokens` rows of streams R [tokens][H][D]: u [tokens][D] (the sublayer's input
// before its own norm), and post [tokens][H], comb [tokens][H*H] for mhc_post.
void mhc_pre(const MhcConfig& c, const WeightMatrix& fn, const float* base, const float* scale, const float* streams,
             size_t tokens, size_t hidden, float* u, float* post, float* comb, ThreadPool& pool);

// The post site: streams [tokens][H][D] <- post * y + comb^T streams.
void mhc_post(const MhcConfig& c, const float* y, const float* post, const float* comb, size_t tokens, size_t hidden,
              float* streams, ThreadPool& pool);

}  // namespace ferry::model
