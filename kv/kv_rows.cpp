#include "kv/kv_rows.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "kv/kv_codec.hpp"

namespace ferry::kv {

using config::KvType;

void encode_row(KvType type, const float* x, uint32_t w, void* data, float* scale) {
  switch (type) {
    case KvType::f32: std::copy_n(x, w, static_cast<float*>(data)); return;
    case KvType::f16:
      for (uint32_t c = 0; c < w; ++c) static_cast<uint16_t*>(data)[c] = f32_to_f16(x[c]);
      return;
    case KvType::int8: {
      float m = 0.0f;
      for (uint32_t c = 0; c < w; ++c) m = std::max(m, std::fabs(x[c]));
      const float s = int8_scale(m);
      for (uint32_t c = 0; c < w; ++c) static_cast<int8_t*>(data)[c] = int8_code(x[c], s);
      *scale = s;
      return;
    }
  }
}

void decode_row(KvType type, const void* data, float scale, uint32_t w, float* out) {
  switch (type) {
    case KvType::f32: std::copy_n(static_cast<const float*>(data), w, out); return;
    case KvType::f16:
      for (uint32_t c = 0; c < w; ++c) out[c] = f16_to_f32(static_cast<const uint16_t*>(data)[c]);
      return;
    case KvType::int8:
      for (uint32_t c = 0; c < w; ++c) out[c] = static_cast<float>(static_cast<const int8_t*>(data)[c]) * scale;
      return;
  }
}

void KvRows::append(const float* src, size_t n, size_t stride) {
  const size_t w = width_, at = rows_;
  switch (type_) {
    case KvType::f32: f32_.resize((at + n) * w); break;
    case KvType::f16: f16_.resize((at + n) * w); break;
    case KvType::int8: codes_.resize((at + n) * w), scales_.resize(at + n); break;
  }
  for (size_t i = 0; i < n; ++i) {
    const size_t r = at + i;
    void* data = type_ == KvType::f32   ? static_cast<void*>(f32_.data() + r * w)
                 : type_ == KvType::f16 ? static_cast<void*>(f16_.data() + r * w)
                                        : static_cast<void*>(codes_.data() + r * w);
    encode_row(type_, src + i * stride, width_, data, type_ == KvType::int8 ? scales_.data() + r : nullptr);
  }
  rows_ += n;
}

const float* KvRows::row(size_t r, float* scratch) const {
  const size_t w = width_;
  switch (type_) {
    case KvType::f32: return f32_.data() + r * w;
    case KvType::f16: decode_row(type_, f16_.data() + r * w, 0.0f, width_, scratch); return scratch;
    case KvType::int8: decode_row(type_, codes_.data() + r * w, scales_[r], width_, scratch); return scratch;
  }
  return nullptr;
}

void KvRows::truncate(size_t n) {
  const size_t w = width_;
  rows_ = std::min(rows_, n);
  f32_.resize(type_ == KvType::f32 ? rows_ * w : 0);
  f16_.resize(type_ == KvType::f16 ? rows_ * w : 0);
  codes_.resize(type_ == KvType::int8 ? rows_ * w : 0);
  scales_.resize(type_ == KvType::int8 ? rows_ : 0);
}

void KvRows::to_image(size_t row0, size_t n, float* out) const {
  const size_t w = width_;
  for (size_t r = row0; r < row0 + n; ++r) {
    switch (type_) {
      case KvType::f32: out = std::copy_n(f32_.data() + r * w, w, out); break;
      case KvType::f16:
        for (size_t c = 0; c < w; ++c) *out++ = f16_to_f32(f16_[r * w + c]);
        break;
      case KvType::int8:
        for (size_t c = 0; c < w; ++c) *out++ = static_cast<float>(codes_[r * w + c]);
        *out++ = scales_[r];
        break;
    }
  }
}

Status KvRows::from_image(const float* in, size_t n) {
  const size_t w = width_;
  auto bad = [&](size_t r, const char* what) {
    return Error(ErrorCode::invalid_input, "KV image row " + std::to_string(r) + " (" +
                                               std::string(config::kv_type_name(type_)) + "): " + what);
  };
  // Checked before anything is replaced: a refused image leaves the rows as they were.
  for (size_t r = 0; r < n && type_ != KvType::f32; ++r) {
    const float* x = in + r * config::kv_image_width(type_, w);
    for (size_t c = 0; c < w; ++c) {
      if (type_ == KvType::f16 && f16_to_f32(f32_to_f16(x[c])) != x[c] && !std::isnan(x[c])) {
        return bad(r, "a value that is not a half");
      }
      if (type_ == KvType::int8 && !(std::rint(x[c]) == x[c] && std::fabs(x[c]) <= 127.0f)) {
        return bad(r, "a code that is not an integer in [-127, 127]");
      }
    }
    if (type_ == KvType::int8 && !(x[w] >= 0.0f && std::isfinite(x[w]))) return bad(r, "a scale that is not finite and >= 0");
  }
  clear();
  for (size_t r = 0; r < n; ++r) {
    const float* x = in + r * config::kv_image_width(type_, w);
    switch (type_) {
      case KvType::f32: f32_.insert(f32_.end(), x, x + w); break;
      case KvType::f16:
        for (size_t c = 0; c < w; ++c) f16_.push_back(f32_to_f16(x[c]));
        break;
      case KvType::int8:
        for (size_t c = 0; c < w; ++c) codes_.push_back(static_cast<int8_t>(x[c]));
        scales_.push_back(x[w]);
        break;
    }
  }
  rows_ = n;
  return std::nullopt;
}

}  // namespace ferry::kv
