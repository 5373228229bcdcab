#include "model/slot_state.hpp"

#include <algorithm>
#include <string>

#include "model/glm5/glm5_tensors.hpp"

namespace ferry::model {

SlotStateLayout::SlotStateLayout(const Glm5Hparams& hp, config::LayerRange layers, bool with_mtp,
                                 config::KvFormats formats)
    : kpool_(std::max<uint32_t>(1, hp.index_kpool)), formats_(formats) {
  const uint64_t C = uint64_t{hp.kda_heads} * hp.kda_head_dim;
  const uint64_t latent = config::kv_image_width(formats.latent, hp.kv_lora_rank);
  const uint64_t index = config::kv_image_width(formats.index, hp.index_head_dim);
  auto dsa = [&](uint32_t layer, bool mtp) {
    parts_.push_back({layer, StatePart::latent, StateUnit::token, latent, mtp});
    if (glm5_has_indexer(hp, layer)) {
      parts_.push_back({layer, StatePart::index_key, StateUnit::tail, index, mtp});
      parts_.push_back({layer, StatePart::index_gate, StateUnit::tail, index, mtp});
      parts_.push_back({layer, StatePart::pool_key, StateUnit::pool, hp.index_head_dim, mtp});
    }
  };
  for (uint32_t l = layers.first; l < layers.end; ++l) {
    if (glm5_layer_kind(hp, l) == LayerKind::kda) {
      parts_.push_back({l, StatePart::kda_conv, StateUnit::fixed, 3 * C * (hp.conv_kernel - 1), false});
      parts_.push_back({l, StatePart::kda_recurrent, StateUnit::fixed,
                        uint64_t{hp.kda_heads} * hp.kda_head_dim * hp.kda_head_dim, false});
    } else {
      dsa(l, false);
    }
  }
  if (with_mtp) {
    for (uint32_t b = 0; b < hp.n_nextn_layers; ++b) dsa(hp.n_layers + b, true);
  }
}

uint64_t SlotStateLayout::part_floats(const StatePartSpec& p, uint32_t tokens, uint32_t mtp_tokens) const {
  const uint64_t t = p.mtp ? mtp_tokens : tokens;
  switch (p.unit) {
    case StateUnit::fixed: return p.width;
    case StateUnit::token: return p.width * t;
    case StateUnit::pool: return p.width * (t / kpool_);
    case StateUnit::tail: return p.width * (t % kpool_);
  }
  return 0;
}

uint64_t SlotStateLayout::image_floats(uint32_t tokens, uint32_t mtp_tokens, bool with_rows) const {
  uint64_t n = 0;
  for (const StatePartSpec& p : parts_) {
    if (with_rows || in_every_image(p)) n += part_floats(p, tokens, mtp_tokens);
  }
  return n;
}

void SlotStateLayout::for_each(const SlotStateImage& image,
                               const std::function<void(const StatePartSpec&, uint64_t, uint64_t)>& f) const {
  uint64_t at = 0;
  for (const StatePartSpec& p : parts_) {
    if (!image.with_rows && !in_every_image(p)) continue;
    const uint64_t n = part_floats(p, image.tokens, image.mtp_tokens);
    f(p, at, n);
    at += n;
  }
}

Status SlotStateLayout::check(const SlotStateImage& image) const {
  const uint64_t want = image_floats(image.tokens, image.mtp_tokens, image.with_rows);
  if (image.data.size() != want) {
    return Error(ErrorCode::invalid_input, "slot state image of " + std::to_string(image.tokens) + " tokens has " +
                                               std::to_string(image.data.size()) + " floats, the stage's layout " +
                                               std::to_string(want));
  }
  return std::nullopt;
}

}  // namespace ferry::model
