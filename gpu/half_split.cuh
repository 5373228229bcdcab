#pragma once
// The fp16 pair the prefill products take for f32 values: hi = fp16(v), lo = fp16((v - hi) * 2^12), so
// hi + lo / 2^12 carries ~22 bits (LayerRunner::mm, the grouped MoE, sparse MLA on tensor cores).
#include <cuda_fp16.h>

#include "gpu/kernels.hpp"

namespace ferry::gpu {

__device__ __forceinline__ void split_half(float v, __half& hi, __half& lo) {
  hi = __float2half_rn(v);
  lo = __float2half_rn((v - __half2float(hi)) * kHalfLoScale);
}

}  // namespace ferry::gpu
