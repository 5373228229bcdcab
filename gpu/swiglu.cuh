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

// v[i] = swiglu_value(v[i], up[i], limit) for 16 values, up 16-byte aligned (the matvecs' units of x).
__device__ __forceinline__ void swiglu_values16(float (&v)[16], const float* up, float limit) {
  const float4* up4 = reinterpret_cast<const float4*>(up);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float4 u = up4[k];
    v[4 * k] = swiglu_value(v[4 * k], u.x, limit);
    v[4 * k + 1] = swiglu_value(v[4 * k + 1], u.y, limit);
    v[4 * k + 2] = swiglu_value(v[4 * k + 2], u.z, limit);
    v[4 * k + 3] = swiglu_value(v[4 * k + 3], u.w, limit);
  }
}

}  // namespace ferry::gpu
