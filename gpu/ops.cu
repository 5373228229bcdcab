// Per-row and element-wise kernels of the forward pass: norms, the mHC mixers, SwiGLU, the MoE
// router and combine, cache writes. Sums run in f32 in a fixed order (deterministic results).
#include <algorithm>
#include <string>

#include "gpu/block_reduce.cuh"
#include "gpu/cuda_check.hpp"
#include "gpu/kernels.hpp"
#include "gpu/swiglu.cuh"

namespace ferry::gpu {
namespace {

unsigned grid_for(size_t n, unsigned threads = 256) {
  return static_cast<unsigned>(std::min<size_t>((n + threads - 1) / threads, 65535 * 4));
}

__global__ void rms_norm_kernel(const float* x, size_t x_stride, const float* w, uint32_t n, float eps, float* out,
                                size_t out_stride) {
  __shared__ float scratch[32];
  const float* xr = x + blockIdx.x * x_stride;
  float* o = out + blockIdx.x * out_stride;
  float ss = 0.0f;
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
  const float inv = rsqrtf(block_sum(ss, scratch) / static_cast<float>(n) + eps);
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) o[i] = w ? xr[i] * inv * w[i] : xr[i] * inv;
}

__global__ void layer_norm_kernel(const float* x, size_t x_stride, const float* w, const float* b, uint32_t n,
                                  float eps, float* out, size_t out_stride) {
  __shared__ float scratch[32];
  const float* xr = x + blockIdx.x * x_stride;
  float* o = out + blockIdx.x * out_stride;
  float s = 0.0f;
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) s += xr[i];
  const float mean = block_sum(s, scratch) / static_cast<float>(n);
  float v = 0.0f;
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) v += (xr[i] - mean) * (xr[i] - mean);
  const float inv = rsqrtf(block_sum(v, scratch) / static_cast<float>(n) + eps);
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) o[i] = (xr[i] - mean) * inv * w[i] + b[i];
}

constexpr int kMaxHc = 8;

// The mixer coefficients of one row, by one warp: pre (sigmoid + eps), post (2 sigmoid) and comb (a
// row softmax, then Sinkhorn rounds: columns first, then rows and columns). Each lane owns entries
// lane and lane + 32 of comb (H*H <= 64) and recomputes the sums it needs from shared memory in the
// CPU reference's order and precision (model/cpu/mhc.cpp, model/cpu/cpu_ops.cpp softmax); the entries of a
// round are all updated in parallel instead of one thread walking a row.
__device__ void mhc_coefficients(const MhcArgs& a, const float* m, float inv, float* pre, float* c) {
  const uint32_t H = a.H, HH = H * H, lane = threadIdx.x & 31;
  if (lane < H) {
    pre[lane] = 1.0f / (1.0f + expf(-(m[lane] * inv * a.scale[0] + a.base[lane]))) + a.hc_eps;
    a.post[blockIdx.x * H + lane] = 2.0f / (1.0f + expf(-(m[H + lane] * inv * a.scale[1] + a.base[H + lane])));
  }
  // Entry e0 = lane and e1 = lane + 32 (when H*H > 32): the first entry of its row, and its column.
  const uint32_t e0 = lane, e1 = lane + 32;
  const bool has0 = e0 < HH, has1 = e1 < HH;
  const uint32_t row0 = has0 ? e0 / H * H : 0, col0 = has0 ? e0 % H : 0;
  const uint32_t row1 = has1 ? e1 / H * H : 0, col1 = has1 ? e1 % H : 0;
  if (has0) c[e0] = m[2 * H + e0] * inv * a.scale[2] + a.base[2 * H + e0];
  if (has1) c[e1] = m[2 * H + e1] * inv * a.scale[2] + a.base[2 * H + e1];
  __syncwarp();
  auto softmax_entry = [&](uint32_t e, uint32_t row) {
    float mx = -INFINITY;
    for (uint32_t j = 0; j < H; ++j) mx = fmaxf(mx, c[row + j]);
    double sum = 0.0;
    for (uint32_t j = 0; j < H; ++j) sum += expf(c[row + j] - mx);
    return expf(c[e] - mx) * static_cast<float>(1.0 / sum) + a.hc_eps;
  };
  float v0 = has0 ? softmax_entry(e0, row0) : 0.0f;
  float v1 = has1 ? softmax_entry(e1, row1) : 0.0f;
  __syncwarp();
  if (has0) c[e0] = v0;
  if (has1) c[e1] = v1;
  __syncwarp();
  auto row_sum = [&](uint32_t row) {
    float s = 0.0f;
    for (uint32_t j = 0; j < H; ++j) s += c[row + j];
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
  if (has0) a.comb[blockIdx.x * HH + e0] = c[e0];
  if (has1) a.comb[blockIdx.x * HH + e1] = c[e1];
}

// One block per row: the RMS of the H streams (float4 loads, all in flight), the coefficients (warp
// 0), the collapsed stream and its RMSNorm. D is a multiple of 4 (checked by mhc_pre).
__global__ void __launch_bounds__(1024) mhc_pre_kernel(MhcArgs a) {
  extern __shared__ float4 u[];  // [D/4]
  __shared__ float scratch[32];
  __shared__ float pre[kMaxHc];
  __shared__ float c[kMaxHc * kMaxHc];
  const uint32_t H = a.H, D4 = a.D / 4;
  const float4* R = reinterpret_cast<const float4*>(a.streams + static_cast<size_t>(blockIdx.x) * H * a.D);
  float ss = 0.0f;
  for (uint32_t i = threadIdx.x; i < H * D4; i += blockDim.x) {
    const float4 r = R[i];
    ss += r.x * r.x + r.y * r.y + r.z * r.z + r.w * r.w;
  }
  const float inv = rsqrtf(block_sum(ss, scratch) / static_cast<float>(H * a.D) + a.rms_eps);
  if (threadIdx.x < 32) mhc_coefficients(a, a.mix + static_cast<size_t>(blockIdx.x) * (2 + H) * H, inv, pre, c);
  __syncthreads();
  float su = 0.0f;
  for (uint32_t d = threadIdx.x; d < D4; d += blockDim.x) {
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (uint32_t h = 0; h < H; ++h) {
      const float4 r = R[h * D4 + d];
      v.x += pre[h] * r.x, v.y += pre[h] * r.y, v.z += pre[h] * r.z, v.w += pre[h] * r.w;
    }
    u[d] = v;
    su += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
  }
  const float inv_u = rsqrtf(block_sum(su, scratch) / static_cast<float>(a.D) + a.rms_eps);
  float4* x = reinterpret_cast<float4*>(a.x + static_cast<size_t>(blockIdx.x) * a.D);
  const float4* w = reinterpret_cast<const float4*>(a.norm_w);
  for (uint32_t d = threadIdx.x; d < D4; d += blockDim.x) {
    const float4 v = u[d], g = w[d];
    x[d] = make_float4(v.x * inv_u * g.x, v.y * inv_u * g.y, v.z * inv_u * g.z, v.w * inv_u * g.w);
  }
}

__global__ void mhc_post_kernel(float* streams, const float* y, const float* post, const float* comb, uint32_t rows,
                                uint32_t H, uint32_t D) {
  const size_t total = static_cast<size_t>(rows) * D;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t r = i / D, d = i % D;
    float* R = streams + r * H * D + d;
    float old[kMaxHc];
    for (uint32_t h = 0; h < H; ++h) old[h] = R[h * D];
    const float yv = y[i];
    const float* c = comb + r * H * H;
    for (uint32_t h2 = 0; h2 < H; ++h2) {
      float v = post[r * H + h2] * yv;
      for (uint32_t h = 0; h < H; ++h) v += c[h * H + h2] * old[h];
      R[h2 * D] = v;
    }
  }
}

__global__ void hc_head_kernel(const float* streams, const int32_t* rows_idx, uint32_t H, uint32_t D, const float* w,
                               float eps, float* out) {
  extern __shared__ float m[];  // [D]
  __shared__ float scratch[32];
  const float* R = streams + static_cast<size_t>(rows_idx[blockIdx.x]) * H * D;
  float ss = 0.0f;
  for (uint32_t d = threadIdx.x; d < D; d += blockDim.x) {
    float v = 0.0f;
    for (uint32_t h = 0; h < H; ++h) v += R[h * D + d];
    v /= static_cast<float>(H);
    m[d] = v;
    ss += v * v;
  }
  const float inv = rsqrtf(block_sum(ss, scratch) / static_cast<float>(D) + eps);
  for (uint32_t d = threadIdx.x; d < D; d += blockDim.x) out[static_cast<size_t>(blockIdx.x) * D + d] = m[d] * inv * w[d];
}

__global__ void swiglu_kernel(float* gate, const float* up, size_t stride, uint32_t rows, uint32_t n, float limit) {
  const size_t total = static_cast<size_t>(rows) * n;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t at = (i / n) * stride + i % n;
    gate[at] = swiglu_value(gate[at], up[at], limit);
  }
}

// One warp per row. Ties (equal scores) go to the lower expert / group index.
__global__ void moe_route_kernel(RouterArgs a) {
  constexpr int kMaxE = 1024;
  __shared__ float s_sig[4][kMaxE], s_choice[4][kMaxE];
  const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const uint32_t row = blockIdx.x * 4 + warp;
  if (row >= a.rows) return;
  float* sig = s_sig[warp];
  float* choice = s_choice[warp];
  const float* lg = a.logits + static_cast<size_t>(row) * a.E;
  for (uint32_t e = lane; e < a.E; e += 32) {
    sig[e] = 1.0f / (1.0f + expf(-lg[e]));
    choice[e] = sig[e] + a.bias[e];
  }
  __syncwarp();
  const uint32_t per_group = a.E / a.n_group;
  if (a.topk_group < a.n_group) {
    // Group score: the sum of its two best choice scores; groups not kept are masked out.
    if (lane == 0) {
      float gs[64];
      bool keep[64];
      for (uint32_t g = 0; g < a.n_group; ++g) {
        float b1 = -INFINITY, b2 = -INFINITY;
        for (uint32_t e = g * per_group; e < (g + 1) * per_group; ++e) {
          const float v = choice[e];
          if (v > b1) {
            b2 = b1;
            b1 = v;
          } else if (v > b2) {
            b2 = v;
          }
        }
        gs[g] = b1 + b2;
        keep[g] = false;
      }
      for (uint32_t k = 0; k < a.topk_group; ++k) {
        int best = -1;
        for (uint32_t g = 0; g < a.n_group; ++g) {
          if (!keep[g] && (best < 0 || gs[g] > gs[best])) best = static_cast<int>(g);
        }
        keep[best] = true;
      }
      for (uint32_t g = 0; g < a.n_group; ++g) {
        if (!keep[g]) {
          for (uint32_t e = g * per_group; e < (g + 1) * per_group; ++e) choice[e] = -INFINITY;
        }
      }
    }
    __syncwarp();
  }
  float wsum = 0.0f;
  for (uint32_t k = 0; k < a.k; ++k) {
    float best = -INFINITY;
    int best_e = 0x7fffffff;
    for (uint32_t e = lane; e < a.E; e += 32) {
      if (choice[e] > best) {
        best = choice[e];
        best_e = static_cast<int>(e);
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oe = __shfl_xor_sync(0xffffffffu, best_e, o);
      if (ob > best || (ob == best && oe < best_e)) {
        best = ob;
        best_e = oe;
      }
    }
    if (best_e == 0x7fffffff) best_e = 0;  // fewer candidates than k (all masked): never in practice
    if (lane == 0) {
      a.ids[row * a.k + k] = best_e;
      a.weights[row * a.k + k] = sig[best_e];
      choice[best_e] = -INFINITY;
    }
    wsum += sig[best_e];
    __syncwarp();
  }
  if (lane < a.k) {
    float w = a.weights[row * a.k + lane];
    if (a.norm_topk_prob) w /= (wsum + 1e-20f);
    a.weights[row * a.k + lane] = w * a.scaling;
  }
}

__global__ void moe_combine_kernel(const float* eo, const int32_t* where, const float* weights, const float* shared,
                                   uint32_t rows, uint32_t k, uint32_t D, float* y) {
  const size_t total = static_cast<size_t>(rows) * D;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t r = i / D, d = i % D;
    float v = 0.0f;
    for (uint32_t j = 0; j < k; ++j) {
      const size_t slot = where ? static_cast<size_t>(where[r * k + j]) : r * k + j;
      v += weights[r * k + j] * eo[slot * D + d];
    }
    y[i] = (shared ? shared[i] : 0.0f) + v;
  }
}

__global__ void count_routes_kernel(const int32_t* ids, uint32_t n, uint32_t* counts) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    atomicAdd(counts + ids[i], 1u);
  }
}

__global__ void set_table_entry_kernel(const uint8_t** table, uint32_t index, const uint8_t* value) {
  table[index] = value;
}

__global__ void scatter_to_cache_kernel(const float* src, size_t src_stride, RowInfo rows, uint32_t n_rows,
                                        uint32_t width, uint32_t ctx, float* cache) {
  const size_t total = static_cast<size_t>(n_rows) * width;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t r = i / width, c = i % width;
    const size_t at = (static_cast<size_t>(rows.slot[r]) * ctx + static_cast<uint32_t>(rows.pos[r]) % ctx) * width + c;
    cache[at] = src[r * src_stride + c];
  }
}

}  // namespace

void rms_norm(const float* x, size_t x_stride, const float* w, uint32_t rows, uint32_t n, float eps, float* out,
              size_t out_stride, cudaStream_t stream) {
  if (rows == 0) return;
  rms_norm_kernel<<<rows, 256, 0, stream>>>(x, x_stride, w, n, eps, out, out_stride);
  FERRY_CUDA_LAUNCHED();
}

void layer_norm(const float* x, size_t x_stride, const float* w, const float* b, uint32_t rows, uint32_t n, float eps,
                float* out, size_t out_stride, cudaStream_t stream) {
  if (rows == 0) return;
  layer_norm_kernel<<<rows, 128, 0, stream>>>(x, x_stride, w, b, n, eps, out, out_stride);
  FERRY_CUDA_LAUNCHED();
}

void mhc_pre(const MhcArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  if (a.H > kMaxHc) throw CudaError("mHC with more than 8 streams");
  if (a.D % 4 != 0) throw CudaError("mHC: hidden size " + std::to_string(a.D) + " is not a multiple of 4");
  const size_t smem = a.D * sizeof(float);
  if (smem > 48 * 1024) FERRY_CUDA(cudaFuncSetAttribute(mhc_pre_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  mhc_pre_kernel<<<a.rows, 1024, smem, stream>>>(a);
  FERRY_CUDA_LAUNCHED();
}

void mhc_post(float* streams, const float* y, const float* post, const float* comb, uint32_t rows, uint32_t H,
              uint32_t D, cudaStream_t stream) {
  if (rows == 0) return;
  mhc_post_kernel<<<grid_for(static_cast<size_t>(rows) * D), 256, 0, stream>>>(streams, y, post, comb, rows, H, D);
  FERRY_CUDA_LAUNCHED();
}

void hc_head(const float* streams, const int32_t* rows_idx, uint32_t n, uint32_t H, uint32_t D, const float* w,
             float eps, float* out, cudaStream_t stream) {
  if (n == 0) return;
  const size_t smem = D * sizeof(float);
  if (smem > 48 * 1024) FERRY_CUDA(cudaFuncSetAttribute(hc_head_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  hc_head_kernel<<<n, 512, smem, stream>>>(streams, rows_idx, H, D, w, eps, out);
  FERRY_CUDA_LAUNCHED();
}

void swiglu(float* gate, const float* up, size_t stride, uint32_t rows, uint32_t n, float limit, cudaStream_t stream) {
  if (rows == 0) return;
  swiglu_kernel<<<grid_for(static_cast<size_t>(rows) * n), 256, 0, stream>>>(gate, up, stride, rows, n, limit);
  FERRY_CUDA_LAUNCHED();
}

void moe_route(const RouterArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  if (a.E > 1024 || a.k > 32 || a.n_group > 64 || a.n_group == 0 || a.E % a.n_group != 0) {
    throw CudaError("MoE router: unsupported expert count / top-k / groups");
  }
  moe_route_kernel<<<(a.rows + 3) / 4, 128, 0, stream>>>(a);
  FERRY_CUDA_LAUNCHED();
}

void moe_combine(const float* expert_out, const int32_t* where, const float* weights, const float* shared,
                 uint32_t rows, uint32_t k, uint32_t D, float* y, cudaStream_t stream) {
  if (rows == 0) return;
  moe_combine_kernel<<<grid_for(static_cast<size_t>(rows) * D), 256, 0, stream>>>(expert_out, where, weights, shared,
                                                                                   rows, k, D, y);
  FERRY_CUDA_LAUNCHED();
}

void count_routes(const int32_t* ids, uint32_t n, uint32_t* counts, cudaStream_t stream) {
  if (n == 0) return;
  count_routes_kernel<<<grid_for(n), 256, 0, stream>>>(ids, n, counts);
  FERRY_CUDA_LAUNCHED();
}

void set_table_entry(const uint8_t** table, uint32_t index, const uint8_t* value, cudaStream_t stream) {
  set_table_entry_kernel<<<1, 1, 0, stream>>>(table, index, value);
  FERRY_CUDA_LAUNCHED();
}

void scatter_to_cache(const float* src, size_t src_stride, RowInfo rows, uint32_t n_rows, uint32_t width,
                      uint32_t ctx, float* cache, cudaStream_t stream) {
  if (n_rows == 0) return;
  scatter_to_cache_kernel<<<grid_for(static_cast<size_t>(n_rows) * width), 256, 0, stream>>>(src, src_stride, rows,
                                                                                            n_rows, width, ctx, cache);
  FERRY_CUDA_LAUNCHED();
}

}  // namespace ferry::gpu
