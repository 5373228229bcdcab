#pragma once
// The CPU's e4m3 for the tests of the prefill products' e4m3 corrections (gpu/half_split.cuh's e4m3_scale and
// e4m3x8, written independently here).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace ferry::testing {

// e4m3 (bias 7, max 448, subnormal steps of 2^-9, no infinity) of v: round to nearest even, saturating.
inline uint8_t f32_to_e4m3(float v) {
  const uint8_t sign = std::signbit(v) ? 0x80 : 0;
  const float a = std::fabs(v);
  if (std::isnan(v)) return 0x7f;
  if (a >= 448.0f) return sign | 0x7e;
  int e = 0;
  std::frexp(a, &e);
  const int E = std::max(e - 1, -6);
  const float q = std::nearbyint(std::ldexp(a, 3 - E));  // in steps of 2^(E-3): 0..16
  if (q == 0.0f) return sign;
  if (E == -6 && q < 8.0f) return sign | static_cast<uint8_t>(q);  // subnormal
  const int qi = static_cast<int>(q);
  const int E2 = qi >= 16 ? E + 1 : E, m = qi >= 16 ? 0 : qi - 8;
  return sign | static_cast<uint8_t>(((E2 + 7) << 3) | m);
}

// 2^k, k the largest integer with amax * 2^k <= 224 (1 for zero, subnormal or non-finite amax).
inline float e4m3_scale(float amax) {
  if (!(amax >= std::numeric_limits<float>::min()) || !std::isfinite(amax)) return 1.0f;
  int e = 0;
  const float m = std::frexp(amax, &e);  // amax = m 2^e, m in [0.5, 1)
  return std::ldexp(1.0f, std::clamp((2 * m <= 1.75f ? 8 : 7) - e, -126, 127));
}

}  // namespace ferry::testing
