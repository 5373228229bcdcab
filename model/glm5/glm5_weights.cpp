#include "model/glm5/glm5_weights.hpp"

#include <string>
#include <type_traits>

#include "model/formats/quant.hpp"
#include "model/glm5/glm5_tensors.hpp"

namespace ferry::model {
namespace {

using T = Glm5Tensor;

std::string dims_text(const std::vector<uint64_t>& dims) {
  std::string s = "{";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "}";
}

// Where each role lands in Glm5LayerWeights (or the globals): a matrix or an f32 vector, const when
// the weights are.
template <class W>
struct Slot {
  template <class X>
  using Like = std::conditional_t<std::is_const_v<W>, const X, X>;
  Like<WeightMatrix>* matrix = nullptr;
  Like<std::vector<float>>* vec = nullptr;
};

template <class W>
Slot<W> slot_for(W& w, typename Slot<W>::template Like<Glm5LayerWeights>* l, T role) {
  switch (role) {
    case T::token_embd: return {&w.token_embd, nullptr};
    case T::output_norm: return {nullptr, &w.output_norm};
    case T::output: return {&w.output, nullptr};
    case T::attn_norm: return {nullptr, &l->attn_norm};
    case T::ffn_norm: return {nullptr, &l->ffn_norm};
    case T::hc_attn_fn: return {&l->hc_attn_fn, nullptr};
    case T::hc_attn_base: return {nullptr, &l->hc_attn_base};
    case T::hc_attn_scale: return {nullptr, &l->hc_attn_scale};
    case T::hc_ffn_fn: return {&l->hc_ffn_fn, nullptr};
    case T::hc_ffn_base: return {nullptr, &l->hc_ffn_base};
    case T::hc_ffn_scale: return {nullptr, &l->hc_ffn_scale};
    case T::attn_q: return {&l->attn_q, nullptr};
    case T::attn_k: return {&l->attn_k, nullptr};
    case T::attn_v: return {&l->attn_v, nullptr};
    case T::ssm_conv1d_q: return {nullptr, &l->conv_q};
    case T::ssm_conv1d_k: return {nullptr, &l->conv_k};
    case T::ssm_conv1d_v: return {nullptr, &l->conv_v};
    case T::ssm_f_a: return {&l->ssm_f_a, nullptr};
    case T::ssm_f_b: return {&l->ssm_f_b, nullptr};
    case T::ssm_g_a: return {&l->ssm_g_a, nullptr};
    case T::ssm_g_b: return {&l->ssm_g_b, nullptr};
    case T::ssm_beta: return {&l->ssm_beta, nullptr};
    case T::ssm_a: return {nullptr, &l->ssm_a};
    case T::ssm_dt_bias: return {nullptr, &l->ssm_dt_bias};
    case T::ssm_norm: return {nullptr, &l->ssm_norm};
    case T::attn_output: return {&l->attn_output, nullptr};
    case T::attn_q_a: return {&l->attn_q_a, nullptr};
    case T::attn_q_a_norm: return {nullptr, &l->q_a_norm};
    case T::attn_q_b: return {&l->attn_q_b, nullptr};
    case T::attn_kv_a_mqa: return {&l->attn_kv_a, nullptr};
    case T::attn_kv_a_norm: return {nullptr, &l->kv_a_norm};
    case T::attn_k_b: return {&l->attn_k_b, nullptr};
    case T::attn_v_b: return {&l->attn_v_b, nullptr};
    case T::indexer_attn_q_b: return {&l->idx_q_b, nullptr};
    case T::indexer_attn_k: return {&l->idx_k, nullptr};
    case T::indexer_k_norm: return {nullptr, &l->idx_k_norm};
    case T::indexer_k_norm_bias: return {nullptr, &l->idx_k_norm_bias};
    case T::indexer_proj: return {&l->idx_proj, nullptr};
    case T::indexer_compressor_gate: return {&l->idx_gate, nullptr};
    case T::indexer_compressor_ape: return {nullptr, &l->idx_ape};
    case T::ffn_gate: return {&l->ffn_gate, nullptr};
    case T::ffn_up: return {&l->ffn_up, nullptr};
    case T::ffn_down: return {&l->ffn_down, nullptr};
    case T::ffn_gate_inp: return {&l->router, nullptr};
    case T::ffn_exp_probs_b: return {nullptr, &l->router_bias};
    case T::ffn_gate_exps: return {&l->gate_exps, nullptr};
    case T::ffn_up_exps: return {&l->up_exps, nullptr};
    case T::ffn_down_exps: return {&l->down_exps, nullptr};
    case T::ffn_gate_shexp: return {&l->gate_shexp, nullptr};
    case T::ffn_up_shexp: return {&l->up_shexp, nullptr};
    case T::ffn_down_shexp: return {&l->down_shexp, nullptr};
    case T::nextn_eh_proj: return {&l->eh_proj, nullptr};
    case T::nextn_enorm: return {nullptr, &l->enorm};
    case T::nextn_hnorm: return {nullptr, &l->hnorm};
    case T::nextn_shared_head_norm: return {nullptr, &l->shared_head_norm};
    case T::nextn_embed_tokens: return {&l->nextn_embed, nullptr};
    case T::nextn_shared_head_head: return {&l->nextn_head, nullptr};
  }
  return {};
}

}  // namespace

const WeightMatrix& Glm5Weights::matrix(Glm5Tensor role, int32_t layer) const {
  const auto slot = slot_for(*this, layer >= 0 ? &layers.at(static_cast<size_t>(layer)) : nullptr, role);
  static const WeightMatrix none;
  return slot.matrix != nullptr ? *slot.matrix : none;
}

const std::vector<float>& Glm5Weights::vector(Glm5Tensor role, int32_t layer) const {
  const auto slot = slot_for(*this, layer >= 0 ? &layers.at(static_cast<size_t>(layer)) : nullptr, role);
  static const std::vector<float> none;
  return slot.vec != nullptr ? *slot.vec : none;
}

Expected<std::unique_ptr<Glm5Weights>> Glm5Weights::load(const std::filesystem::path& path) {
  Expected<GgufFile> file = GgufFile::open(path);
  if (!file) return file.error();
  return from_file(std::move(file.value()));
}

Expected<std::unique_ptr<Glm5Weights>> Glm5Weights::from_file(GgufFile file) {
  Expected<Glm5Hparams> hp = glm5_hparams_from_gguf(file);
  if (!hp) return hp.error();
  std::unique_ptr<Glm5Weights> w(new Glm5Weights(std::move(file)));
  w->hp_ = hp.value();
  const Glm5Hparams& h = w->hp_;

  w->layers.resize(glm5_block_count(h));
  for (uint32_t il = 0; il < w->layers.size(); ++il) {
    Glm5LayerWeights& l = w->layers[il];
    l.index = il;
    l.kind = glm5_layer_kind(h, il);
    l.ffn = glm5_ffn_kind(h, il);
    l.nextn = glm5_is_nextn(h, il);
    l.has_indexer = glm5_has_indexer(h, il);
  }

  for (const Glm5TensorSpec& spec : glm5_all_tensors(h)) {
    const GgufTensorInfo* info = w->file_.find_tensor(spec.name);
    if (info == nullptr) {
      if (spec.optional) continue;
      return Error("tensor " + spec.name + " is missing (expected dims " + dims_text(spec.dims) + ")");
    }
    if (!same_ggml_dims(info->dims, spec.dims)) {
      return Error("tensor " + spec.name + " has dims " + dims_text(info->dims) + ", expected " +
                   dims_text(spec.dims));
    }
    const GgmlTypeTraits traits = ggml_type_traits(info->type);
    if (!can_dequantize(info->type)) {
      return Error(ErrorCode::unsupported,
                   "tensor " + spec.name + " has type " + std::string(traits.name) + ", which ferry cannot read");
    }
    const uint64_t cols = info->dims.empty() ? 1 : info->dims[0];
    if (cols % traits.block_elems != 0) {
      return Error("tensor " + spec.name + " has rows of " + std::to_string(cols) + " elements, not a multiple of " +
                   std::to_string(traits.block_elems) + " (the block of " + std::string(traits.name) + ")");
    }
    Glm5LayerWeights* layer = spec.layer >= 0 ? &w->layers[static_cast<size_t>(spec.layer)] : nullptr;
    const auto slot = slot_for(*w, layer, spec.role);
    if (slot.vec != nullptr) {
      slot.vec->resize(info->n_elements);
      dequantize_row(info->type, info->data.data(), slot.vec->data(), info->n_elements);
    } else if (slot.matrix != nullptr) {
      WeightMatrix& m = *slot.matrix;
      m.type = info->type;
      m.data = info->data.data();
      m.cols = cols;
      m.rows = info->n_elements / cols;
      m.row_bytes = *ggml_bytes(info->type, cols);
    }
  }
  return w;
}

}  // namespace ferry::model
