#pragma once
// The fp16 pair the prefill products take for f32 values: hi = fp16(v), lo = fp16((v - hi) * 2^12), so
// hi + lo / 2^12 carries ~22 bits (LayerRunner::mm, the grouped MoE, sparse MLA on tensor cores).
#include <cuda_fp16.h>

#include <cstdint>

#include "gpu/kernels.hpp"

namespace ferry::gpu {

__device__ __forceinline__ void split_half(float v, __half& hi, __half& lo) {
  hi = __float2half_rn(v);
  lo = __float2half_rn((v - __half2float(hi)) * kHalfLoScale);
}

// Eight values split into fp16 hi and lo, each as one 16-byte word.
// Two values a conversion instruction (round to nearest either way: split_half's bits).
__device__ __forceinline__ void split8(const float* v, uint4& hi, uint4& lo) {
  uint32_t hw[4], lw[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const __half2 h = __floats2half2_rn(v[2 * k], v[2 * k + 1]);
    const float2 back = __half22float2(h);
    const __half2 l = __floats2half2_rn((v[2 * k] - back.x) * kHalfLoScale, (v[2 * k + 1] - back.y) * kHalfLoScale);
    hw[k] = *reinterpret_cast<const uint32_t*>(&h);
    lw[k] = *reinterpret_cast<const uint32_t*>(&l);
  }
  hi = make_uint4(hw[0], hw[1], hw[2], hw[3]);
  lo = make_uint4(lw[0], lw[1], lw[2], lw[3]);
}

}  // namespace ferry::gpu
