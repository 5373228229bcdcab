#pragma once
// Warp-wide reductions of 64-bit keys and shuffles of the sampling rule's 128-bit sums, shared by the
// device samplers (sampling.cu, sampling_grid.cu). Every lane of the warp calls them.
#include "model/cpu/sampling_rule.hpp"

namespace ferry::gpu {

__device__ inline unsigned long long warp_max_u64(unsigned long long v) {
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned long long other = __shfl_xor_sync(0xffffffffu, v, o);
    v = other > v ? other : v;
  }
  return v;
}
__device__ inline unsigned long long warp_min_u64(unsigned long long v) {
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned long long other = __shfl_xor_sync(0xffffffffu, v, o);
    v = other < v ? other : v;
  }
  return v;
}
__device__ inline unsigned long long warp_sum_u64(unsigned long long v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ inline model::sampling::u128 shfl_up128(model::sampling::u128 v, int by) {
  const unsigned long long lo = __shfl_up_sync(0xffffffffu, static_cast<unsigned long long>(v), by);
  const unsigned long long hi = __shfl_up_sync(0xffffffffu, static_cast<unsigned long long>(v >> 64), by);
  return (static_cast<model::sampling::u128>(hi) << 64) | lo;
}
__device__ inline model::sampling::u128 shfl_xor128(model::sampling::u128 v, int by) {
  const unsigned long long lo = __shfl_xor_sync(0xffffffffu, static_cast<unsigned long long>(v), by);
  const unsigned long long hi = __shfl_xor_sync(0xffffffffu, static_cast<unsigned long long>(v >> 64), by);
  return (static_cast<model::sampling::u128>(hi) << 64) | lo;
}
__device__ inline model::sampling::u128 shfl128(model::sampling::u128 v, int lane) {
  const unsigned long long lo = __shfl_sync(0xffffffffu, static_cast<unsigned long long>(v), lane);
  const unsigned long long hi = __shfl_sync(0xffffffffu, static_cast<unsigned long long>(v >> 64), lane);
  return (static_cast<model::sampling::u128>(hi) << 64) | lo;
}

}  // namespace ferry::gpu
