#include "gpu/stage_state.hpp"

#include <algorithm>
#include <string>

#include "gpu/stage_sizes.hpp"
#include "kv/kv_codec.hpp"
#include "kv/kv_rows.hpp"
#include "model/glm5/glm5_tensors.hpp"

namespace ferry::gpu {

uint64_t StageState::bytes_for(const model::Glm5Hparams& hp, model::LayerRange layers, uint32_t slots,
                               uint32_t context, config::KvType latent, uint32_t resident, uint32_t max_rows) {
  return stage_state_bytes(hp, layers, slots, context, latent, resident, max_rows);
}

StageState::StageState(const model::Glm5Hparams& hp, model::LayerRange layers, uint32_t slots, uint32_t context,
                       config::KvFormats formats, cudaStream_t stream, uint32_t resident, uint32_t max_rows)
    : tokens(slots, 0),
      first_(layers.first),
      slots_(slots),
      context_(context),
      latent_rows_(device_latent_rows(context, resident)),
      key_rows_(index_key_rows(context, hp.index_kpool, max_rows)),
      kpool_(std::max<uint32_t>(1, hp.index_kpool)),
      formats_(formats),
      conv_taps_(std::max<uint32_t>(1, hp.conv_kernel - 1)),
      conv_floats_(3ull * hp.kda_heads * hp.kda_head_dim * (hp.conv_kernel - 1)),
      recurrent_floats_(uint64_t{hp.kda_heads} * hp.kda_head_dim * hp.kda_head_dim),
      latent_width_(hp.kv_lora_rank),
      index_width_(hp.index_head_dim),
      layout_(hp, layers, /*with_mtp=*/false, formats) {
  if (formats.index != config::KvType::f32) throw CudaError("the CUDA stage keeps the indexer's rows in f32 only");
  auto alloc_bytes = [&](uint64_t bytes) {
    buffers_.emplace_back(std::max<uint64_t>(bytes, 16));
    bytes_ += buffers_.back().bytes();
    return buffers_.back().as<uint8_t>();
  };
  auto alloc = [&](uint64_t floats) { return reinterpret_cast<float*>(alloc_bytes(floats * sizeof(float))); };
  for (uint32_t il = layers.first; il < layers.end; ++il) {
    LayerState& l = layers_.emplace_back();
    if (model::glm5_layer_kind(hp, il) == model::LayerKind::kda) {
      l.conv = alloc(slots * conv_floats_);
      l.recurrent = alloc(slots * recurrent_floats_);
      continue;
    }
    const uint64_t rows = uint64_t{slots} * latent_rows_;
    if (formats.latent == config::KvType::int8) {
      l.latents = alloc_bytes(rows * latent_width_);
      l.latent_scales = alloc(rows);
    } else {
      l.latents = alloc_bytes(rows * config::kv_row_bytes(formats.latent, latent_width_));
    }
    if (model::glm5_has_indexer(hp, il)) {
      l.keys = alloc(uint64_t{slots} * key_rows_ * index_width_);
      l.gates = alloc(uint64_t{slots} * key_rows_ * index_width_);
      l.pools = alloc(uint64_t{slots} * (context / kpool_) * index_width_);  // complete pools only: the kernels' stride
    }
  }
  if (latent_rows_ < context_ && dsa_layer_count(hp, layers) > 0) {
    window_ = std::make_unique<KvWindow>(hp, layers, slots, context, latent_rows_, formats.latent, max_rows);
  }
  for (uint32_t s = 0; s < slots; ++s) zero_slot(s, stream);
  FERRY_CUDA(cudaStreamSynchronize(stream));
}

bool StageState::begin_step(const std::vector<model::SlotRows>& rows, cudaStream_t stream) {
  if (!window_) return false;
  std::vector<LayerState*> dsa;
  for (LayerState& l : layers_) {
    if (l.latents != nullptr) dsa.push_back(&l);
  }
  window_->begin_step(rows, tokens, dsa, stream);
  return window_->windowed_step();
}

void StageState::zero_slot(uint32_t slot, cudaStream_t stream) {
  tokens[slot] = 0;
  if (window_) window_->reset(slot);
  for (LayerState& l : layers_) {
    if (l.conv == nullptr) continue;
    FERRY_CUDA(cudaMemsetAsync(l.conv + slot * conv_floats_, 0, conv_floats_ * sizeof(float), stream));
    FERRY_CUDA(cudaMemsetAsync(l.recurrent + slot * recurrent_floats_, 0, recurrent_floats_ * sizeof(float), stream));
  }
}

float* StageState::where(const model::StatePartSpec& p, uint32_t slot) {
  LayerState& l = layer(p.layer);
  switch (p.part) {
    case model::StatePart::kda_conv: return l.conv + slot * conv_floats_;
    case model::StatePart::kda_recurrent: return l.recurrent + slot * recurrent_floats_;
    case model::StatePart::latent: return nullptr;  // not floats: save_latents / restore_latents
    case model::StatePart::index_key:
    case model::StatePart::index_gate: return nullptr;  // a ring: copy_tail
    case model::StatePart::pool_key: return l.pools + uint64_t{slot} * (context_ / kpool_) * index_width_;
  }
  return nullptr;
}

void StageState::copy_tail(const model::StatePartSpec& p, uint32_t slot, uint32_t tokens, float* out, const float* in,
                           cudaStream_t stream) {
  LayerState& l = layer(p.layer);
  float* ring = (p.part == model::StatePart::index_key ? l.keys : l.gates) + uint64_t{slot} * key_rows_ * index_width_;
  const uint32_t tail = tokens % kpool_;
  // Positions [tokens - tail, tokens) at position % key_rows: one run, or two where the ring wraps.
  for (uint32_t done = 0; done < tail;) {
    const uint32_t at = (tokens - tail + done) % key_rows_, n = std::min(tail - done, key_rows_ - at);
    float* dev = ring + uint64_t{at} * index_width_;
    const uint64_t offset = uint64_t{done} * index_width_, bytes = uint64_t{n} * index_width_ * sizeof(float);
    if (out != nullptr) {
      FERRY_CUDA(cudaMemcpyAsync(out + offset, dev, bytes, cudaMemcpyDeviceToHost, stream));
    } else {
      FERRY_CUDA(cudaMemcpyAsync(dev, in + offset, bytes, cudaMemcpyHostToDevice, stream));
    }
    done += n;
  }
}

void StageState::save_latents(uint32_t il, uint32_t slot, uint32_t n, float* out, cudaStream_t stream) {
  const LayerState& l = layer(il);
  const uint64_t w = latent_width_, row0 = uint64_t{slot} * latent_rows_;
  // A slot out of its window has its rows in the host tier (pinned): the same copies, host to host.
  const bool host = window_ && !window_->in_window(slot);
  const auto* base = host ? static_cast<const uint8_t*>(window_->host_rows(slot, il))
                          : static_cast<const uint8_t*>(l.latents) + row0 * w * kv::kv_element_bytes(formats_.latent);
  const float* scales = formats_.latent != config::KvType::int8 ? nullptr
                        : host                                      ? window_->host_scales(slot, il)
                                                                    : l.latent_scales + row0;
  switch (formats_.latent) {
    case config::KvType::f32:
      FERRY_CUDA(cudaMemcpyAsync(out, base, n * w * 4, cudaMemcpyDefault, stream));
      FERRY_CUDA(cudaStreamSynchronize(stream));
      return;
    case config::KvType::f16: {
      std::vector<uint16_t> h(n * w);
      FERRY_CUDA(cudaMemcpyAsync(h.data(), base, n * w * 2, cudaMemcpyDefault, stream));
      FERRY_CUDA(cudaStreamSynchronize(stream));
      for (uint64_t i = 0; i < n * w; ++i) out[i] = kv::f16_to_f32(h[i]);
      return;
    }
    case config::KvType::int8: {
      std::vector<int8_t> codes(n * w);
      std::vector<float> row_scales(n);
      FERRY_CUDA(cudaMemcpyAsync(codes.data(), base, n * w, cudaMemcpyDefault, stream));
      FERRY_CUDA(cudaMemcpyAsync(row_scales.data(), scales, n * 4, cudaMemcpyDefault, stream));
      FERRY_CUDA(cudaStreamSynchronize(stream));
      for (uint64_t r = 0; r < n; ++r) {
        for (uint64_t c = 0; c < w; ++c) *out++ = static_cast<float>(codes[r * w + c]);
        *out++ = row_scales[r];
      }
      return;
    }
  }
}

Status StageState::restore_latents(uint32_t il, uint32_t slot, const float* in, uint32_t n, cudaStream_t stream) {
  const LayerState& l = layer(il);
  const uint64_t w = latent_width_, row0 = uint64_t{slot} * latent_rows_;
  auto* base = static_cast<uint8_t*>(l.latents);
  kv::KvRows rows(formats_.latent, static_cast<uint32_t>(w));  // checks the image and encodes it
  if (auto e = rows.from_image(in, n)) return e;
  if (n > latent_rows_) {  // more than the window holds: into the host tier (restore() reset the slot)
    const void* data = formats_.latent == config::KvType::f32   ? static_cast<const void*>(rows.f32_data())
                       : formats_.latent == config::KvType::f16 ? static_cast<const void*>(rows.f16_data())
                                                                : static_cast<const void*>(rows.codes());
    return window_->restore_rows(slot, il, data, rows.scales(), n);
  }
  switch (formats_.latent) {
    case config::KvType::f32:
      FERRY_CUDA(cudaMemcpyAsync(base + row0 * w * 4, rows.f32_data(), n * w * 4, cudaMemcpyHostToDevice, stream));
      break;
    case config::KvType::f16:
      FERRY_CUDA(cudaMemcpyAsync(base + row0 * w * 2, rows.f16_data(), n * w * 2, cudaMemcpyHostToDevice, stream));
      break;
    case config::KvType::int8:
      FERRY_CUDA(cudaMemcpyAsync(base + row0 * w, rows.codes(), n * w, cudaMemcpyHostToDevice, stream));
      FERRY_CUDA(cudaMemcpyAsync(l.latent_scales + row0, rows.scales(), n * 4, cudaMemcpyHostToDevice, stream));
      break;
  }
  FERRY_CUDA(cudaStreamSynchronize(stream));  // `rows` is host memory of this frame
  return std::nullopt;
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
    if (p.part == model::StatePart::latent) {
      save_latents(p.layer, slot, image.tokens, image.data.data() + at, stream);
      return;
    }
    if (p.unit == model::StateUnit::tail) {
      copy_tail(p, slot, image.tokens, image.data.data() + at, nullptr, stream);
      return;
    }
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
  // The latent rows first: an image the format cannot hold is refused before anything is copied.
  // With a window, the slot starts over: in its window when the image fits it, else in the host tier.
  if (window_ && image.with_rows) {
    FERRY_CUDA(cudaStreamSynchronize(stream));  // no step still reads the slot's host rows
    window_->reset(slot);
  }
  Status bad;
  layout_.for_each(image, [&](const model::StatePartSpec& p, uint64_t at, uint64_t) {
    if (p.part != model::StatePart::latent || bad) return;
    bad = restore_latents(p.layer, slot, image.data.data() + at, image.tokens, stream);
    if (bad) *bad = bad->prefixed("layer " + std::to_string(p.layer) + ": ");
  });
  if (bad) return bad;
  if (window_ && image.with_rows && image.tokens > latent_rows_) window_->mark_out_of_window(slot);
  std::vector<std::vector<float>> channels;  // the conv parts in the kernels' order, until the copies ran
  layout_.for_each(image, [&](const model::StatePartSpec& p, uint64_t at, uint64_t n) {
    if (p.part == model::StatePart::latent) return;
    if (p.unit == model::StateUnit::tail) {  // the image's data outlives the synchronize below
      copy_tail(p, slot, image.tokens, nullptr, image.data.data() + at, stream);
      return;
    }
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
