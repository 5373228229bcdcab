#include "gpu/mtp_sizes.hpp"

#include <algorithm>

#include "gpu/stage_sizes.hpp"

namespace ferry::gpu {

uint64_t verify_keep_slot_floats(const model::Glm5Hparams& hp, model::LayerRange layers) {
  const uint64_t conv = 3ull * hp.kda_heads * hp.kda_head_dim * (hp.conv_kernel - 1);
  const uint64_t recurrent = uint64_t{hp.kda_heads} * hp.kda_head_dim * hp.kda_head_dim;
  uint64_t kda_layers = 0;
  for (uint32_t il = layers.first; il < layers.end; ++il) kda_layers += model::glm5_layer_kind(hp, il) == model::LayerKind::kda;
  return kda_layers * (conv + recurrent);
}

uint64_t verify_keep_bytes(const model::Glm5Hparams& hp, model::LayerRange layers, uint32_t slots) {
  return std::max<uint64_t>(16, uint64_t{slots} * verify_keep_slot_floats(hp, layers) * sizeof(float));
}

uint64_t mtp_buffer_bytes(const model::Glm5Hparams& hp, uint32_t slots, uint32_t rows) {
  const uint64_t M = rows, D = hp.hidden_size, S = slots;
  const uint64_t logit_rows = std::clamp<uint64_t>((uint64_t{128} << 20) / hp.vocab_size, 8, M);
  // iota; hidden, h, x, out (D each) and cat (2D); sel, pending, kept pending; the drafts' ids; greedy rows
  return 4 * M + 4 * 6 * M * D + 4 * 3 * S * D + 4 * kMaxCudaDrafts * S + kSampleRowBytes * logit_rows;
}

uint32_t mtp_work_rows(uint32_t step_rows, uint32_t slots, bool runs_mtp) { return step_rows + (runs_mtp ? slots : 0); }

MtpBytes mtp_stage_bytes(const model::Glm5Hparams& hp,
                         const std::function<uint64_t(const model::Glm5TensorSpec&)>& tensor_bytes,
                         model::LayerRange last, uint32_t slots, uint32_t context, uint32_t step_rows,
                         config::KvType latent) {
  MtpBytes b;
  if (hp.n_nextn_layers == 0 || last.end != hp.n_layers) return b;
  const model::LayerRange block{hp.n_layers, hp.n_layers + 1};
  bool own_embedding = false;
  for (const model::Glm5TensorSpec& t : model::glm5_layer_tensors(hp, block.first)) {
    const uint64_t bytes = tensor_bytes(t);
    b.weights += bytes;
    own_embedding = own_embedding || (t.role == model::Glm5Tensor::nextn_embed_tokens && bytes > 0);
  }
  if (!own_embedding && last.first != 0) {  // the trunk's embedding, on this stage too
    for (const model::Glm5TensorSpec& t : model::glm5_global_tensors(hp)) {
      if (t.role == model::Glm5Tensor::token_embd) b.weights += tensor_bytes(t);
    }
  }
  const uint32_t rows = mtp_work_rows(step_rows, slots, true);
  b.state = stage_state_bytes(hp, block, slots, context, latent) + mtp_buffer_bytes(hp, slots, rows);
  b.keep = verify_keep_bytes(hp, last, slots);
  b.workspace = stage_workspace_bytes(hp, {last.first, block.end}, rows, context) -
                stage_workspace_bytes(hp, last, step_rows, context);
  return b;
}

}  // namespace ferry::gpu
