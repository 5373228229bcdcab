#include "gpu/stage_sizes.hpp"

#include <algorithm>

namespace ferry::gpu {

uint32_t device_latent_rows(uint32_t context, uint32_t resident) {
  return resident > 0 && resident < context ? resident : context;
}

uint32_t dsa_layer_count(const model::Glm5Hparams& hp, model::LayerRange layers) {
  uint32_t dsa = 0;
  for (uint32_t il = layers.first; il < layers.end; ++il) dsa += hp.layer_kinds[il] == model::LayerKind::dsa;
  return dsa;
}

uint32_t max_selected_rows(const model::Glm5Hparams& hp) {
  const uint32_t kp = std::max<uint32_t>(1, hp.index_kpool);
  return hp.index_topk / kp * kp + kp;
}

uint64_t kv_host_tier_bytes(const model::Glm5Hparams& hp, model::LayerRange layers, uint32_t slots, uint32_t context,
                            config::KvType latent, uint32_t resident) {
  if (device_latent_rows(context, resident) == context) return 0;
  return uint64_t{dsa_layer_count(hp, layers)} * slots * context * config::kv_row_bytes(latent, hp.kv_lora_rank);
}

uint64_t kv_window_table_bytes(const model::Glm5Hparams& hp, model::LayerRange layers, uint32_t slots,
                               uint32_t context, uint32_t resident) {
  const uint32_t frames = device_latent_rows(context, resident);
  if (frames == context) return 0;
  return uint64_t{dsa_layer_count(hp, layers)} * slots * (uint64_t{context} * 4 + uint64_t{frames} * 6 + 8);
}

uint64_t kv_prefill_gather_bytes(const model::Glm5Hparams& hp, model::LayerRange layers, uint32_t slots,
                                 uint32_t context, config::KvType latent, uint32_t resident, uint32_t step_rows) {
  const uint32_t frames = device_latent_rows(context, resident);
  if (frames == context || dsa_layer_count(hp, layers) == 0) return 0;
  const uint64_t stride = max_selected_rows(hp);
  const uint64_t scale = latent == config::KvType::int8 ? 4 : 0;  // kv_row_bytes counts int8's scale
  const uint64_t data = config::kv_row_bytes(latent, hp.kv_lora_rank) - scale;
  auto buffer = [](uint64_t bytes) { return std::max<uint64_t>(bytes, 16); };  // as the gather's DeviceBuffers
  return buffer(uint64_t{slots} * context * 4) + buffer(uint64_t{frames} * 4) + buffer(uint64_t{frames} * data) +
         buffer(uint64_t{frames} * scale) + buffer(uint64_t{std::max<uint32_t>(step_rows, 1)} * stride * 4) + 24;
}

uint32_t index_key_rows(uint32_t context, uint32_t kpool, uint32_t step_rows) {
  if (step_rows == 0) return context;
  return static_cast<uint32_t>(std::min<uint64_t>(context, uint64_t{std::max<uint32_t>(1, kpool)} - 1 + step_rows));
}

uint64_t stage_state_bytes(const model::Glm5Hparams& hp, model::LayerRange layers, uint32_t slots, uint32_t context,
                           config::KvType latent, uint32_t resident, uint32_t step_rows) {
  const uint64_t kp = std::max<uint32_t>(1, hp.index_kpool);
  uint64_t floats = 0, latent_bytes = 0;
  for (uint32_t il = layers.first; il < layers.end; ++il) {
    if (model::glm5_layer_kind(hp, il) == model::LayerKind::kda) {
      floats += uint64_t{slots} * (3ull * hp.kda_heads * hp.kda_head_dim * (hp.conv_kernel - 1) +
                                   uint64_t{hp.kda_heads} * hp.kda_head_dim * hp.kda_head_dim);
      continue;
    }
    latent_bytes += uint64_t{slots} * device_latent_rows(context, resident) * config::kv_row_bytes(latent, hp.kv_lora_rank);
    if (model::glm5_has_indexer(hp, il)) {
      const uint64_t key_rows = index_key_rows(context, static_cast<uint32_t>(kp), step_rows);
      floats += uint64_t{slots} * (2 * key_rows + context / kp) * hp.index_head_dim;
    }
  }
  return floats * sizeof(float) + latent_bytes + kv_window_table_bytes(hp, layers, slots, context, resident) +
         kv_prefill_gather_bytes(hp, layers, slots, context, latent, resident, step_rows);
}

uint64_t stage_workspace_bytes(const model::Glm5Hparams& hp, model::LayerRange layers, uint32_t rows,
                               uint32_t context) {
  const uint64_t M = rows, D = hp.hidden_size, H = hp.hc_mult, mix = (2 + H) * H, C = uint64_t{hp.kda_heads} * hp.kda_head_dim;
  const uint64_t kp = std::max<uint32_t>(1, hp.index_kpool), nh = hp.n_heads, kvlr = hp.kv_lora_rank;
  const uint64_t k = hp.n_experts_used, I = hp.moe_ffn, E = hp.n_experts, S = uint64_t{hp.moe_ffn} * hp.n_shared_experts;
  bool any_kda = false, any_dsa = false, any_moe = false;
  for (uint32_t l = layers.first; l < layers.end; ++l) {  // past the trunk: the MTP block's layer
    (model::glm5_layer_kind(hp, l) == model::LayerKind::kda ? any_kda : any_dsa) = true;
    any_moe = any_moe || model::glm5_ffn_kind(hp, l) == model::FfnKind::moe;
  }
  const uint64_t selected = max_selected_rows(hp);
  uint64_t b = 4 * M * (H * D + 2 * D + mix + H + H * H);
  if (any_kda) b += 4 * M * (10 * C + 2 * hp.kda_head_dim + hp.kda_heads);
  if (any_dsa) {
    b += 4 * M * (2 * hp.q_lora_rank + nh * hp.qk_nope_head_dim + kvlr + 2 * nh * kvlr + nh * hp.v_head_dim +
                  uint64_t{hp.index_n_heads} * hp.index_head_dim + 2 * hp.index_head_dim + hp.index_n_heads +
                  context / kp + 1 + selected + 1);
    b += 4 * uint64_t{8 * 16} * nh * (kvlr + 2);  // the sparse attention's split scratch
  }
  const uint64_t ffn_rows = std::max<uint64_t>({hp.dense_ffn, S, any_moe ? k * I : 0});
  b += 4 * 2 * M * ffn_rows;
  if (any_moe) {
    b += 4 * M * (E + 2 * k + 2 * k * D + D + 2 * k);
    const uint64_t decode_rows = std::min<uint64_t>(M, 8);  // a decode step's shared experts
    b += 4 * (1 + decode_rows * k * (3 + 2 * 8));          // (gpu/moe_decode.hpp's shared_route_ints)
  }
  const uint64_t max_cols = std::max<uint64_t>({D, C, nh * hp.v_head_dim, uint64_t{hp.dense_ffn}, I,
                                                uint64_t{hp.q_lora_rank}, kvlr, uint64_t{hp.qk_nope_head_dim}, H * D});
  b += 2 * 2 * M * max_cols + 2 * 2 * (uint64_t{32} << 20);  // fp16 staging of the prefill GEMMs
  b += 2 * M * max_cols + 16;  // their e4m3 inputs where the device has them (an upper bound elsewhere)
  if (layers.end >= hp.n_layers) {  // the last stage; past it, with the MTP block
    const uint64_t logit_rows = std::clamp<uint64_t>((uint64_t{128} << 20) / hp.vocab_size, 8, M);
    b += 4 * logit_rows * (D + hp.vocab_size) + kSampleScratchBytes;
  }
  return b + (uint64_t{32} << 20);  // the cuBLAS workspace
}

uint64_t stage_inbox_bytes(const model::Glm5Hparams& hp, uint32_t rows) {
  return uint64_t{rows} * hp.hc_mult * hp.hidden_size * sizeof(float);
}

model::GgmlType synthetic_tensor_type(const model::Glm5TensorSpec& spec, model::GgmlType requested,
                                      const model::Glm5TypeRules& rules) {
  const uint64_t cols = spec.dims[0];
  model::GgmlType t = rules.requested(spec, requested);
  if (cols % model::ggml_type_traits(t).block_elems != 0) t = cols % 32 == 0 ? model::GgmlType::Q8_0 : model::GgmlType::F32;
  return t;
}

}  // namespace ferry::gpu
