#pragma once
// The int16 activations of the quantized products (issue 15), one definition for the decode matvec
// (gpu/matvec_int16.cu, gpu/matvec_mma.cu) and the prefill int8 tensor-core GEMM (gpu/moe_grouped_int8.cu), so that
// both round every value alike: one scale per 32-value block (amax / 32767), each value rounded to
// the nearest step, and the f32 sum of each 16 (in column order) for the K-quant minimum terms. A thread holds
// 16 values of a block; lane ^ 1 holds the other 16 (every lane of the warp takes part in the
// shuffle, holding values or not).
#include <cuda_runtime.h>

#include <cstdint>

namespace ferry::gpu {

// The largest |v| and the f32 sum of a thread's 16 values, in column order.
__device__ __forceinline__ void x16_stats(const float (&v)[16], float& amax, float& sum) {
  amax = 0.0f;
  sum = 0.0f;
#pragma unroll
  for (int k = 0; k < 16; ++k) {
    amax = fmaxf(amax, fabsf(v[k]));
    sum += v[k];
  }
}

// The block's amax from this thread's and lane ^ 1's.
__device__ __forceinline__ float x32_amax(float amax16) {
  return fmaxf(amax16, __shfl_xor_sync(0xffffffffu, amax16, 1));
}

// The step of a block of that amax (what an int16 value is multiplied by).
__device__ __forceinline__ float x32_scale(float amax) { return amax / 32767.0f; }

// Bits whose low 16 are v rounded to the nearest integer, ties to even (__float2int_rn's rounding),
// for |v| <= 32768: v + 1.5 * 2^23 lies where the floats are the integers, so the add rounds as the
// conversion does and leaves the integer, two's complement, in the low mantissa bits (every float of
// that range checked against nearbyintf on the host; NaN and infinities, which make a block's step
// non-finite anyway, give other bits). One FP32 add where the conversion (F2I) issues at 16 a clock
// an SM: 16 of them a thread a pass of x's quantization.
__device__ __forceinline__ uint32_t x_round_low16(float v) { return __float_as_uint(__fadd_rn(v, 12582912.0f)); }

// The 16 values as int16 steps of the block, two a word (column 2k low, 2k + 1 high).
__device__ __forceinline__ void x16_pack(const float (&v)[16], float amax, uint32_t (&packed)[8]) {
  const float inv = amax > 0.0f ? 32767.0f / amax : 0.0f;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    // The products rounded apart (__fmul_rn: no fused multiply-add into the rounding's add).
    packed[k] =
        __byte_perm(x_round_low16(__fmul_rn(v[2 * k], inv)), x_round_low16(__fmul_rn(v[2 * k + 1], inv)), 0x5410);
  }
}

// The packed values as the int8 tensor-core products take them (gpu/mma_int8.cuh): hi[k] the high
// bytes (s8) and lo[k] the low bytes (u8) of columns 4k..4k + 3, so that a value is hi * 256 + lo.
__device__ __forceinline__ void x16_bytes(const uint32_t (&packed)[8], uint32_t (&hi)[4], uint32_t (&lo)[4]) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    hi[k] = __byte_perm(packed[2 * k], packed[2 * k + 1], 0x7531);
    lo[k] = __byte_perm(packed[2 * k], packed[2 * k + 1], 0x6420);
  }
}

}  // namespace ferry::gpu
