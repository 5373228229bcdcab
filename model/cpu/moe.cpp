#include "model/cpu/moe.hpp"

#include <algorithm>
#include <numeric>
#include <vector>

namespace ferry::model {
namespace {

// Indices of the k largest values of v (higher value first, then the lower index).
void top_k_indices(const std::vector<float>& v, uint32_t k, std::vector<uint32_t>& out) {
  out.resize(v.size());
  std::iota(out.begin(), out.end(), 0u);
  std::partial_sort(out.begin(), out.begin() + k, out.end(), HigherValueFirst{v.data()});
  out.resize(k);
}

}  // namespace

void route_token(const RouterConfig& c, const float* logits, const float* bias, uint32_t* experts, float* weights) {
  const uint32_t n = c.n_experts;
  std::vector<float> s(n), choice(n);
  for (uint32_t e = 0; e < n; ++e) {
    s[e] = sigmoid(logits[e]);
    choice[e] = s[e] + bias[e];
  }
  if (c.n_group > 1 && c.topk_group < c.n_group) {
    const uint32_t per = n / c.n_group;
    std::vector<float> group_score(c.n_group);
    for (uint32_t g = 0; g < c.n_group; ++g) {
      float best = -INFINITY, second = -INFINITY;
      for (uint32_t e = g * per; e < (g + 1) * per; ++e) {
        if (choice[e] > best) {
          second = best;
          best = choice[e];
        } else if (choice[e] > second) {
          second = choice[e];
        }
      }
      group_score[g] = best + second;
    }
    std::vector<uint32_t> keep;
    top_k_indices(group_score, c.topk_group, keep);
    std::vector<bool> kept(c.n_group, false);
    for (uint32_t g : keep) kept[g] = true;
    for (uint32_t e = 0; e < n; ++e) {
      if (!kept[e / per]) choice[e] = -INFINITY;
    }
  }
  std::vector<uint32_t> chosen;
  top_k_indices(choice, c.n_used, chosen);
  double sum = 0.0;
  for (uint32_t i = 0; i < c.n_used; ++i) {
    experts[i] = chosen[i];
    weights[i] = s[chosen[i]];
    sum += weights[i];
  }
  const float denom = c.norm_topk_prob ? static_cast<float>(sum) + 1e-20f : 1.0f;
  for (uint32_t i = 0; i < c.n_used; ++i) weights[i] = weights[i] / denom * c.routed_scaling;
}

void swiglu_ffn(const WeightMatrix& gate, const WeightMatrix& up, const WeightMatrix& down, float limit,
                const float* x, size_t tokens, float* y, ThreadPool& pool) {
  const size_t f = gate.rows;
  std::vector<float> g(tokens * f), u(tokens * f);
  matmul(gate, x, tokens, g.data(), pool);
  matmul(up, x, tokens, u.data(), pool);
  swiglu_clamped(g.data(), u.data(), g.size(), limit);
  matmul(down, g.data(), tokens, y, pool);
}

void moe_ffn(const RouterConfig& c, const MoeWeights& w, float limit, size_t hidden, const float* x, size_t tokens,
             float* y, ThreadPool& pool, uint32_t* route_counts) {
  const uint32_t n = c.n_experts, k = c.n_used;
  std::vector<float> logits(tokens * n);
  matmul(*w.router, x, tokens, logits.data(), pool);
  std::vector<uint32_t> chosen(tokens * k);
  std::vector<float> weight(tokens * k);
  for (size_t t = 0; t < tokens; ++t) {
    route_token(c, logits.data() + t * n, w.bias, chosen.data() + t * k, weight.data() + t * k);
  }

  // Tokens per expert, so that each expert's rows are read once for all its tokens.
  std::vector<std::vector<std::pair<size_t, float>>> users(n);
  for (size_t t = 0; t < tokens; ++t) {
    for (uint32_t i = 0; i < k; ++i) users[chosen[t * k + i]].push_back({t, weight[t * k + i]});
  }
  std::fill(y, y + tokens * hidden, 0.0f);
  const size_t inter = w.gate_exps->rows / n;
  std::vector<float> xs, out;
  for (uint32_t e = 0; e < n; ++e) {
    const auto& us = users[e];
    if (us.empty()) continue;
    if (route_counts != nullptr) route_counts[e] += static_cast<uint32_t>(us.size());
    xs.resize(us.size() * hidden);
    for (size_t i = 0; i < us.size(); ++i) std::copy_n(x + us[i].first * hidden, hidden, xs.data() + i * hidden);
    out.resize(us.size() * hidden);
    swiglu_ffn(w.gate_exps->slice_rows(e * inter, inter), w.up_exps->slice_rows(e * inter, inter),
               w.down_exps->slice_rows(size_t{e} * hidden, hidden), limit, xs.data(), us.size(), out.data(), pool);
    for (size_t i = 0; i < us.size(); ++i) {
      float* yt = y + us[i].first * hidden;
      const float wt = us[i].second;
      const float* o = out.data() + i * hidden;
      for (size_t d = 0; d < hidden; ++d) yt[d] += wt * o[d];
    }
  }
  if (w.gate_shexp != nullptr && !w.gate_shexp->empty()) {
    out.resize(tokens * hidden);
    swiglu_ffn(*w.gate_shexp, *w.up_shexp, *w.down_shexp, limit, x, tokens, out.data(), pool);
    for (size_t i = 0; i < tokens * hidden; ++i) y[i] += out[i];
  }
}

}  // namespace ferry::model
