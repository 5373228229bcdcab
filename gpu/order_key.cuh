#pragma once
// Unsigned keys that order floats like their values (negatives below positives), for the indexer's
// radix selects (gpu/dsa.cu per row, gpu/indexer_decode.cu over the device): one definition, so both
// select the same pools.
#include <cstdint>

namespace ferry::gpu {

__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

}  // namespace ferry::gpu
