#pragma once
// The fp16 pair the prefill products take for f32 values: hi = fp16(v), lo = fp16((v - hi) * 2^12), so
// hi + lo / 2^12 carries ~22 bits (LayerRunner::mm, the grouped MoE, sparse MLA on tensor cores).
#include <cuda_fp16.h>

#include <cstdint>

#include "gpu/kernels.hpp"

namespace ferry::gpu {

// v - hi by the intrinsic, never contracted: inlined after a producer's product (v = a * b), clang
// (the Volta build) fused that product into the subtraction, splitting the unrounded a * b where hi is
// of the rounded v (the lo halves of the split producers' tests differed from their f32 rows'). The
// difference is exact; times 2^12 too.
__device__ __forceinline__ float half_lo_part(float v, float hi) { return __fmul_rn(__fsub_rn(v, hi), kHalfLoScale); }

__device__ __forceinline__ void split_half(float v, __half& hi, __half& lo) {
  hi = __float2half_rn(v);
  lo = __float2half_rn(half_lo_part(v, __half2float(hi)));
}

// Eight values split into fp16 hi and lo, each as one 16-byte word.
// Two values a conversion instruction (round to nearest either way: split_half's bits).
__device__ __forceinline__ void split8(const float* v, uint4& hi, uint4& lo) {
  uint32_t hw[4], lw[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const __half2 h = __floats2half2_rn(v[2 * k], v[2 * k + 1]);
    const float2 back = __half22float2(h);
    const __half2 l = __floats2half2_rn(half_lo_part(v[2 * k], back.x), half_lo_part(v[2 * k + 1], back.y));
    hw[k] = *reinterpret_cast<const uint32_t*>(&h);
    lw[k] = *reinterpret_cast<const uint32_t*>(&l);
  }
  hi = make_uint4(hw[0], hw[1], hw[2], hw[3]);
  lo = make_uint4(lw[0], lw[1], lw[2], lw[3]);
}

}  // namespace ferry::gpu

// ---- The e4m3 corrections (sm89+, LayerRunner::mm_staged): W_hi x_lo + W_lo x_hi as one e4m3 product of depth
// 2K. An operand's values and lo parts are scaled by one power of two, 2^k with k the largest integer such that
// amax * 2^k <= 224: the lo parts reach about twice the values, and e4m3's largest is 448; a power of two keeps
// the scaling exact. `amax_bits` is the largest |value|'s f32 bits (atomicMax over non-negative floats' bits).
__device__ __forceinline__ float e4m3_scale(uint32_t amax_bits) {
  const int eb = static_cast<int>(amax_bits >> 23);
  if (eb == 0 || eb == 255) return 1.0f;  // zero or subnormal (nothing to scale for), inf or NaN (nothing helps)
  // amax = 1.m * 2^(eb - 127) <= 224 * 2^-k; 224 = 1.75 * 2^7.
  const int k = 134 - eb - ((amax_bits & 0x7fffffu) > 0x600000u ? 1 : 0);
  return __int_as_float((127 + max(-126, min(127, k))) << 23);
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
// Eight values times `s` as e4m3 (round to nearest even, saturating at 448), value 0 in the lowest byte.
__device__ __forceinline__ uint2 e4m3x8(const float* v, float s) {
  uint32_t w[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint16_t p[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int i = 4 * h + 2 * k;
      asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(p[k]) : "f"(v[i + 1] * s), "f"(v[i] * s));
    }
    w[h] = uint32_t{p[0]} | (uint32_t{p[1]} << 16);
  }
  return make_uint2(w[0], w[1]);
}
#endif
