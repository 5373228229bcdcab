#pragma once
#include <cstdint>

// Block-wide sums and prefix sums for kernels of up to 1024 threads (every thread gets the result).
namespace ferry::gpu {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// `scratch` holds 32 floats; the call synchronises the block twice.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  float s = 0.0f;
  for (int i = 0; i < warps; ++i) s += scratch[i];
  return s;
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  v = warp_max(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  float s = scratch[0];
  for (int i = 1; i < warps; ++i) s = fmaxf(s, scratch[i]);
  return s;
}

// The inclusive prefix sum of v over the warp's lanes, in lane order.
__device__ __forceinline__ uint32_t warp_inclusive_sum(uint32_t v) {
  const uint32_t lane = threadIdx.x & 31;
#pragma unroll
  for (uint32_t d = 1; d < 32; d *= 2) {
    const uint32_t o = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v += o;
  }
  return v;
}

// The exclusive prefix sum of v over the block's threads (in thread order), and the total in `total`.
// `scratch` holds 33 words; the call synchronises the block twice.
__device__ __forceinline__ uint32_t block_exclusive_sum(uint32_t v, uint32_t* scratch, uint32_t& total) {
  const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint32_t inc = warp_inclusive_sum(v);
  if (lane == 31) scratch[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    const uint32_t w = lane < (blockDim.x + 31) / 32 ? scratch[lane] : 0;
    const uint32_t wi = warp_inclusive_sum(w);
    scratch[lane] = wi - w;
    if (lane == 31) scratch[32] = wi;
  }
  __syncthreads();
  total = scratch[32];
  return scratch[warp] + inc - v;
}

}  // namespace ferry::gpu
