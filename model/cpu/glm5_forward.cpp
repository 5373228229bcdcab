#include "model/cpu/glm5_forward.hpp"

#include <stdexcept>
#include <string>

namespace ferry::model {

Glm5Forward::Glm5Forward(const Glm5Weights& weights, ThreadPool& pool)
    : w_(weights), hp_(weights.hparams()), pool_(pool), kda_(kda_config(hp_)), dsa_(dsa_config(hp_)) {
  mhc_.streams = hp_.hc_mult;
  mhc_.sinkhorn_iters = hp_.hc_sinkhorn_iters;
  mhc_.eps = hp_.hc_eps;
  mhc_.norm_eps = hp_.rms_eps;
  router_.n_experts = hp_.n_experts;
  router_.n_used = hp_.n_experts_used;
  router_.n_group = hp_.n_group;
  router_.topk_group = hp_.topk_group;
  router_.norm_topk_prob = hp_.norm_topk_prob;
  router_.routed_scaling = hp_.routed_scaling;
  route_counts_.assign(w_.layers.size() * hp_.n_experts, 0);
}

void Glm5Forward::embed(const WeightMatrix& table, std::span<const int32_t> tokens, float* out) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t id = tokens[i];
    if (id < 0 || static_cast<size_t>(id) >= table.rows) {
      throw std::out_of_range("token id " + std::to_string(id) + " outside the vocabulary of " +
                              std::to_string(table.rows));
    }
    table.row(static_cast<size_t>(id), out + i * table.cols);
  }
}

void Glm5Forward::ffn(const Glm5LayerWeights& l, const float* x, size_t rows, float* y, const RouteObserver* routes) {
  if (l.ffn == FfnKind::dense) {
    swiglu_ffn(l.ffn_gate, l.ffn_up, l.ffn_down, hp_.swiglu_limit, x, rows, y, pool_);
    return;
  }
  const MoeWeights mw{&l.router, l.router_bias.data(), &l.gate_exps, &l.up_exps, &l.down_exps,
                      &l.gate_shexp, &l.up_shexp, &l.down_shexp};
  if (routes != nullptr) {  // the product moe_ffn makes next, the same bits
    std::vector<float> logits(rows * hp_.n_experts);
    matmul(l.router, x, rows, logits.data(), pool_);
    (*routes)(l.index, logits);
  }
  moe_ffn(router_, mw, hp_.swiglu_limit, hp_.hidden_size, x, rows, y, pool_,
          route_counts_.data() + size_t{l.index} * hp_.n_experts);
}

void Glm5Forward::forward(std::span<const ForwardRows> requests, std::vector<float>& hidden,
                          const ForwardOptions& opt) {
  std::vector<float> streams;
  embed_streams(requests, streams);
  const size_t rows = streams.size() / (size_t{hp_.hc_mult} * hp_.hidden_size);
  run_layers({0, hp_.n_layers}, requests, streams.data(), opt);
  final_hidden(streams.data(), rows, hidden);
}

void Glm5Forward::embed_streams(std::span<const ForwardRows> requests, std::vector<float>& streams) {
  const size_t D = hp_.hidden_size, H = hp_.hc_mult;
  size_t rows = 0;
  for (const ForwardRows& r : requests) rows += r.tokens.size();
  std::vector<float> x(rows * D);
  size_t row = 0;
  for (const ForwardRows& r : requests) {
    embed(w_.token_embd, r.tokens, x.data() + row * D);
    row += r.tokens.size();
  }
  streams.resize(rows * H * D);
  for (size_t t = 0; t < rows; ++t) {
    for (size_t h = 0; h < H; ++h) std::copy_n(x.data() + t * D, D, streams.data() + (t * H + h) * D);
  }
}

void Glm5Forward::run_layers(LayerRange layers, std::span<const ForwardRows> requests, float* streams,
                             const ForwardOptions& opt) {
  const size_t D = hp_.hidden_size, H = hp_.hc_mult;
  size_t rows = 0;
  for (const ForwardRows& r : requests) rows += r.tokens.size();
  if (rows == 0) return;
  std::vector<float> x(rows * D), u(rows * D), y(rows * D), post(rows * H), comb(rows * H * H);

  // Each request's rows and start position are the same in every layer; only the state changes.
  std::vector<KdaSegment> kda_segs;
  std::vector<DsaSegment> dsa_segs;
  {
    size_t row = 0;
    for (const ForwardRows& r : requests) {
      kda_segs.push_back({row, r.tokens.size(), nullptr});
      dsa_segs.push_back({row, r.tokens.size(), r.state->tokens(), nullptr});
      row += r.tokens.size();
    }
  }

  DsaSelections selections;
  for (uint32_t il = layers.first; il < layers.end; ++il) {
    const Glm5LayerWeights& l = w_.layers[il];

    mhc_pre(mhc_, l.hc_attn_fn, l.hc_attn_base.data(), l.hc_attn_scale.data(), streams, rows, D, u.data(), post.data(),
            comb.data(), pool_);
    for (size_t t = 0; t < rows; ++t) rms_norm(u.data() + t * D, l.attn_norm.data(), D, hp_.rms_eps, x.data() + t * D);
    if (l.kind == LayerKind::kda) {
      for (size_t i = 0; i < requests.size(); ++i) kda_segs[i].state = &requests[i].state->kda(il);
      kda_layer(kda_, l, x.data(), rows, kda_segs, y.data(), pool_);
    } else {
      for (size_t i = 0; i < requests.size(); ++i) dsa_segs[i].cache = &requests[i].state->dsa(il);
      dsa_layer(dsa_, l, x.data(), rows, dsa_segs, y.data(), selections, pool_, opt.selections);
    }
    mhc_post(mhc_, y.data(), post.data(), comb.data(), rows, D, streams, pool_);

    mhc_pre(mhc_, l.hc_ffn_fn, l.hc_ffn_base.data(), l.hc_ffn_scale.data(), streams, rows, D, u.data(), post.data(),
            comb.data(), pool_);
    for (size_t t = 0; t < rows; ++t) rms_norm(u.data() + t * D, l.ffn_norm.data(), D, hp_.rms_eps, x.data() + t * D);
    ffn(l, x.data(), rows, y.data(), opt.routes);
    mhc_post(mhc_, y.data(), post.data(), comb.data(), rows, D, streams, pool_);
  }
  for (const ForwardRows& r : requests) r.state->advance(static_cast<uint32_t>(r.tokens.size()));
}

void Glm5Forward::final_hidden(const float* streams, size_t rows, std::vector<float>& hidden) {
  const size_t D = hp_.hidden_size, H = hp_.hc_mult;
  hidden.assign(rows * D, 0.0f);
  std::vector<float> m(D);
  for (size_t t = 0; t < rows; ++t) {
    std::fill(m.begin(), m.end(), 0.0f);
    for (size_t h = 0; h < H; ++h) {
      const float* s = streams + (t * H + h) * D;
      for (size_t d = 0; d < D; ++d) m[d] += s[d];
    }
    for (size_t d = 0; d < D; ++d) m[d] /= static_cast<float>(H);
    rms_norm(m.data(), w_.output_norm.data(), D, hp_.rms_eps, hidden.data() + t * D);
  }
}

void Glm5Forward::logits(const float* hidden, size_t rows, float* out) { matmul(w_.output, hidden, rows, out, pool_); }

void Glm5Forward::mtp_forward(SequenceState& state, const float* h, std::span<const int32_t> next_tokens,
                              std::vector<float>& hidden, const ForwardOptions& opt) {
  if (!has_mtp()) throw std::logic_error("this model file has no MTP block");
  const size_t D = hp_.hidden_size, rows = next_tokens.size();
  const Glm5LayerWeights& l = w_.layers[hp_.n_layers];
  std::vector<float> e(rows * D), cat(rows * 2 * D), x(rows * D), xn(rows * D), y(rows * D);
  embed(l.nextn_embed.empty() ? w_.token_embd : l.nextn_embed, next_tokens, e.data());
  for (size_t t = 0; t < rows; ++t) {
    rms_norm(e.data() + t * D, l.enorm.data(), D, hp_.rms_eps, cat.data() + t * 2 * D);
    rms_norm(h + t * D, l.hnorm.data(), D, hp_.rms_eps, cat.data() + t * 2 * D + D);
  }
  matmul(l.eh_proj, cat.data(), rows, x.data(), pool_);

  // A plain pre-norm residual block: the MTP block has no mHC mixers.
  for (size_t t = 0; t < rows; ++t) rms_norm(x.data() + t * D, l.attn_norm.data(), D, hp_.rms_eps, xn.data() + t * D);
  DsaSelections selections;
  const DsaSegment seg{0, rows, state.mtp_tokens(), &state.mtp(0)};
  dsa_layer(dsa_, l, xn.data(), rows, std::span<const DsaSegment>(&seg, 1), y.data(), selections, pool_,
            opt.selections);
  for (size_t i = 0; i < rows * D; ++i) x[i] += y[i];
  for (size_t t = 0; t < rows; ++t) rms_norm(x.data() + t * D, l.ffn_norm.data(), D, hp_.rms_eps, xn.data() + t * D);
  ffn(l, xn.data(), rows, y.data(), opt.routes);
  for (size_t i = 0; i < rows * D; ++i) x[i] += y[i];
  hidden.resize(rows * D);
  for (size_t t = 0; t < rows; ++t) rms_norm(x.data() + t * D, l.shared_head_norm.data(), D, hp_.rms_eps, hidden.data() + t * D);
}

void Glm5Forward::mtp_logits(const float* hidden, size_t rows, float* out) {
  const Glm5LayerWeights& l = w_.layers[hp_.n_layers];
  matmul(l.nextn_head.empty() ? w_.output : l.nextn_head, hidden, rows, out, pool_);
}

std::vector<uint32_t> Glm5Forward::take_route_counts() {
  std::vector<uint32_t> out(route_counts_.size(), 0);
  out.swap(route_counts_);
  return out;
}

}  // namespace ferry::model
