// The glm5_next weight table. Sources the names and dims were checked against (see the report of
// issue 2 for the URLs):
//  - GGUF names, dims and F32 pins: unslothai/llama.cpp src/models/glm5next.cpp (load_arch_tensors)
//    and conversion/glm5next.py (kv_b split, A_log -> -exp, conv reshape, expert stacking, APE
//    forced F32); the published UD files' DSA-layer shapes/types as listed by a GGUF validator
//    (attn_k_b {256,512,64}, attn_v_b {512,256,64}, indexer_compressor_ape {128,4} F32,
//    indexer.proj {4096,32} F32).
//  - Checkpoint names: transformers glm5_next modeling (module names and shapes), the unsloth
//    converter (per-expert weights, q/k/v_conv1d, bare hc_attn_fn, A_log, dt_bias,
//    index_kpool_compress_{gate,ape}) and an EXL3 packer for the released checkpoint
//    (model.language_model. prefix, self_attn.f_a_proj, mlp.gate.e_score_correction_bias, the MTP
//    block's eh_proj/enorm/hnorm/shared_head.norm at layers.45).
#include "model/glm5/glm5_tensors.hpp"

#include <algorithm>
#include <array>
#include <charconv>

namespace ferry::model {
namespace {

using T = Glm5Tensor;

struct RoleInfo {
  std::string_view suffix;
  bool keep_f32;
  bool vector;
};

// Indexed by Glm5Tensor. keep_f32 marks the small state that the forward pass reads in f32 (norms,
// biases, gates, mixers, the router): a few MB in all, and quantizing it changes which experts and
// pools get chosen. llama.cpp forces the same (1-D tensors, ffn_gate_inp, ssm_conv1d, the APE), and
// the published files keep indexer.proj and the mHC mixers F32 as well. `vector` marks what the
// forward pass reads as a plain f32 array rather than as a matrix of rows (the conv taps and the APE
// among them, whatever their dims).
constexpr std::array<RoleInfo, kGlm5TensorRoles> kRoles = {{
    {"token_embd.weight", false, false},
    {"output_norm.weight", true, true},
    {"output.weight", false, false},
    {"attn_norm.weight", true, true},
    {"ffn_norm.weight", true, true},
    {"hc_attn_fn.weight", true, false},
    {"hc_attn_base.weight", true, true},
    {"hc_attn_scale.weight", true, true},
    {"hc_ffn_fn.weight", true, false},
    {"hc_ffn_base.weight", true, true},
    {"hc_ffn_scale.weight", true, true},
    {"attn_q.weight", false, false},
    {"attn_k.weight", false, false},
    {"attn_v.weight", false, false},
    {"ssm_conv1d_q.weight", true, true},
    {"ssm_conv1d_k.weight", true, true},
    {"ssm_conv1d_v.weight", true, true},
    {"ssm_f_a.weight", false, false},
    {"ssm_f_b.weight", false, false},
    {"ssm_g_a.weight", false, false},
    {"ssm_g_b.weight", false, false},
    {"ssm_beta.weight", false, false},
    {"ssm_a", true, true},
    {"ssm_dt.bias", true, true},
    {"ssm_norm.weight", true, true},
    {"attn_output.weight", false, false},
    {"attn_q_a.weight", false, false},
    {"attn_q_a_norm.weight", true, true},
    {"attn_q_b.weight", false, false},
    {"attn_kv_a_mqa.weight", false, false},
    {"attn_kv_a_norm.weight", true, true},
    {"attn_k_b.weight", false, false},
    {"attn_v_b.weight", false, false},
    {"indexer.attn_q_b.weight", false, false},
    {"indexer.attn_k.weight", false, false},
    {"indexer.k_norm.weight", true, true},
    {"indexer.k_norm.bias", true, true},
    {"indexer.proj.weight", true, false},
    {"indexer_compressor_gate.weight", false, false},
    {"indexer_compressor_ape.weight", true, true},
    {"ffn_gate.weight", false, false},
    {"ffn_up.weight", false, false},
    {"ffn_down.weight", false, false},
    {"ffn_gate_inp.weight", true, false},
    {"exp_probs_b.bias", true, true},
    {"ffn_gate_exps.weight", false, false},
    {"ffn_up_exps.weight", false, false},
    {"ffn_down_exps.weight", false, false},
    {"ffn_gate_shexp.weight", false, false},
    {"ffn_up_shexp.weight", false, false},
    {"ffn_down_shexp.weight", false, false},
    {"nextn.eh_proj.weight", false, false},
    {"nextn.enorm.weight", true, true},
    {"nextn.hnorm.weight", true, true},
    {"nextn.shared_head_norm.weight", true, true},
    {"nextn.embed_tokens.weight", false, false},
    {"nextn.shared_head_head.weight", false, false},
}};

const RoleInfo& info(T role) { return kRoles[static_cast<size_t>(role)]; }

// The model's widths, named as in the GGUF shapes below.
struct Dims {
  uint64_t D, V, H, mix;                 // hidden, vocab, hc streams, mHC mix width (2+H)*H
  uint64_t kda_nh, kda_hd, kda_di, K;    // KDA heads, head dim, heads*head dim, conv kernel
  uint64_t nh, qlr, kvlr, nope, vd;      // MLA
  uint64_t ih, id, kpool;                // indexer
  uint64_t F, I, E, S;                   // dense ffn, expert ffn, experts, shared expert width

  explicit Dims(const Glm5Hparams& hp)
      : D(hp.hidden_size), V(hp.vocab_size), H(hp.hc_mult), mix((2 + uint64_t{hp.hc_mult}) * hp.hc_mult),
        kda_nh(hp.kda_heads), kda_hd(hp.kda_head_dim), kda_di(uint64_t{hp.kda_heads} * hp.kda_head_dim),
        K(hp.conv_kernel), nh(hp.n_heads), qlr(hp.q_lora_rank), kvlr(hp.kv_lora_rank),
        nope(hp.qk_nope_head_dim), vd(hp.v_head_dim), ih(hp.index_n_heads), id(hp.index_head_dim),
        kpool(hp.index_kpool), F(hp.dense_ffn), I(hp.moe_ffn), E(hp.n_experts),
        S(uint64_t{hp.moe_ffn} * hp.n_shared_experts) {}
};

Glm5TensorSpec make(T role, int32_t layer, std::vector<uint64_t> dims, bool optional = false) {
  Glm5TensorSpec s;
  s.role = role;
  s.layer = layer;
  s.name = glm5_tensor_name(role, layer);
  s.dims = std::move(dims);
  s.keep_f32 = info(role).keep_f32;
  s.optional = optional;
  s.expert = role == T::ffn_gate_exps || role == T::ffn_up_exps || role == T::ffn_down_exps;
  return s;
}

std::string layer_prefix(std::string_view text_prefix, int32_t layer) {
  return std::string(text_prefix) + "layers." + std::to_string(layer) + ".";
}

HfRecipe one(HfTransform t, std::string name, std::vector<uint64_t> shape) {
  HfRecipe r;
  r.transform = t;
  r.sources.push_back({std::move(name), std::move(shape)});
  return r;
}
HfRecipe copy(std::string name, std::vector<uint64_t> shape) {
  return one(HfTransform::copy, std::move(name), std::move(shape));
}

// The HF shape of a plain copy is the GGUF dims reversed.
std::vector<uint64_t> reversed(const std::vector<uint64_t>& dims) { return {dims.rbegin(), dims.rend()}; }

// Checkpoint-spelling name first, then the transformers-module spelling (when they differ).
std::vector<HfRecipe> copies(const std::vector<uint64_t>& hf_shape, std::string first, std::string second = {}) {
  std::vector<HfRecipe> out{copy(std::move(first), hf_shape)};
  if (!second.empty()) out.push_back(copy(std::move(second), hf_shape));
  return out;
}

std::vector<HfRecipe> expert_recipes(const Glm5Hparams& hp, const Dims& d, T role, const std::string& mlp) {
  const char* proj = role == T::ffn_gate_exps ? "gate_proj" : role == T::ffn_up_exps ? "up_proj" : "down_proj";
  const std::vector<uint64_t> per_expert =
      role == T::ffn_down_exps ? std::vector<uint64_t>{d.D, d.I} : std::vector<uint64_t>{d.I, d.D};
  HfRecipe stacked;
  stacked.transform = HfTransform::stack;
  stacked.sources.reserve(hp.n_experts);
  for (uint32_t e = 0; e < hp.n_experts; ++e) {
    stacked.sources.push_back({mlp + "experts." + std::to_string(e) + "." + proj + ".weight", per_expert});
  }
  std::vector<HfRecipe> out{std::move(stacked)};
  if (role == T::ffn_down_exps) {
    out.push_back(copy(mlp + "experts.down_proj", {d.E, d.D, d.I}));
  } else {
    HfRecipe fused = one(HfTransform::fused_half, mlp + "experts.gate_up_proj", {d.E, 2 * d.I, d.D});
    fused.part = role == T::ffn_gate_exps ? 0 : 1;
    out.push_back(std::move(fused));
  }
  return out;
}

std::vector<HfRecipe> conv_recipes(const Dims& d, T role, const std::string& attn) {
  const uint64_t part = role == T::ssm_conv1d_q ? 0 : role == T::ssm_conv1d_k ? 1 : 2;
  const char* own = part == 0 ? "q_conv1d.weight" : part == 1 ? "k_conv1d.weight" : "v_conv1d.weight";
  HfRecipe fused = one(HfTransform::slice, attn + "conv1d.weight", {3 * d.kda_di, 1, d.K});
  fused.offset = part * d.kda_di * d.K;
  fused.count = d.kda_di * d.K;
  return {copy(attn + own, {d.kda_di, 1, d.K}), std::move(fused)};
}

}  // namespace

uint64_t Glm5TensorSpec::n_elements() const {
  uint64_t n = 1;
  for (uint64_t v : dims) n *= v;
  return n;
}

std::string_view glm5_tensor_suffix(Glm5Tensor role) { return info(role).suffix; }

bool glm5_tensor_is_vector(Glm5Tensor role) { return info(role).vector; }

bool glm5_tensor_is_global(Glm5Tensor role) {
  return role == T::token_embd || role == T::output_norm || role == T::output;
}

std::string glm5_tensor_name(Glm5Tensor role, int32_t layer) {
  if (glm5_tensor_is_global(role)) return std::string(glm5_tensor_suffix(role));
  return "blk." + std::to_string(layer) + "." + std::string(glm5_tensor_suffix(role));
}

std::optional<std::pair<Glm5Tensor, int32_t>> parse_glm5_tensor_name(std::string_view name) {
  int32_t layer = -1;
  std::string_view suffix = name;
  if (name.starts_with("blk.")) {
    const std::string_view rest = name.substr(4);
    const size_t dot = rest.find('.');
    if (dot == std::string_view::npos || dot == 0) return std::nullopt;
    const std::string_view digits = rest.substr(0, dot);
    if (digits.size() > 1 && digits[0] == '0') return std::nullopt;  // one spelling per index
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), layer);
    if (ec != std::errc{} || end != digits.data() + digits.size() || layer < 0) return std::nullopt;
    suffix = rest.substr(dot + 1);
  }
  for (size_t i = 0; i < kRoles.size(); ++i) {
    const auto role = static_cast<Glm5Tensor>(i);
    if (kRoles[i].suffix != suffix) continue;
    if (glm5_tensor_is_global(role) != (layer < 0)) return std::nullopt;
    return std::pair{role, layer};
  }
  return std::nullopt;
}

LayerKind glm5_layer_kind(const Glm5Hparams& hp, uint32_t layer) {
  return layer < hp.layer_kinds.size() ? hp.layer_kinds[layer] : LayerKind::dsa;
}

uint32_t glm5_leading_dense_blocks(const Glm5Hparams& hp) {
  uint32_t n = 0;
  while (n < hp.ffn_kinds.size() && hp.ffn_kinds[n] == FfnKind::dense) ++n;
  return n;
}

FfnKind glm5_ffn_kind(const Glm5Hparams& hp, uint32_t layer) {
  if (layer < hp.ffn_kinds.size()) return hp.ffn_kinds[layer];
  return layer < glm5_leading_dense_blocks(hp) ? FfnKind::dense : FfnKind::moe;
}

bool glm5_has_indexer(const Glm5Hparams& hp, uint32_t layer) {
  return glm5_layer_kind(hp, layer) == LayerKind::dsa && hp.indexer_is_full(layer);
}

bool same_ggml_dims(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b) {
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    if ((i < a.size() ? a[i] : 1) != (i < b.size() ? b[i] : 1)) return false;
  }
  return true;
}

std::vector<Glm5TensorSpec> glm5_global_tensors(const Glm5Hparams& hp) {
  const Dims d(hp);
  return {make(T::token_embd, -1, {d.D, d.V}), make(T::output_norm, -1, {d.D}), make(T::output, -1, {d.D, d.V})};
}

std::vector<Glm5TensorSpec> glm5_layer_tensors(const Glm5Hparams& hp, uint32_t layer) {
  const Dims d(hp);
  const auto il = static_cast<int32_t>(layer);
  const bool nextn = glm5_is_nextn(hp, layer);
  std::vector<Glm5TensorSpec> out;
  auto add = [&](T role, std::vector<uint64_t> dims, bool optional = false) {
    out.push_back(make(role, il, std::move(dims), optional));
  };

  add(T::attn_norm, {d.D});
  if (!nextn) {  // the MTP block keeps a plain residual: no mHC mixers
    add(T::hc_attn_fn, {d.H * d.D, d.mix});
    add(T::hc_attn_base, {d.mix});
    add(T::hc_attn_scale, {3});
  }
  if (glm5_layer_kind(hp, layer) == LayerKind::kda) {
    add(T::attn_q, {d.D, d.kda_di});
    add(T::attn_k, {d.D, d.kda_di});
    add(T::attn_v, {d.D, d.kda_di});
    add(T::ssm_conv1d_q, {d.K, 1, d.kda_di, 1});
    add(T::ssm_conv1d_k, {d.K, 1, d.kda_di, 1});
    add(T::ssm_conv1d_v, {d.K, 1, d.kda_di, 1});
    add(T::ssm_f_a, {d.D, d.kda_hd});
    add(T::ssm_f_b, {d.kda_hd, d.kda_di});
    add(T::ssm_g_a, {d.D, d.kda_hd});
    add(T::ssm_g_b, {d.kda_hd, d.kda_di});
    add(T::ssm_beta, {d.D, d.kda_nh});
    add(T::ssm_a, {d.kda_nh});
    add(T::ssm_dt_bias, {d.kda_di});
    add(T::ssm_norm, {d.kda_hd});
    add(T::attn_output, {d.kda_di, d.D});
  } else {
    add(T::attn_q_a, {d.D, d.qlr});
    add(T::attn_q_a_norm, {d.qlr});
    add(T::attn_q_b, {d.qlr, d.nh * d.nope});
    add(T::attn_kv_a_mqa, {d.D, d.kvlr});
    add(T::attn_kv_a_norm, {d.kvlr});
    add(T::attn_k_b, {d.nope, d.kvlr, d.nh});
    add(T::attn_v_b, {d.kvlr, d.vd, d.nh});
    add(T::attn_output, {d.nh * d.vd, d.D});
    if (glm5_has_indexer(hp, layer)) {
      add(T::indexer_attn_q_b, {d.qlr, d.ih * d.id});
      add(T::indexer_attn_k, {d.D, d.id});
      add(T::indexer_k_norm, {d.id});
      add(T::indexer_k_norm_bias, {d.id});
      add(T::indexer_proj, {d.D, d.ih});
      add(T::indexer_compressor_gate, {d.D, d.id});
      add(T::indexer_compressor_ape, {d.id, d.kpool});
    }
  }

  add(T::ffn_norm, {d.D});
  if (!nextn) {
    add(T::hc_ffn_fn, {d.H * d.D, d.mix});
    add(T::hc_ffn_base, {d.mix});
    add(T::hc_ffn_scale, {3});
  }
  if (glm5_ffn_kind(hp, layer) == FfnKind::dense) {
    add(T::ffn_gate, {d.D, d.F});
    add(T::ffn_up, {d.D, d.F});
    add(T::ffn_down, {d.F, d.D});
  } else {
    add(T::ffn_gate_inp, {d.D, d.E});
    add(T::ffn_exp_probs_b, {d.E});
    add(T::ffn_gate_exps, {d.D, d.I, d.E});
    add(T::ffn_up_exps, {d.D, d.I, d.E});
    add(T::ffn_down_exps, {d.I, d.D, d.E});
    if (d.S > 0) {
      add(T::ffn_gate_shexp, {d.D, d.S});
      add(T::ffn_up_shexp, {d.D, d.S});
      add(T::ffn_down_shexp, {d.S, d.D});
    }
  }

  if (nextn) {
    add(T::nextn_eh_proj, {2 * d.D, d.D});
    add(T::nextn_enorm, {d.D});
    add(T::nextn_hnorm, {d.D});
    add(T::nextn_shared_head_norm, {d.D});
    // The release shares the trunk's embedding and head; an export may carry its own copies.
    add(T::nextn_embed_tokens, {d.D, d.V}, true);
    add(T::nextn_shared_head_head, {d.D, d.V}, true);
  }
  return out;
}

std::vector<Glm5TensorSpec> glm5_all_tensors(const Glm5Hparams& hp) {
  std::vector<Glm5TensorSpec> out = glm5_global_tensors(hp);
  for (uint32_t il = 0; il < glm5_block_count(hp); ++il) {
    std::vector<Glm5TensorSpec> layer = glm5_layer_tensors(hp, il);
    out.insert(out.end(), std::make_move_iterator(layer.begin()), std::make_move_iterator(layer.end()));
  }
  return out;
}

std::optional<Glm5TensorSpec> glm5_find_tensor(const Glm5Hparams& hp, Glm5Tensor role, int32_t layer) {
  if (glm5_tensor_is_global(role) != (layer < 0)) return std::nullopt;
  if (layer >= 0 && static_cast<uint32_t>(layer) >= glm5_block_count(hp)) return std::nullopt;
  std::vector<Glm5TensorSpec> specs =
      layer < 0 ? glm5_global_tensors(hp) : glm5_layer_tensors(hp, static_cast<uint32_t>(layer));
  for (Glm5TensorSpec& s : specs) {
    if (s.role == role) return std::move(s);
  }
  return std::nullopt;
}

std::vector<HfRecipe> glm5_hf_recipes(const Glm5Hparams& hp, const Glm5TensorSpec& spec,
                                      std::string_view text_prefix) {
  const Dims d(hp);
  const std::string tp(text_prefix);
  const std::vector<uint64_t> hf = reversed(spec.dims);
  if (spec.layer < 0) {
    switch (spec.role) {
      case T::token_embd: return copies(hf, tp + "embed_tokens.weight");
      case T::output_norm: return copies(hf, tp + "norm.weight");
      case T::output: return copies(hf, "lm_head.weight", tp + "embed_tokens.weight");  // else tied
      default: return {};
    }
  }
  const std::string p = layer_prefix(text_prefix, spec.layer);
  const std::string a = p + "self_attn.";
  const std::string ix = a + "indexer.";
  const std::string m = p + "mlp.";
  switch (spec.role) {
    case T::attn_norm: return copies(hf, p + "input_layernorm.weight");
    case T::ffn_norm: return copies(hf, p + "post_attention_layernorm.weight");
    case T::hc_attn_fn: return copies(hf, p + "hc_attn_fn", p + "attn_hc.fn");
    case T::hc_attn_base: return copies(hf, p + "hc_attn_base", p + "attn_hc.base");
    case T::hc_attn_scale: return copies(hf, p + "hc_attn_scale", p + "attn_hc.scale");
    case T::hc_ffn_fn: return copies(hf, p + "hc_ffn_fn", p + "ffn_hc.fn");
    case T::hc_ffn_base: return copies(hf, p + "hc_ffn_base", p + "ffn_hc.base");
    case T::hc_ffn_scale: return copies(hf, p + "hc_ffn_scale", p + "ffn_hc.scale");
    case T::attn_q: return copies(hf, a + "q_proj.weight");
    case T::attn_k: return copies(hf, a + "k_proj.weight");
    case T::attn_v: return copies(hf, a + "v_proj.weight");
    case T::ssm_conv1d_q:
    case T::ssm_conv1d_k:
    case T::ssm_conv1d_v: return conv_recipes(d, spec.role, a);
    case T::ssm_f_a: return copies(hf, a + "f_a_proj.weight", a + "forget_gate.f_a_proj.weight");
    case T::ssm_f_b: return copies(hf, a + "f_b_proj.weight", a + "forget_gate.f_b_proj.weight");
    case T::ssm_g_a: return copies(hf, a + "g_a_proj.weight");
    case T::ssm_g_b: return copies(hf, a + "g_b_proj.weight");
    case T::ssm_beta: return copies(hf, a + "b_proj.weight");
    case T::ssm_a:
      return {one(HfTransform::neg_exp, a + "A_log", {d.kda_nh}),
              one(HfTransform::neg_exp, a + "forget_gate.A_log", {d.kda_nh})};
    case T::ssm_dt_bias: return copies(hf, a + "dt_bias", a + "forget_gate.dt_bias");
    case T::ssm_norm: return copies(hf, a + "o_norm.weight");
    case T::attn_output: return copies(hf, a + "o_proj.weight");
    case T::attn_q_a: return copies(hf, a + "q_a_proj.weight");
    case T::attn_q_a_norm: return copies(hf, a + "q_a_layernorm.weight");
    case T::attn_q_b: return copies(hf, a + "q_b_proj.weight");
    case T::attn_kv_a_mqa: return copies(hf, a + "kv_a_proj_with_mqa.weight");
    case T::attn_kv_a_norm: return copies(hf, a + "kv_a_layernorm.weight");
    case T::attn_k_b:
      return {one(HfTransform::kv_b_k, a + "kv_b_proj.weight", {d.nh * (d.nope + d.vd), d.kvlr})};
    case T::attn_v_b:
      return {one(HfTransform::kv_b_v, a + "kv_b_proj.weight", {d.nh * (d.nope + d.vd), d.kvlr})};
    case T::indexer_attn_q_b: return copies(hf, ix + "wq_b.weight");
    case T::indexer_attn_k: return copies(hf, ix + "wk.weight");
    case T::indexer_k_norm: return copies(hf, ix + "k_norm.weight");
    case T::indexer_k_norm_bias: return copies(hf, ix + "k_norm.bias");
    case T::indexer_proj: return copies(hf, ix + "weights_proj.weight");
    case T::indexer_compressor_gate: return copies(hf, ix + "index_kpool_compress_gate");
    case T::indexer_compressor_ape: return copies(hf, ix + "index_kpool_compress_ape");
    case T::ffn_gate: return copies(hf, m + "gate_proj.weight");
    case T::ffn_up: return copies(hf, m + "up_proj.weight");
    case T::ffn_down: return copies(hf, m + "down_proj.weight");
    case T::ffn_gate_inp: return copies(hf, m + "gate.weight");
    case T::ffn_exp_probs_b: return copies(hf, m + "gate.e_score_correction_bias");
    case T::ffn_gate_exps:
    case T::ffn_up_exps:
    case T::ffn_down_exps: return expert_recipes(hp, d, spec.role, m);
    case T::ffn_gate_shexp: return copies(hf, m + "shared_experts.gate_proj.weight");
    case T::ffn_up_shexp: return copies(hf, m + "shared_experts.up_proj.weight");
    case T::ffn_down_shexp: return copies(hf, m + "shared_experts.down_proj.weight");
    case T::nextn_eh_proj: return copies(hf, p + "eh_proj.weight");
    case T::nextn_enorm: return copies(hf, p + "enorm.weight");
    case T::nextn_hnorm: return copies(hf, p + "hnorm.weight");
    case T::nextn_shared_head_norm: return copies(hf, p + "shared_head.norm.weight");
    case T::nextn_embed_tokens: return copies(hf, p + "embed_tokens.weight");
    case T::nextn_shared_head_head: return copies(hf, p + "shared_head.head.weight");
    case T::token_embd:
    case T::output_norm:
    case T::output: return {};
  }
  return {};
}

Glm5HfNameMap::Glm5HfNameMap(const Glm5Hparams& hp, std::string_view text_prefix) {
  for (const Glm5TensorSpec& spec : glm5_all_tensors(hp)) {
    std::vector<HfRecipe> recipes = glm5_hf_recipes(hp, spec, text_prefix);
    // The tied-embedding recipe of `output` reads the embedding, which belongs to token_embd.
    if (spec.role == T::output && recipes.size() > 1) recipes.resize(1);
    for (const HfRecipe& r : recipes) {
      for (const HfSource& s : r.sources) map_.emplace(s.name, spec.name);
    }
  }
}

const std::string* Glm5HfNameMap::gguf_name(std::string_view hf_name) const {
  const auto it = map_.find(hf_name);
  return it == map_.end() ? nullptr : &it->second;
}

bool glm5_hf_is_vision(std::string_view hf_name) {
  return hf_name.starts_with("model.visual.") || hf_name.starts_with("visual.") ||
         hf_name.starts_with("model.vision_tower.") || hf_name.starts_with("vision_tower.");
}

}  // namespace ferry::model
