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
