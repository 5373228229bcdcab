#pragma once
// Per-type block kernels behind quant.hpp (internal to model/quant*.cpp: use quant.hpp instead).
// Each takes a count of whole blocks; block layouts are those of ggml-common.h, read byte-wise
// (little-endian host), so no struct packing or alignment is assumed.
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ferry::model::quant_detail {

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, sizeof v); }

// Round to nearest (ties to even) by adding 1.5 * 2^23 and reading the low mantissa bits: ggml's
// nearest_int. Exact for |v| < 2^22; larger values (and NaN) give a defined but meaningless integer,
// which callers clamp, so no input is undefined behaviour.
inline int nearest_int(float v) {
  const float shifted = v + 12582912.0f;
  int32_t bits;
  std::memcpy(&bits, &shifted, sizeof bits);
  return (bits & 0x007fffff) - 0x00400000;
}

// Below this a quantizer's group counts as all zero (ggml's GROUP_MAX_EPS).
constexpr float kGroupMaxEps = 1e-15f;

// The 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes of Q4_K / Q5_K.
inline void k4_scale_min(const uint8_t* q, int j, uint8_t& scale, uint8_t& min) {
  if (j < 4) {
    scale = q[j] & 63;
    min = q[j + 4] & 63;
  } else {
    scale = static_cast<uint8_t>((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4));
    min = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

void dequantize_f16(const uint8_t* src, float* dst, size_t n);  // n elements, not blocks
void dequantize_q4_0(const uint8_t* src, float* dst, size_t blocks);
void dequantize_q8_0(const uint8_t* src, float* dst, size_t blocks);
void dequantize_q4_k(const uint8_t* src, float* dst, size_t blocks);
void dequantize_q5_k(const uint8_t* src, float* dst, size_t blocks);
void dequantize_q6_k(const uint8_t* src, float* dst, size_t blocks);
void dequantize_iq4_xs(const uint8_t* src, float* dst, size_t blocks);
void dequantize_iq3_s(const uint8_t* src, float* dst, size_t blocks);
void dequantize_iq2_xxs(const uint8_t* src, float* dst, size_t blocks);

void quantize_q8_0(const float* src, uint8_t* dst, size_t blocks);
void quantize_q4_k(const float* src, uint8_t* dst, size_t blocks);
void quantize_q5_k(const float* src, uint8_t* dst, size_t blocks);
void quantize_q6_k(const float* src, uint8_t* dst, size_t blocks);
// `importance`: one weight per element of src, or nullptr (quant_quantize_iq.cpp).
void quantize_iq4_xs(const float* src, uint8_t* dst, size_t blocks, const float* importance);
void quantize_iq3_s(const float* src, uint8_t* dst, size_t blocks, const float* importance);

}  // namespace ferry::model::quant_detail
