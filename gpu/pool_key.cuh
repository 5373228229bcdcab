#pragma once
// One indexer pool's key (gpu/dsa.cu pool_key_kernel, and the decode launch of gpu/dsa_decode_fusion.cu
// that makes it with the step's keys): per channel, a softmax over the pool's kpool gates (plus the
// position embedding ape) weighting its kpool keys, read from the slot's key rings. Each channel is
// one thread's own arithmetic, so the bits do not depend on the block's size.
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "gpu/kernels.hpp"

namespace ferry::gpu {

__device__ __forceinline__ void pool_key_channels(const IndexerArgs& a, size_t slot, int p) {
  const int kp = static_cast<int>(a.kpool);
  const uint32_t hd = a.head_dim;
  for (uint32_t c = threadIdx.x; c < hd; c += blockDim.x) {
    float mx = -INFINITY;
    for (int i = 0; i < kp; ++i) {
      const size_t at = (slot * a.key_rows + static_cast<uint32_t>(p * kp + i) % a.key_rows) * hd + c;
      mx = fmaxf(mx, a.gate_cache[at] + a.ape[i * hd + c]);
    }
    float sum = 0.0f;
    for (int i = 0; i < kp; ++i) {
      const size_t at = (slot * a.key_rows + static_cast<uint32_t>(p * kp + i) % a.key_rows) * hd + c;
      sum += expf(a.gate_cache[at] + a.ape[i * hd + c] - mx);
    }
    float key = 0.0f;
    for (int i = 0; i < kp; ++i) {
      const size_t at = (slot * a.key_rows + static_cast<uint32_t>(p * kp + i) % a.key_rows) * hd + c;
      key += (expf(a.gate_cache[at] + a.ape[i * hd + c] - mx) / sum) * a.kk_cache[at];
    }
    a.pool_cache[(slot * (a.ctx / a.kpool) + p) * hd + c] = key;
  }
}

}  // namespace ferry::gpu
