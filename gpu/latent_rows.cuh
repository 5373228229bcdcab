#pragma once
// The latent cache of the sparse attention in its format (config/kv_type.hpp): whole rows by index
// (slot * ctx + position), read as floats — by today's sparse_mla kernel (gpu/dsa.cu) and the
// tensor-core one (gpu/sparse_mla_tc.cu).
#include <cstddef>
#include <cstdint>

#include "config/kv_type.hpp"
#include "kv/kv_codec.hpp"

namespace ferry::gpu {

template <config::KvType T>
struct LatentRows {
  const void* base;
  const float* scales;
  uint32_t R;
  __device__ __forceinline__ float4 load4(size_t row, uint32_t c4) const {
    if constexpr (T == config::KvType::f32) {
      return __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(base) + row * R) + c4);
    } else if constexpr (T == config::KvType::f16) {
      const uint2 h = __ldg(reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(base) + row * R) + c4);
      return make_float4(kv::f16_to_f32(static_cast<uint16_t>(h.x & 0xffffu)), kv::f16_to_f32(static_cast<uint16_t>(h.x >> 16)),
                         kv::f16_to_f32(static_cast<uint16_t>(h.y & 0xffffu)), kv::f16_to_f32(static_cast<uint16_t>(h.y >> 16)));
    } else {
      const char4 q = __ldg(reinterpret_cast<const char4*>(static_cast<const int8_t*>(base) + row * R) + c4);
      const float s = __ldg(scales + row);
      return make_float4(static_cast<float>(q.x) * s, static_cast<float>(q.y) * s, static_cast<float>(q.z) * s,
                         static_cast<float>(q.w) * s);
    }
  }
  __device__ __forceinline__ float load(size_t row, uint32_t c) const {
    if constexpr (T == config::KvType::f32) {
      return __ldg(static_cast<const float*>(base) + row * R + c);
    } else if constexpr (T == config::KvType::f16) {
      return kv::f16_to_f32(__ldg(static_cast<const unsigned short*>(base) + row * R + c));
    } else {
      return static_cast<float>(__ldg(reinterpret_cast<const signed char*>(base) + row * R + c)) * __ldg(scales + row);
    }
  }
};

}  // namespace ferry::gpu
