#pragma once
// SwiGLU with the clamp (model/cpu/cpu_ops.cpp swiglu_clamped), one value: shared by swiglu() and the
// decode matvec that takes the down projection's input as gate and up products, so both give the
// same bits.
#include <cuda_runtime.h>

namespace ferry::gpu {

__device__ __forceinline__ float swiglu_value(float gate, float up, float limit) {
  const float g = fminf(gate, limit);
  const float u = fminf(fmaxf(up, -limit), limit);
  return g / (1.0f + expf(-g)) * u;
}

}  // namespace ferry::gpu
