#pragma once
// KDA (Kimi delta attention), glm5_next's linear-attention layer, and the per-slot state it keeps.
//
//   q, k, v = Wq x, Wk x, Wv x  -> depthwise causal conv (kernel K, state = last K-1 inputs) -> SiLU
//   q, k L2-normalised per head (x / sqrt(sum x^2 + 1e-6)), q *= head_dim^-0.5
//   g    = lower_bound * sigmoid(-ssm_a * (f_b(f_a x) + dt_bias))   (ssm_a = -exp(A_log); log decay < 0)
//   beta = sigmoid(W_beta x)                                         (per head)
//   per head, state S [dk][dv]:  S = diag(exp g) S;  delta = beta (v - S^T k);  S += k delta^T;  o = S^T q
//   out  = W_o( rmsnorm(o) * norm_w * sigmoid(g_b(g_a x)) )          (per head, eps = rms_eps)
//
// Decode (one token) runs that recurrence. Prefill runs the equivalent chunked form: within a chunk of
// L tokens, with G_t the in-chunk cumulative log decay, the deltas solve a unit lower-triangular system
//   delta_t = beta_t (v_t - S0^T (e^{G_t} k_t)) - sum_{s<t} beta_t (k_t . e^{G_t - G_s} k_s) delta_s
// and o_t = S0^T (e^{G_t} q_t) + sum_{s<=t} (q_t . e^{G_t - G_s} k_s) delta_s. The e^{G_t - G_s}
// products are formed as e^{G_t} * e^{-G_s} in double: with the gate's lower bound, |G| <= L*|bound|
// (320 for L = 64), far inside double's range, so nothing underflows or overflows.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "model/cpu/cpu_ops.hpp"

namespace ferry::model {

struct Glm5LayerWeights;

struct KdaConfig {
  uint32_t heads = 0;
  uint32_t head_dim = 0;
  uint32_t conv_kernel = 4;
  float lower_bound = -5.0f;
  float norm_eps = 1e-5f;  // the gated output norm (rms_norm_eps)
  size_t chunk = 64;       // chunk length of the prefill form
};

// One slot's state for one KDA layer.
struct KdaState {
  std::vector<float> conv;  // (K-1) x 3*heads*head_dim: the last K-1 conv inputs, oldest first
  std::vector<float> s;     // heads x head_dim (k) x head_dim (v)
  void reset(const KdaConfig& c);
};

// One head's recurrence over T tokens. q, k [T][dk] (normalised, q scaled), v [T][dv], g [T][dk],
// beta [T]; s [dk][dv] is the state, updated in place; o [T][dv].
void kda_recurrent(size_t tokens, size_t dk, size_t dv, const float* q, const float* k, const float* v,
                   const float* g, const float* beta, float* s, float* o);
// The same in the chunked form (chunks of `chunk` tokens from the first); equal up to rounding.
void kda_chunked(size_t tokens, size_t dk, size_t dv, const float* q, const float* k, const float* v, const float* g,
                 const float* beta, float* s, float* o, size_t chunk);

// Rows [row0, row0 + rows) of a step belong to one slot, whose state for this layer is `state`.
struct KdaSegment {
  size_t row0 = 0;
  size_t rows = 0;
  KdaState* state = nullptr;
};

// The whole layer: x [tokens][D] (after the layer's input norm) -> y [tokens][D]. A segment of one
// row uses the recurrence, longer ones the chunked form.
void kda_layer(const KdaConfig& c, const Glm5LayerWeights& w, const float* x, size_t tokens,
               std::span<const KdaSegment> segments, float* y, ThreadPool& pool);

}  // namespace ferry::model
