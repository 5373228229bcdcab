// Random weight rows of any GGUF type the device reads, and their CPU dequantisation (the reference
// the CUDA tests compare against).
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "model/formats/ggml_type.hpp"
#include "model/formats/half.hpp"
#include "model/formats/quant.hpp"

namespace ferry::testing {

// Random blocks of `type`: quantized from random values where ferry has a quantizer, else random
// bytes with the f16 scale(s) replaced by small finite values.
inline std::vector<uint8_t> random_rows(model::GgmlType type, size_t rows, size_t cols, std::mt19937& rng) {
  const auto tr = model::ggml_type_traits(type);
  std::vector<uint8_t> out(*model::ggml_bytes(type, rows * cols));
  if (model::can_quantize(type)) {
    std::normal_distribution<float> n(0.0f, 1.0f);
    std::vector<float> v(rows * cols);
    for (float& x : v) x = n(rng);
    model::quantize_row(type, v.data(), out.data(), v.size());
    return out;
  }
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : out) b = static_cast<uint8_t>(byte(rng));
  std::uniform_real_distribution<float> scale(0.01f, 0.1f);
  for (size_t b = 0; b < out.size() / tr.block_bytes; ++b) {
    const uint16_t d = model::f32_to_fp16(scale(rng));
    std::memcpy(out.data() + b * tr.block_bytes, &d, 2);  // IQ4_XS and IQ3_S keep d first
  }
  return out;
}

// Random Q4_K bytes with small finite f16 d and dmin, for matrices of the model's size (quantizing
// tens of millions of values on the host takes seconds).
inline std::vector<uint8_t> random_q4k_blocks(size_t rows, size_t cols) {
  const size_t bytes = *model::ggml_bytes(model::GgmlType::Q4_K, rows * cols);
  std::vector<uint8_t> data(bytes);
  uint64_t s = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i + 8 <= bytes; i += 8) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    std::memcpy(&data[i], &s, 8);
  }
  for (size_t b = 0; b < bytes; b += 144) {
    const uint16_t d = model::f32_to_fp16(0.01f + 0.001f * (b / 144 % 64));
    std::memcpy(&data[b], &d, 2);
    std::memcpy(&data[b + 2], &d, 2);
  }
  return data;
}

// Random blocks of a K-quant or IQ type (Q4_K, Q5_K, Q6_K, IQ4_XS, IQ3_S) with small finite f16
// scales, for matrices of the model's size (random_q4k_blocks' way for the other types).
inline std::vector<uint8_t> random_blocks(model::GgmlType type, size_t rows, size_t cols) {
  if (type == model::GgmlType::Q4_K) return random_q4k_blocks(rows, cols);
  const size_t block = model::ggml_type_traits(type).block_bytes;
  std::vector<uint8_t> data(*model::ggml_bytes(type, rows * cols));
  uint64_t s = 0x2545f4914f6cdd1dull;
  for (size_t i = 0; i + 8 <= data.size(); i += 8) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    std::memcpy(&data[i], &s, 8);
  }
  // The f16 scales: d first (Q5_K's dmin after it), Q6_K's d last.
  const size_t d_at = type == model::GgmlType::Q6_K ? block - 2 : 0;
  for (size_t b = 0; b < data.size(); b += block) {
    const uint16_t d = model::f32_to_fp16(0.01f + 0.001f * (b / block % 64));
    std::memcpy(&data[b + d_at], &d, 2);
    if (type == model::GgmlType::Q5_K) std::memcpy(&data[b + 2], &d, 2);
  }
  return data;
}

inline std::vector<float> dequant(model::GgmlType type, const std::vector<uint8_t>& data, size_t n) {
  std::vector<float> v(n);
  model::dequantize_row(type, data.data(), v.data(), n);
  return v;
}

}  // namespace ferry::testing
