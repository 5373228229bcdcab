#include "kv/random_slot_state.hpp"

#include <cmath>

#include "kv/kv_codec.hpp"

namespace ferry::kv {
namespace {

// splitmix64: fast enough for the gigabytes of a deep slot.
struct Draw {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float unit() { return static_cast<float>(next() >> 40) * (2.0f / 16777216.0f) - 1.0f; }  // [-1, 1)
};

}  // namespace

model::SlotStateImage random_slot_state(const model::SlotStateLayout& layout, uint32_t tokens, uint64_t seed) {
  model::SlotStateImage image;
  image.tokens = tokens;
  image.with_rows = true;
  image.data.resize(layout.image_floats(tokens, 0, true));
  Draw d{seed};
  const config::KvType latent = layout.formats().latent;
  layout.for_each(image, [&](const model::StatePartSpec& p, uint64_t at, uint64_t n) {
    float* out = image.data.data() + at;
    if (p.part == model::StatePart::latent && latent == config::KvType::int8) {
      const uint64_t w = p.width;  // codes, then the scale
      for (uint64_t i = 0; i < n; ++i) {
        const bool scale = i % w == w - 1;
        out[i] = scale ? 0.01f * (d.unit() + 1.0f) + 1e-6f : std::floor(d.unit() * 127.5f);
        if (!scale && out[i] < -127.0f) out[i] = -127.0f;
      }
      return;
    }
    const bool kda = p.part == model::StatePart::kda_conv || p.part == model::StatePart::kda_recurrent;
    for (uint64_t i = 0; i < n; ++i) {
      float v = kda ? d.unit() / 64.0f : d.unit();
      if (p.part == model::StatePart::latent && latent == config::KvType::f16) v = f16_to_f32(f32_to_f16(v));
      out[i] = v;
    }
  });
  return image;
}

}  // namespace ferry::kv
