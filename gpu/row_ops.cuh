#pragma once
// One block's work on one row, shared by the plain kernels (gpu/ops.cu rms_norm and layer_norm,
// gpu/dsa.cu store_latents) and the decode launches that do several of them at once
// (gpu/dsa_decode_fusion.cu): the same code in a block of the same size makes the same bits.
#include <cstddef>
#include <cstdint>

#include "config/kv_type.hpp"
#include "gpu/block_reduce.cuh"
#include "kv/kv_codec.hpp"

namespace ferry::gpu {

// The block sizes of the plain kernels: a launch that does their work in other blocks uses the same,
// so that every thread sums the same elements in the same order.
inline constexpr unsigned kRmsNormThreads = 256, kLayerNormThreads = 128, kStoreLatentThreads = 256;

// o[i] = x[i] * rsqrt(mean(x^2) + eps) * w[i] (w may be null) over n; o may be x. `scratch`: 32 floats.
__device__ __forceinline__ void rms_norm_row(const float* x, const float* w, uint32_t n, float eps, float* o,
                                             float* scratch) {
  float ss = 0.0f;
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) ss += x[i] * x[i];
  const float inv = rsqrtf(block_sum(ss, scratch) / static_cast<float>(n) + eps);
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) o[i] = w ? x[i] * inv * w[i] : x[i] * inv;
}

// o[i] = (x[i] - mean) * rsqrt(var + eps) * w[i] + b[i] over n; o may be x.
__device__ __forceinline__ void layer_norm_row(const float* x, const float* w, const float* b, uint32_t n, float eps,
                                               float* o, float* scratch) {
  float s = 0.0f;
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
  const float mean = block_sum(s, scratch) / static_cast<float>(n);
  float v = 0.0f;
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) v += (x[i] - mean) * (x[i] - mean);
  const float inv = rsqrtf(block_sum(v, scratch) / static_cast<float>(n) + eps);
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) o[i] = (x[i] - mean) * inv * w[i] + b[i];
}

// Row `row` of the latent cache from x in `type` (kv/kv_codec.hpp's encoding); int8 also writes the
// row's scale. Every thread of the block calls it (the int8 maximum is block-wide).
__device__ __forceinline__ void store_latent_row(const float* x, size_t row, uint32_t width, config::KvType type,
                                                 void* cache, float* scales, float* scratch) {
  if (type == config::KvType::f32) {
    for (uint32_t c = threadIdx.x; c < width; c += blockDim.x) static_cast<float*>(cache)[row * width + c] = x[c];
    return;
  }
  if (type == config::KvType::f16) {
    for (uint32_t c = threadIdx.x; c < width; c += blockDim.x) {
      static_cast<uint16_t*>(cache)[row * width + c] = kv::f32_to_f16(x[c]);
    }
    return;
  }
  float m = 0.0f;
  for (uint32_t c = threadIdx.x; c < width; c += blockDim.x) m = fmaxf(m, fabsf(x[c]));
  const float s = kv::int8_scale(block_max(m, scratch));  // every thread gets the block's max
  for (uint32_t c = threadIdx.x; c < width; c += blockDim.x) {
    static_cast<int8_t*>(cache)[row * width + c] = kv::int8_code(x[c], s);
  }
  if (threadIdx.x == 0) scales[row] = s;
}

}  // namespace ferry::gpu
