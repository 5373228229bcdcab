#pragma once
// The mixer coefficients of one mHC row on one warp, shared by the one-block mhc_pre (gpu/ops.cu) and
// the prefill site (gpu/mhc_prefill.cu): pre (sigmoid + eps), post (2 sigmoid) and comb (a row softmax,
// then Sinkhorn rounds: columns first, then rows and columns). Each lane owns entries lane and
// lane + 32 of comb (H*H <= 64) and recomputes the sums it needs from shared memory in the CPU
// reference's order and precision (model/cpu/mhc.cpp, model/cpu/cpu_ops.cpp softmax); the entries of a
// round are all updated in parallel instead of one thread walking a row.
#include <cuda_runtime.h>

#include <cstdint>

#include "gpu/kernels.hpp"

namespace ferry::gpu {

// pre[h] for h < H into `pre` (shared) and, with write_post, post into a.post's row `row`; lanes < H.
// m: the row's mixing logits (before the 1/rms `inv`).
__device__ __forceinline__ void mhc_pre_post(const MhcArgs& a, const float* m, float inv, uint32_t row, bool write_post,
                                             float* pre) {
  const uint32_t H = a.H, lane = threadIdx.x & 31;
  if (lane < H) {
    pre[lane] = 1.0f / (1.0f + expf(-(m[lane] * inv * a.scale[0] + a.base[lane]))) + a.hc_eps;
    if (write_post) a.post[row * H + lane] = 2.0f / (1.0f + expf(-(m[H + lane] * inv * a.scale[1] + a.base[H + lane])));
  }
}

// Entry e of the comb logits (before the softmax) of a row: m[2H + e] * inv * scale[2] + base[2H + e].
__device__ __forceinline__ float mhc_comb_logit(const MhcArgs& a, const float* m, float inv, uint32_t e) {
  return m[2 * a.H + e] * inv * a.scale[2] + a.base[2 * a.H + e];
}

// comb of row `row` into a.comb from its logits in c (H*H floats of shared memory, written by this
// warp's lanes e0 = lane and e1 = lane + 32 before the call), by the whole warp.
__device__ __forceinline__ void mhc_sinkhorn(const MhcArgs& a, uint32_t row, float* c) {
  const uint32_t H = a.H, HH = H * H, lane = threadIdx.x & 31;
  // Entry e0 = lane and e1 = lane + 32 (when H*H > 32): the first entry of its row, and its column.
  const uint32_t e0 = lane, e1 = lane + 32;
  const bool has0 = e0 < HH, has1 = e1 < HH;
  const uint32_t row0 = has0 ? e0 / H * H : 0, col0 = has0 ? e0 % H : 0;
  const uint32_t row1 = has1 ? e1 / H * H : 0, col1 = has1 ? e1 % H : 0;
  __syncwarp();
  auto softmax_entry = [&](uint32_t e, uint32_t first) {
    float mx = -INFINITY;
    for (uint32_t j = 0; j < H; ++j) mx = fmaxf(mx, c[first + j]);
    double sum = 0.0;
    for (uint32_t j = 0; j < H; ++j) sum += expf(c[first + j] - mx);
    return expf(c[e] - mx) * static_cast<float>(1.0 / sum) + a.hc_eps;
  };
  float v0 = has0 ? softmax_entry(e0, row0) : 0.0f;
  float v1 = has1 ? softmax_entry(e1, row1) : 0.0f;
  __syncwarp();
  if (has0) c[e0] = v0;
  if (has1) c[e1] = v1;
  __syncwarp();
  auto row_sum = [&](uint32_t first) {
    float s = 0.0f;
    for (uint32_t j = 0; j < H; ++j) s += c[first + j];
    return s;
  };
  auto col_sum = [&](uint32_t col) {
    float s = 0.0f;
    for (uint32_t i = 0; i < H; ++i) s += c[i * H + col];
    return s;
  };
  // Every entry divided by (its row's or column's sum + eps), all read before any is written.
  auto normalise = [&](bool rows) {
    if (has0) v0 = c[e0] / ((rows ? row_sum(row0) : col_sum(col0)) + a.hc_eps);
    if (has1) v1 = c[e1] / ((rows ? row_sum(row1) : col_sum(col1)) + a.hc_eps);
    __syncwarp();
    if (has0) c[e0] = v0;
    if (has1) c[e1] = v1;
    __syncwarp();
  };
  for (uint32_t it = 0; it < max(a.iters, 1u); ++it) {
    if (it > 0) normalise(true);
    normalise(false);
  }
  if (has0) a.comb[row * HH + e0] = c[e0];
  if (has1) a.comb[row * HH + e1] = c[e1];
}

// comb of row `row` into a.comb, by the whole warp; c: H*H floats of shared scratch.
__device__ __forceinline__ void mhc_comb(const MhcArgs& a, const float* m, float inv, uint32_t row, float* c) {
  const uint32_t HH = a.H * a.H, lane = threadIdx.x & 31;
  if (lane < HH) c[lane] = mhc_comb_logit(a, m, inv, lane);
  if (lane + 32 < HH) c[lane + 32] = mhc_comb_logit(a, m, inv, lane + 32);
  mhc_sinkhorn(a, row, c);
}

}  // namespace ferry::gpu
