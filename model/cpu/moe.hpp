#pragma once
// glm5_next feed-forward blocks: the clamped SwiGLU FFN (dense layers, every expert, the shared
// expert) and the routed MoE with its sigmoid router.
//
// Router (DeepSeek-V3 "noaux_tc"): s = sigmoid(W x) in f32; choice = s + e_score_correction_bias;
// groups of n_experts/n_group experts are scored by the sum of their two best choice scores and the
// best topk_group groups are kept; the top n_used experts of the kept groups by choice score are
// chosen; their weights are the *unbiased* s, divided by their sum (+1e-20) when norm_topk_prob, times
// routed_scaling_factor. The shared expert's output is added unscaled.
// Tie rule (both top-k steps): higher score first, then the lower index.
#include <cstddef>
#include <cstdint>

#include "model/cpu/cpu_ops.hpp"

namespace ferry::model {

struct RouterConfig {
  uint32_t n_experts = 0;
  uint32_t n_used = 0;
  uint32_t n_group = 1;
  uint32_t topk_group = 1;
  bool norm_topk_prob = true;
  float routed_scaling = 1.0f;
};

// One token: logits [n_experts] (W x) and bias [n_experts] -> experts [n_used] (in selection order:
// best first) and their weights [n_used].
void route_token(const RouterConfig& c, const float* logits, const float* bias, uint32_t* experts, float* weights);

// y [tokens][D] = down(swiglu_clamped(gate x, up x)); gate/up [F][D], down [D][F].
void swiglu_ffn(const WeightMatrix& gate, const WeightMatrix& up, const WeightMatrix& down, float limit,
                const float* x, size_t tokens, float* y, ThreadPool& pool);

struct MoeWeights {
  const WeightMatrix* router;        // [E][D]
  const float* bias;                 // [E]
  const WeightMatrix* gate_exps;     // [E*I][D]
  const WeightMatrix* up_exps;       // [E*I][D]
  const WeightMatrix* down_exps;     // [E*D][I]
  const WeightMatrix* gate_shexp;    // may be empty (no shared expert)
  const WeightMatrix* up_shexp;
  const WeightMatrix* down_shexp;
};

// y [tokens][D] = routed experts + shared expert. `route_counts`, when given, gets +1 per (token,
// chosen expert) for the expert-cache statistics.
void moe_ffn(const RouterConfig& c, const MoeWeights& w, float limit, size_t hidden, const float* x, size_t tokens,
             float* y, ThreadPool& pool, uint32_t* route_counts = nullptr);

}  // namespace ferry::model
