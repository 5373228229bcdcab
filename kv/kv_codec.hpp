#pragma once
// The row codecs of the KV formats (config/kv_type.hpp), one definition for the host and the device so
// that a row encoded by the CPU backend and by a CUDA kernel gets the same bytes from the same floats.
//
// f16: IEEE binary16, round to nearest even (overflow to infinity), done in integer arithmetic here
//   rather than by a compiler's half type: the host has no portable one and the device's intrinsic
//   is only as exact as this. Decoding is exact.
// int8: scale = max|x| / 127 over the row, code = rint(x / scale) in [-127, 127], value = code * scale;
//   an all-zero row has scale 0 and codes 0. IEEE division and rint on both sides (no fast math).
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FERRY_KV_HD __host__ __device__ __forceinline__
#else
#define FERRY_KV_HD inline
#endif

namespace ferry::kv {

FERRY_KV_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

FERRY_KV_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

FERRY_KV_HD uint16_t f32_to_f16(float f) {
  const uint32_t x = float_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7fffffffu;
  if (a >= 0x7f800000u) return static_cast<uint16_t>(sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504
  if (a < 0x38800000u) {  // below 2^-14: a subnormal half (units of 2^-24), or zero
    const uint32_t e = a >> 23;
    if (e < 102) return static_cast<uint16_t>(sign);  // below 2^-25: rounds to zero
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = (a >> 13) - (112u << 10);
  const uint32_t rem = a & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return static_cast<uint16_t>(sign | r);
}

FERRY_KV_HD float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    const float v = static_cast<float>(m) * 5.9604644775390625e-8f;  // m * 2^-24, exact
    return sign ? -v : v;
  }
  if (e == 31) return bits_float(sign | 0x7f800000u | (m << 13));
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

FERRY_KV_HD float int8_scale(float max_abs) { return max_abs / 127.0f; }

FERRY_KV_HD int8_t int8_code(float x, float scale) {
  if (!(scale > 0.0f)) return 0;
  const float q = rintf(x / scale);
  return static_cast<int8_t>(q > 127.0f ? 127.0f : (q >= -127.0f ? q : -127.0f));  // NaN: -127, not UB
}

}  // namespace ferry::kv
