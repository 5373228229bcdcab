#pragma once
// The hyper-parameters of a glm5_next text model: everything the math and the memory plan need,
// read from GGUF metadata or a Hugging Face config.json (see glm5_hparams.cpp for the key table).
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "config/expected.hpp"

namespace ferry::model {

enum class LayerKind : uint8_t { kda, dsa };     // linear_attention / deepseek_sparse_attention
enum class FfnKind : uint8_t { dense, moe };     // mlp_layer_types: dense / sparse

struct Glm5Hparams {
  uint32_t vocab_size = 154880;
  uint32_t hidden_size = 4096;
  uint32_t n_layers = 45;        // trunk layers; the MTP block(s) follow at index n_layers
  uint32_t n_nextn_layers = 1;   // MTP blocks present in the file (0 when the file has none)
  float rms_eps = 1e-5f;
  uint32_t context_length = 1048576;  // max_position_embeddings: the trained context

  // FFN
  uint32_t dense_ffn = 12288;    // intermediate_size
  uint32_t moe_ffn = 2048;       // moe_intermediate_size (per expert, and per shared expert)
  uint32_t n_experts = 288;
  uint32_t n_experts_used = 8;
  uint32_t n_shared_experts = 1;
  uint32_t n_group = 1;
  uint32_t topk_group = 1;
  float routed_scaling = 2.5f;
  bool norm_topk_prob = true;
  float swiglu_limit = 10.0f;

  // MLA (DSA layers); qk_rope_head_dim is 0 in this model and must stay 0
  uint32_t n_heads = 64;
  uint32_t q_lora_rank = 1536;
  uint32_t kv_lora_rank = 512;
  uint32_t qk_nope_head_dim = 256;
  uint32_t v_head_dim = 256;

  // DSA lightning indexer
  uint32_t index_n_heads = 32;
  uint32_t index_head_dim = 128;
  uint32_t index_topk = 2048;
  uint32_t index_kpool = 4;
  bool index_select_tail = true;
  float index_norm_eps = 1e-6f;  // the indexer's k LayerNorm

  // KDA (linear attention)
  uint32_t kda_heads = 64;
  uint32_t kda_head_dim = 128;
  uint32_t conv_kernel = 4;
  float kda_lower_bound = -5.0f;

  // mHC hyper-connections
  uint32_t hc_mult = 4;
  uint32_t hc_sinkhorn_iters = 20;
  float hc_eps = 1e-6f;

  std::vector<LayerKind> layer_kinds;  // n_layers entries
  std::vector<FfnKind> ffn_kinds;      // n_layers entries
  // indexer_types: per trunk layer, false where a DSA layer is "shared" (it reuses the top-k of the
  // previous full layer and has no indexer weights). Empty means every layer is full (the release).
  std::vector<bool> indexer_full;

  bool indexer_is_full(uint32_t layer) const { return layer >= indexer_full.size() || indexer_full[layer]; }

  // Empty when consistent; else one line per problem, naming the field and the value.
  std::vector<std::string> validate() const;
};

class GgufFile;

// From a Hugging Face config.json of glm5_next (its text_config, or a flat text-only config),
// with transformers' defaults for absent fields. The result is validated. n_nextn_layers is the
// config's num_nextn_predict_layers (0 when absent): the converter lowers it to what the
// checkpoint holds. Errors name the file's field and value.
Expected<Glm5Hparams> glm5_hparams_from_hf_config(std::string_view json_text);
Expected<Glm5Hparams> glm5_hparams_from_hf_config_file(const std::filesystem::path& path);

// From GGUF metadata (general.architecture "glm5next" or "glm5-next"; see glm5_hparams.cpp for the
// keys). The result is validated. Errors name the missing or invalid key.
Expected<Glm5Hparams> glm5_hparams_from_gguf(const GgufFile& file);

}  // namespace ferry::model
