#include "gpu/verify_keep.hpp"

#include "gpu/mtp_sizes.hpp"
#include "model/glm5/glm5_tensors.hpp"

namespace ferry::gpu {

VerifyKeep::VerifyKeep(const model::Glm5Hparams& hp, model::LayerRange layers, uint32_t slots)
    : layers_(layers),
      conv_floats_(3ull * hp.kda_heads * hp.kda_head_dim * (hp.conv_kernel - 1)),
      recurrent_floats_(uint64_t{hp.kda_heads} * hp.kda_head_dim * hp.kda_head_dim),
      start_(slots) {
  for (uint32_t il = layers.first; il < layers.end; ++il) kda_.push_back(model::glm5_layer_kind(hp, il) == model::LayerKind::kda);
  slot_floats_ = verify_keep_slot_floats(hp, layers);
  buffer_ = DeviceBuffer(verify_keep_bytes(hp, layers, slots));  // as the memory plan counts it
}

void VerifyKeep::copy(StageState& state, uint32_t slot, bool to_keep, cudaStream_t stream) {
  float* kept = buffer_.as<float>() + slot * slot_floats_;
  for (uint32_t il = layers_.first; il < layers_.end; ++il) {
    if (!kda_[il - layers_.first]) continue;
    LayerState& l = state.layer(il);
    float* parts[2] = {l.conv + slot * conv_floats_, l.recurrent + slot * recurrent_floats_};
    const uint64_t sizes[2] = {conv_floats_, recurrent_floats_};
    for (int p = 0; p < 2; ++p) {
      const size_t bytes = sizes[p] * sizeof(float);
      if (to_keep) {
        FERRY_CUDA(cudaMemcpyAsync(kept, parts[p], bytes, cudaMemcpyDeviceToDevice, stream));
      } else {
        FERRY_CUDA(cudaMemcpyAsync(parts[p], kept, bytes, cudaMemcpyDeviceToDevice, stream));
      }
      kept += sizes[p];
    }
  }
}

void VerifyKeep::save(StageState& state, uint32_t slot, cudaStream_t stream) {
  copy(state, slot, true, stream);
  start_[slot] = state.tokens[slot];
}

void VerifyKeep::restore(StageState& state, uint32_t slot, cudaStream_t stream) {
  copy(state, slot, false, stream);
  state.tokens[slot] = *start_[slot];
  start_[slot].reset();
}

}  // namespace ferry::gpu
