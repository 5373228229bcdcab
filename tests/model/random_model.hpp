#pragma once
// Random glm5_next models for tests: values of a plausible size per role, written as a GGUF file with
// GgufWriter. The CPU and CUDA stage tests both build their models here.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "model/formats/gguf_writer.hpp"
#include "model/formats/quant.hpp"
#include "model/glm5/glm5_gguf.hpp"
#include "model/glm5/glm5_tensors.hpp"

namespace ferry::testing {

inline std::vector<float> random_values(const model::Glm5TensorSpec& s, std::mt19937& rng) {
  using T = model::Glm5Tensor;
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> v(s.n_elements());
  const float fan_in = static_cast<float>(s.dims[0]);
  for (float& x : v) {
    switch (s.role) {
      case T::token_embd: x = n(rng); break;
      case T::ssm_a: x = -std::exp(0.5f * n(rng)); break;
      case T::ssm_dt_bias: x = n(rng) - 1.0f; break;
      case T::hc_attn_base: case T::hc_ffn_base: case T::indexer_compressor_ape: x = 0.5f * n(rng); break;
      case T::hc_attn_scale: case T::hc_ffn_scale: x = 0.5f + u(rng); break;
      case T::indexer_k_norm_bias: case T::ffn_exp_probs_b: x = 0.1f * n(rng); break;
      case T::ssm_conv1d_q: case T::ssm_conv1d_k: case T::ssm_conv1d_v: x = 0.5f * n(rng); break;
      default: x = s.dims.size() == 1 ? 0.7f + 0.6f * u(rng) : n(rng) / std::sqrt(fan_in);
    }
  }
  return v;
}

// A temporary GGUF path for `tag`, unique to this process.
inline std::filesystem::path temp_model_path(const std::string& tag) {
  return std::filesystem::temp_directory_path() / (tag + "_" + std::to_string(::getpid()) + ".gguf");
}

// Writes a random model of `hp` to `path`: matrices of `type` where their rows are whole blocks (else
// Q8_0, else F32), small state F32. Returns false when writing failed.
inline bool write_random_model(const model::Glm5Hparams& hp, model::GgmlType type, const std::filesystem::path& path,
                               uint32_t seed) {
  model::GgufWriter w;
  if (model::write_glm5_hparams(w, hp)) return false;
  std::mt19937 rng(seed);
  for (const model::Glm5TensorSpec& s : model::glm5_all_tensors(hp)) {
    if (s.optional) continue;
    model::GgmlType t = s.keep_f32 || s.dims.size() == 1 ? model::GgmlType::F32 : type;
    if (s.dims[0] % model::ggml_type_traits(t).block_elems != 0) {
      t = s.dims[0] % 32 == 0 ? model::GgmlType::Q8_0 : model::GgmlType::F32;
    }
    auto values = std::make_shared<std::vector<float>>(random_values(s, rng));
    if (w.add_tensor(s.name, s.dims, t, [values, t](model::GgufSink& out) {
          std::vector<uint8_t> bytes(*model::ggml_bytes(t, values->size()));
          model::quantize_row(t, values->data(), bytes.data(), values->size());
          out.write(bytes.data(), bytes.size());
        })) {
      return false;
    }
  }
  return w.write_file(path).ok();
}

// The CPU tests' 5-layer shape: KDA and DSA layers, dense and MoE FFNs, an MTP block, a sparse
// indexer (index_topk 8 below the prompts) and a "shared" DSA layer (layer 4 reuses layer 3's selection).
inline model::Glm5Hparams five_layer_hparams() {
  using model::FfnKind;
  using model::LayerKind;
  model::Glm5Hparams hp;
  hp.vocab_size = 97;
  hp.hidden_size = 32;
  hp.n_layers = 5;
  hp.n_nextn_layers = 1;
  hp.dense_ffn = 48;
  hp.moe_ffn = 16;
  hp.n_experts = 6;
  hp.n_experts_used = 2;
  hp.n_group = 3;
  hp.topk_group = 2;
  hp.n_heads = 2;
  hp.q_lora_rank = 24;
  hp.kv_lora_rank = 16;
  hp.qk_nope_head_dim = 8;
  hp.v_head_dim = 12;
  hp.index_n_heads = 16;
  hp.index_head_dim = 8;
  hp.index_topk = 8;
  hp.index_kpool = 4;
  hp.kda_heads = 2;
  hp.kda_head_dim = 8;
  hp.hc_mult = 4;
  hp.context_length = 4096;
  hp.routed_scaling = 2.5f;
  hp.swiglu_limit = 1.5f;
  hp.layer_kinds = {LayerKind::kda, LayerKind::dsa, LayerKind::kda, LayerKind::dsa, LayerKind::dsa};
  hp.ffn_kinds = {FfnKind::dense, FfnKind::moe, FfnKind::moe, FfnKind::moe, FfnKind::moe};
  hp.indexer_full = {true, true, true, true, false};
  return hp;
}

}  // namespace ferry::testing
