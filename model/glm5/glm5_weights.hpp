#pragma once
// The weights of a glm5_next GGUF file, by role and block, as the CPU forward pass reads them.
//
// Matrices stay in the file's mapping in whatever type the file stores (WeightMatrix: F32 rows are
// read in place, quantized rows are dequantized per row when a product needs them): a quantized model
// costs its file size, not four bytes per weight, which is what makes the CPU backend usable on a
// large model. The small tensors (norms, biases, mHC base/scale, conv taps, the indexer's APE, router
// bias) are dequantized to f32 vectors at load. Every tensor is checked against the weight table
// (model/glm5/glm5_tensors.hpp): a missing tensor, wrong dims or an unreadable type is an error naming it.
#include <filesystem>
#include <memory>
#include <vector>

#include "model/formats/gguf.hpp"
#include "model/formats/weight_matrix.hpp"
#include "model/glm5/glm5_hparams.hpp"
#include "model/glm5/glm5_tensors.hpp"

namespace ferry::model {

struct Glm5LayerWeights {
  uint32_t index = 0;
  LayerKind kind = LayerKind::kda;
  FfnKind ffn = FfnKind::dense;
  bool nextn = false;        // an MTP block: plain residual, no mHC
  bool has_indexer = false;  // DSA layer with its own indexer ("full")

  std::vector<float> attn_norm, ffn_norm;
  // mHC mixers: fn [(2+H)*H][H*D], base [(2+H)*H], scale [3]
  WeightMatrix hc_attn_fn, hc_ffn_fn;
  std::vector<float> hc_attn_base, hc_attn_scale, hc_ffn_base, hc_ffn_scale;

  // KDA
  WeightMatrix attn_q, attn_k, attn_v, ssm_f_a, ssm_f_b, ssm_g_a, ssm_g_b, ssm_beta;
  std::vector<float> conv_q, conv_k, conv_v;  // [channel][kernel]
  std::vector<float> ssm_a;                   // -exp(A_log), per head
  std::vector<float> ssm_dt_bias, ssm_norm;
  WeightMatrix attn_output;  // KDA and DSA

  // DSA (MLA): k_b rows are (head, latent) over nope, v_b rows (head, v) over the latent
  WeightMatrix attn_q_a, attn_q_b, attn_kv_a, attn_k_b, attn_v_b;
  std::vector<float> q_a_norm, kv_a_norm;
  WeightMatrix idx_q_b, idx_k, idx_proj, idx_gate;
  std::vector<float> idx_k_norm, idx_k_norm_bias, idx_ape;  // ape: [kpool][index_head_dim]

  // FFN: dense, or routed experts (stacked: expert e owns rows [e*rows, (e+1)*rows)) + shared expert
  WeightMatrix ffn_gate, ffn_up, ffn_down;
  WeightMatrix router;
  std::vector<float> router_bias;
  WeightMatrix gate_exps, up_exps, down_exps;
  WeightMatrix gate_shexp, up_shexp, down_shexp;

  // MTP block: eh_proj [D][2D]; its own embedding and head when the file has them
  WeightMatrix eh_proj, nextn_embed, nextn_head;
  std::vector<float> enorm, hnorm, shared_head_norm;
};

class Glm5Weights {
 public:
  // Opens and maps `path`, reads the hyper-parameters from its metadata and binds every tensor.
  static Expected<std::unique_ptr<Glm5Weights>> load(const std::filesystem::path& path);
  static Expected<std::unique_ptr<Glm5Weights>> from_file(GgufFile file);

  const Glm5Hparams& hparams() const { return hp_; }
  const GgufFile& file() const { return file_; }

  // The weight of `role` in block `layer` (-1 for the whole-model tensors) as load() bound it: a
  // matrix (glm5_tensor_is_vector false) or an f32 vector; empty when the file lacks an optional one.
  const WeightMatrix& matrix(Glm5Tensor role, int32_t layer) const;
  const std::vector<float>& vector(Glm5Tensor role, int32_t layer) const;

  WeightMatrix token_embd, output;
  std::vector<float> output_norm;
  std::vector<Glm5LayerWeights> layers;  // trunk blocks, then the MTP blocks

 private:
  explicit Glm5Weights(GgufFile file) : file_(std::move(file)) {}
  GgufFile file_;
  Glm5Hparams hp_;
};

}  // namespace ferry::model
