#pragma once
// fp16 tensor-core products on mma.sync m16n8k16 with f32 sums, their ldmatrix loads and the fp16
// hi/lo split of f32 operands (gpu/half_split.cuh's), shared by the sm80+ kernels that take them
// (gpu/sparse_mla_mma.cu, gpu/indexer_prefill.cu).
//
// Fragments (lane = 4 g + q): A a[0] (row g, k 2q, 2q+1), a[1] (row g + 8, the same k), a[2] (row g,
// k 2q+8, 2q+9), a[3] (row g + 8, those k); B b[0] (k 2q, 2q+1, column g), b[1] (k 2q+8, 2q+9,
// column g); C c[0], c[1] (row g, columns 2q, 2q+1), c[2], c[3] (row g + 8).
//
// The instructions exist from sm80 on: everything here is defined for sm80+ device code only, and the
// kernels using it keep their bodies behind the same test (hosts choose them by code_built_for).
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#include "gpu/kernels.hpp"

namespace ferry::gpu::mma {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
__device__ __forceinline__ uint32_t half2_bits(__half2 h) {
  uint32_t u;
  memcpy(&u, &h, sizeof u);
  return u;
}
__device__ __forceinline__ __half2 bits_half2(uint32_t u) {
  __half2 h;
  memcpy(&h, &u, sizeof u);
  return h;
}

// x and y (the low k first) as fp16 hi and lo halves (gpu/half_split.cuh's split).
__device__ __forceinline__ void split_pair(float x, float y, uint32_t& hi, uint32_t& lo) {
  const __half2 h = __floats2half2_rn(x, y);
  const float2 f = __half22float2(h);
  hi = half2_bits(h);
  lo = half2_bits(__floats2half2_rn((x - f.x) * kHalfLoScale, (y - f.y) * kHalfLoScale));
}

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c += a * (b0, b1), fp16 operands, f32 sums.
__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif

}  // namespace ferry::gpu::mma
