#include "gpu/stage_state.hpp"

#include <algorithm>
#include <string>

#include "gpu/stage_sizes.hpp"
#include "model/glm5/glm5_tensors.hpp"

namespace ferry::gpu {

uint64_t StageState::bytes_for(const model::Glm5Hparams& hp, model::LayerRange layers, uint32_t slots,
                               uint32_t context) {
  return stage_state_bytes(hp, layers, slots, context);
}

StageState::StageState(const model::Glm5Hparams& hp, model::LayerRange layers, uint32_t slots, uint32_t context,
                       cudaStream_t stream)
    : tokens(slots, 0),
      first_(layers.first),
      slots_(slots),
      context_(context),
      kpool_(std::max<uint32_t>(1, hp.index_kpool)),
      conv_taps_(std::max<uint32_t>(1, hp.conv_kernel - 1)),
      conv_floats_(3ull * hp.kda_heads * hp.kda_head_dim * (hp.conv_kernel - 1)),
      recurrent_floats_(uint64_t{hp.kda_heads} * hp.kda_head_dim * hp.kda_head_dim),
      latent_width_(hp.kv_lora_rank),
      index_width_(hp.index_head_dim),
      layout_(hp, layers, /*with_mtp=*/false) {
  auto alloc = [&](uint64_t floats) {
    buffers_.emplace_back(std::max<uint64_t>(floats, 4) * sizeof(float));
    bytes_ += buffers_.back().bytes();
    return buffers_.back().as<float>();
  };
  for (uint32_t il = layers.first; il < layers.end; ++il) {
    LayerState& l = layers_.emplace_back();
    if (hp.layer_kinds[il] == model::LayerKind::kda) {
      l.conv = alloc(slots * conv_floats_);
      l.recurrent = alloc(slots * recurrent_floats_);
      continue;
    }
    l.latents = alloc(uint64_t{slots} * context * latent_width_);
    if (model::glm5_has_indexer(hp, il)) {
      l.keys = alloc(uint64_t{slots} * context * index_width_);
      l.gates = alloc(uint64_t{slots} * context * index_width_);
      l.pools = alloc(uint64_t{slots} * (context / kpool_) * index_width_);  // complete pools only: the kernels' stride
    }
  }
  for (uint32_t s = 0; s < slots; ++s) zero_slot(s, stream);
  FERRY_CUDA(cudaStreamSynchronize(stream));
}

void StageState::zero_slot(uint32_t slot, cudaStream_t stream) {
  tokens[slot] = 0;
  for (LayerState& l : layers_) {
    if (l.conv == nullptr) continue;
    FERRY_CUDA(cudaMemsetAsync(l.conv + slot * conv_floats_, 0, conv_floats_ * sizeof(float), stream));
    FERRY_CUDA(cudaMemsetAsync(l.recurrent + slot * recurrent_floats_, 0, recurrent_floats_ * sizeof(float), stream));
  }
}

float* StageState::where(const model::StatePartSpec& p, uint32_t slot) {
  LayerState& l = layer(p.layer);
  const uint64_t rows = uint64_t{slot} * context_;
  switch (p.part) {
    case model::StatePart::kda_conv: return l.conv + slot * conv_floats_;
    case model::StatePart::kda_recurrent: return l.recurrent + slot * recurrent_floats_;
    case model::StatePart::latent: return l.latents + rows * latent_width_;
    case model::StatePart::index_key: return l.keys + rows * index_width_;
    case model::StatePart::index_gate: return l.gates + rows * index_width_;
    case model::StatePart::pool_key: return l.pools + uint64_t{slot} * (context_ / kpool_) * index_width_;
  }
  return nullptr;
}

namespace {

// dst[c][r] = src[r][c] for src of `rows` x `cols`.
void transpose(const float* src, float* dst, size_t rows, size_t cols) {
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
  }
}

}  // namespace

Expected<model::SlotStateImage> StageState::save(uint32_t slot, bool with_rows, cudaStream_t stream) {
  if (slot >= slots_) return Error(ErrorCode::invalid_plan, "slot " + std::to_string(slot) + " does not exist");
  model::SlotStateImage image;
  image.tokens = tokens[slot];
  image.with_rows = with_rows;
  image.data.resize(layout_.image_floats(image.tokens, 0, with_rows));
  std::vector<uint64_t> conv_at;
  layout_.for_each(image, [&](const model::StatePartSpec& p, uint64_t at, uint64_t n) {
    FERRY_CUDA(cudaMemcpyAsync(image.data.data() + at, where(p, slot), n * sizeof(float), cudaMemcpyDeviceToHost, stream));
    if (p.part == model::StatePart::kda_conv) conv_at.push_back(at);
  });
  FERRY_CUDA(cudaStreamSynchronize(stream));
  std::vector<float> channels(conv_floats_);
  for (const uint64_t at : conv_at) {
    std::copy_n(image.data.data() + at, conv_floats_, channels.data());
    transpose(channels.data(), image.data.data() + at, conv_floats_ / conv_taps_, conv_taps_);
  }
  return image;
}

Status StageState::restore(uint32_t slot, const model::SlotStateImage& image, cudaStream_t stream) {
  if (slot >= slots_) return Error(ErrorCode::invalid_plan, "slot " + std::to_string(slot) + " does not exist");
  if (auto e = layout_.check(image)) return e;
  if (image.tokens > context_) {
    return Error(ErrorCode::invalid_plan, "a state image of " + std::to_string(image.tokens) +
                                              " tokens does not fit the context of " + std::to_string(context_));
  }
  if (!image.with_rows && tokens[slot] < image.tokens) {
    return Error(ErrorCode::invalid_plan, "slot " + std::to_string(slot) + " holds " + std::to_string(tokens[slot]) +
                                              " tokens, fewer than the " + std::to_string(image.tokens) +
                                              " of a state image without rows");
  }
  std::vector<std::vector<float>> channels;  // the conv parts in the kernels' order, until the copies ran
  layout_.for_each(image, [&](const model::StatePartSpec& p, uint64_t at, uint64_t n) {
    const float* src = image.data.data() + at;
    if (p.part == model::StatePart::kda_conv) {
      std::vector<float>& c = channels.emplace_back(conv_floats_);
      transpose(src, c.data(), conv_taps_, conv_floats_ / conv_taps_);
      src = c.data();
    }
    FERRY_CUDA(cudaMemcpyAsync(where(p, slot), src, n * sizeof(float), cudaMemcpyHostToDevice, stream));
  });
  FERRY_CUDA(cudaStreamSynchronize(stream));
  tokens[slot] = image.tokens;
  return std::nullopt;
}

}  // namespace ferry::gpu
