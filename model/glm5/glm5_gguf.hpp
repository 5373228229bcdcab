#pragma once
// The glm5next GGUF metadata keys, in one place for the reader (glm5_hparams_from_gguf, in
// glm5_gguf_read.cpp) and the writer (write_glm5_hparams, in glm5_gguf_write.cpp). Keys are
// "{arch}.{suffix}"; ferry writes arch "glm5next" (the published files, unsloth's fork, ik_llama.cpp)
// and reads "glm5-next" too (mainline llama.cpp's later spelling, same keys).
//
// | suffix                                  | type      | Glm5Hparams            | source                    |
// |-----------------------------------------|-----------|------------------------|---------------------------|
// | block_count                             | u32       | n_layers + n_nextn     | [u] 46 = 45 + 1 NextN     |
// | nextn_predict_layers                    | u32       | n_nextn_layers         | [u] optional (0)          |
// | context_length                          | u32       | context_length         | [u] optional              |
// | embedding_length                        | u32       | hidden_size            | [u]                       |
// | feed_forward_length                     | u32       | dense_ffn              | [u]                       |
// | leading_dense_block_count               | u32       | ffn_kinds (prefix)     | [u]                       |
// | feed_forward_types                      | u32[n]    | ffn_kinds: 1 dense     | ferry's own: read when    |
// |                                         |           |                        | present, written only when the dense blocks are not a leading run (test models; llama.cpp-family loaders cannot load those) |
// | vocab_size                              | u32       | vocab_size             | [u] else tokenizer tokens |
// | attention.head_count                    | u32       | n_heads (and KDA heads)| [u]                       |
// | attention.head_count_kv                 | i32[blk]  | layer_kinds: 0 KDA     | [u] per-layer array; [m] one per trunk block read too |
// | attention.q_lora_rank / kv_lora_rank    | u32       | q/kv_lora_rank         | [u]                       |
// | attention.key_length / value_length     | u32       | (= kv_lora_rank)       | [u] written, checked      |
// | attention.key_length_mla                | u32       | qk_nope_head_dim       | [u]                       |
// | attention.value_length_mla              | u32       | v_head_dim             | [u]                       |
// | rope.dimension_count                    | u32       | (must be 0)            | [u]                       |
// | attention.layer_norm_rms_epsilon        | f32       | rms_eps                | [u]                       |
// | attention.layer_norm_epsilon            | f32       | index_norm_eps         | [u] optional (1e-6)       |
// | ssm.conv_kernel                         | u32       | conv_kernel            | [u]                       |
// | kda.head_dim                            | u32       | kda_head_dim           | [u]                       |
// | kda.gate_lower_bound                    | f32       | kda_lower_bound        | [u] [m] optional (-5)     |
// | kda.head_count                          | u32       | kda_heads              | ferry's own: read when    |
// |                                         |           |                        | present, written only when it differs from attention.head_count (test models; llama.cpp-family loaders cannot load those) |
// | attention.indexer.head_count            | u32       | index_n_heads          | [u]                       |
// | attention.indexer.key_length            | u32       | index_head_dim         | [u]                       |
// | attention.indexer.top_k                 | u32       | index_topk             | [u]                       |
// | attention.indexer.kpool                 | u32       | index_kpool            | [u] [m]                   |
// | attention.indexer.block_size            | u32       | index_kpool            | [e] read when kpool is absent; written too |
// | attention.indexer.kpool_select_tail     | bool      | index_select_tail      | [m] optional (true)       |
// | attention.indexer.types                 | u32[n]    | indexer_full (1 full)  | [m] optional (all full); [m] writes bool[n] |
// | hyper_connection.count                  | u32       | hc_mult                | [u]                       |
// | hyper_connection.sinkhorn_iterations    | u32       | hc_sinkhorn_iters      | [u]                       |
// | hyper_connection.epsilon                | f32       | hc_eps                 | [u]                       |
// | expert_count / expert_used_count        | u32       | n_experts / _used      | [u]                       |
// | expert_feed_forward_length              | u32       | moe_ffn                | [u]                       |
// | expert_shared_count                     | u32       | n_shared_experts       | [u]                       |
// | expert_shared_feed_forward_length       | u32       | (= moe_ffn * shared)   | [u] optional, checked     |
// | expert_group_count / group_used_count   | u32       | n_group / topk_group   | [c] optional (1)          |
// | expert_weights_scale                    | f32       | routed_scaling         | [u]                       |
// | expert_weights_norm                     | bool      | norm_topk_prob         | [u] optional (false)      |
// | expert_gating_func                      | u32       | (must be 2, sigmoid)   | [u] optional              |
// | swiglu_clamp_exp / swiglu_clamp_shexp   | f32[blk]  | swiglu_limit (all equal)| [u] a scalar is read too |
//
// [u] unslothai/llama.cpp conversion/glm5next.py (set_gguf_parameters) and src/models/glm5next.cpp
//     (load_arch_hparams); the published unsloth files carry these.
// [m] mainline llama.cpp PR #27773 (glm5-next): kpool, kpool_select_tail, indexer.types. Its
//     conversion/glm.py also writes indexer.index_share_mtp (ignored), writes kda.gate_lower_bound only
//     when the config has one, no expert_shared_feed_forward_length, tokenizer.ggml.pre "glm5" (the
//     glm4 pre-tokenizer), and at one point head_count_kv with one entry per trunk block while
//     block_count counts the MTP block (its loader then refused the published files' 46 entries).
// [e] ggml-org/llama.cpp conversion/glm5next.py at e972e2ca wrote the pool size as
//     attention.indexer.block_size (PR #27752's loaders assert it, hence --override-kv ...block_size=int:4).
// [c] the published files ship expert_group_count 1 (a GGUF-reading engine checks it).
#include <string>
#include <string_view>
#include <vector>

#include "model/formats/gguf.hpp"
#include "model/glm5/glm5_hparams.hpp"

namespace ferry::model {

inline constexpr std::string_view kGlm5Arch = "glm5next";
inline constexpr std::string_view kGlm5ArchMainline = "glm5-next";

namespace glm5_key {
inline constexpr std::string_view block_count = "block_count";
inline constexpr std::string_view nextn_predict_layers = "nextn_predict_layers";
inline constexpr std::string_view context_length = "context_length";
inline constexpr std::string_view embedding_length = "embedding_length";
inline constexpr std::string_view feed_forward_length = "feed_forward_length";
inline constexpr std::string_view leading_dense_block_count = "leading_dense_block_count";
inline constexpr std::string_view feed_forward_types = "feed_forward_types";
inline constexpr std::string_view vocab_size = "vocab_size";
inline constexpr std::string_view head_count = "attention.head_count";
inline constexpr std::string_view head_count_kv = "attention.head_count_kv";
inline constexpr std::string_view q_lora_rank = "attention.q_lora_rank";
inline constexpr std::string_view kv_lora_rank = "attention.kv_lora_rank";
inline constexpr std::string_view key_length = "attention.key_length";
inline constexpr std::string_view value_length = "attention.value_length";
inline constexpr std::string_view key_length_mla = "attention.key_length_mla";
inline constexpr std::string_view value_length_mla = "attention.value_length_mla";
inline constexpr std::string_view rope_dimension_count = "rope.dimension_count";
inline constexpr std::string_view rms_eps = "attention.layer_norm_rms_epsilon";
inline constexpr std::string_view norm_eps = "attention.layer_norm_epsilon";
inline constexpr std::string_view conv_kernel = "ssm.conv_kernel";
inline constexpr std::string_view kda_head_dim = "kda.head_dim";
inline constexpr std::string_view kda_gate_lower_bound = "kda.gate_lower_bound";
inline constexpr std::string_view kda_head_count = "kda.head_count";
inline constexpr std::string_view indexer_head_count = "attention.indexer.head_count";
inline constexpr std::string_view indexer_key_length = "attention.indexer.key_length";
inline constexpr std::string_view indexer_top_k = "attention.indexer.top_k";
inline constexpr std::string_view indexer_kpool = "attention.indexer.kpool";
inline constexpr std::string_view indexer_block_size = "attention.indexer.block_size";
inline constexpr std::string_view indexer_kpool_select_tail = "attention.indexer.kpool_select_tail";
inline constexpr std::string_view indexer_types = "attention.indexer.types";
inline constexpr std::string_view hc_count = "hyper_connection.count";
inline constexpr std::string_view hc_sinkhorn_iterations = "hyper_connection.sinkhorn_iterations";
inline constexpr std::string_view hc_epsilon = "hyper_connection.epsilon";
inline constexpr std::string_view expert_count = "expert_count";
inline constexpr std::string_view expert_used_count = "expert_used_count";
inline constexpr std::string_view expert_feed_forward_length = "expert_feed_forward_length";
inline constexpr std::string_view expert_shared_count = "expert_shared_count";
inline constexpr std::string_view expert_shared_feed_forward_length = "expert_shared_feed_forward_length";
inline constexpr std::string_view expert_group_count = "expert_group_count";
inline constexpr std::string_view expert_group_used_count = "expert_group_used_count";
inline constexpr std::string_view expert_weights_scale = "expert_weights_scale";
inline constexpr std::string_view expert_weights_norm = "expert_weights_norm";
inline constexpr std::string_view expert_gating_func = "expert_gating_func";
inline constexpr std::string_view swiglu_clamp_exp = "swiglu_clamp_exp";
inline constexpr std::string_view swiglu_clamp_shexp = "swiglu_clamp_shexp";
}  // namespace glm5_key

inline constexpr uint32_t kGlm5GatingSigmoid = 2;  // llama.cpp LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID

// "glm5next" or "glm5-next" when general.architecture names this model; else an error naming it.
Expected<std::string> glm5_gguf_arch(const GgufFile& file);

class GgufWriter;
// Sets general.architecture and every key above from `hp`.
Status write_glm5_hparams(GgufWriter& writer, const Glm5Hparams& hp);

}  // namespace ferry::model
