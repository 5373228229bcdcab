// Glm5Hparams to GGUF metadata (the key table is in glm5_gguf.hpp), as the published glm5next files
// carry it, plus the spellings other loaders ask for (indexer.block_size, kpool_select_tail,
// indexer.types) so that one file loads everywhere.
#include "model/formats/gguf_writer.hpp"
#include "model/glm5/glm5_gguf.hpp"
#include "model/glm5/glm5_tensors.hpp"

namespace ferry::model {

Status write_glm5_hparams(GgufWriter& w, const Glm5Hparams& hp) {
  const uint32_t lead = glm5_leading_dense_blocks(hp);
  bool leading_run = true;
  for (uint32_t i = lead; i < hp.n_layers; ++i) leading_run = leading_run && hp.ffn_kinds[i] == FfnKind::moe;
  const uint32_t blocks = glm5_block_count(hp);
  const std::string arch(kGlm5Arch);
  Status status;
  auto set = [&](std::string_view suffix, GgufValue value) {
    if (!status) status = w.set(arch + "." + std::string(suffix), std::move(value));
  };
  namespace key = glm5_key;

  if (auto err = w.set("general.architecture", arch)) return err;
  set(key::block_count, blocks);
  if (hp.n_nextn_layers > 0) set(key::nextn_predict_layers, hp.n_nextn_layers);
  set(key::context_length, hp.context_length);
  set(key::embedding_length, hp.hidden_size);
  set(key::feed_forward_length, hp.dense_ffn);
  set(key::leading_dense_block_count, lead);
  if (!leading_run) {
    std::vector<uint32_t> dense(hp.n_layers);
    for (uint32_t i = 0; i < hp.n_layers; ++i) dense[i] = hp.ffn_kinds[i] == FfnKind::dense ? 1 : 0;
    set(key::feed_forward_types, GgufArray{std::move(dense)});
  }
  set(key::vocab_size, hp.vocab_size);
  set(key::head_count, hp.n_heads);
  // n_head_kv 0 marks a KDA (recurrent) block; every MTP block is DSA.
  std::vector<int32_t> kv(blocks, 1);
  for (uint32_t i = 0; i < hp.n_layers; ++i) kv[i] = hp.layer_kinds[i] == LayerKind::kda ? 0 : 1;
  set(key::head_count_kv, GgufArray{std::move(kv)});
  set(key::q_lora_rank, hp.q_lora_rank);
  set(key::kv_lora_rank, hp.kv_lora_rank);
  set(key::rope_dimension_count, uint32_t{0});
  set(key::key_length, hp.kv_lora_rank);  // the cached key is the latent (no RoPE part)
  set(key::value_length, hp.kv_lora_rank);
  set(key::key_length_mla, hp.qk_nope_head_dim);
  set(key::value_length_mla, hp.v_head_dim);
  set(key::rms_eps, hp.rms_eps);
  set(key::norm_eps, hp.index_norm_eps);
  set(key::conv_kernel, hp.conv_kernel);
  set(key::kda_head_dim, hp.kda_head_dim);
  set(key::kda_gate_lower_bound, hp.kda_lower_bound);
  if (hp.kda_heads != hp.n_heads) set(key::kda_head_count, hp.kda_heads);
  set(key::indexer_head_count, hp.index_n_heads);
  set(key::indexer_key_length, hp.index_head_dim);
  set(key::indexer_top_k, hp.index_topk);
  set(key::indexer_kpool, hp.index_kpool);
  set(key::indexer_block_size, hp.index_kpool);
  set(key::indexer_kpool_select_tail, hp.index_select_tail);
  std::vector<uint32_t> types(hp.n_layers);
  for (uint32_t i = 0; i < hp.n_layers; ++i) types[i] = hp.indexer_is_full(i) ? 1 : 0;
  set(key::indexer_types, GgufArray{std::move(types)});
  set(key::hc_count, hp.hc_mult);
  set(key::hc_sinkhorn_iterations, hp.hc_sinkhorn_iters);
  set(key::hc_epsilon, hp.hc_eps);
  set(key::expert_count, hp.n_experts);
  set(key::expert_used_count, hp.n_experts_used);
  set(key::expert_feed_forward_length, hp.moe_ffn);
  set(key::expert_shared_count, hp.n_shared_experts);
  set(key::expert_shared_feed_forward_length, hp.moe_ffn * hp.n_shared_experts);
  set(key::expert_group_count, hp.n_group);
  set(key::expert_group_used_count, hp.topk_group);
  set(key::expert_weights_scale, hp.routed_scaling);
  set(key::expert_weights_norm, hp.norm_topk_prob);
  set(key::expert_gating_func, kGlm5GatingSigmoid);
  // No separate dense-FFN clamp key exists: the per-block arrays cover the dense blocks too.
  set(key::swiglu_clamp_exp, GgufArray{std::vector<float>(blocks, hp.swiglu_limit)});
  set(key::swiglu_clamp_shexp, GgufArray{std::vector<float>(blocks, hp.swiglu_limit)});
  return status;
}

}  // namespace ferry::model
