// Per-row and element-wise kernels of the forward pass: norms, the mHC mixers, SwiGLU, the MoE
// router and combine, cache writes. Sums run in f32 in a fixed order (deterministic results).
#include <algorithm>
#include <string>

#include "gpu/block_reduce.cuh"
#include "gpu/cuda_check.hpp"
#include "gpu/kernels.hpp"
#include "gpu/mhc_coefficients.cuh"
#include "gpu/mhc_decode.hpp"
#include "gpu/moe_route.cuh"
#include "gpu/pdl.cuh"
#include "gpu/row_ops.cuh"
#include "gpu/half_split.cuh"
#include "gpu/swiglu.cuh"

namespace ferry::gpu {
namespace {

unsigned grid_for(size_t n, unsigned threads = 256) {
  return static_cast<unsigned>(std::min<size_t>((n + threads - 1) / threads, 65535 * 4));
}

__global__ void rms_norm_kernel(const float* x, size_t x_stride, const float* w, uint32_t n, float eps, float* out,
                                size_t out_stride) {
  pdl_launch_dependents();  // the next matvec may request its weights now (gpu/pdl.hpp)
  __shared__ float scratch[32];
  rms_norm_row(x + blockIdx.x * x_stride, w, n, eps, out + blockIdx.x * out_stride, scratch);
}

__global__ void layer_norm_kernel(const float* x, size_t x_stride, const float* w, const float* b, uint32_t n,
                                  float eps, float* out, size_t out_stride) {
  __shared__ float scratch[32];
  layer_norm_row(x + blockIdx.x * x_stride, w, b, n, eps, out + blockIdx.x * out_stride, scratch);
}

constexpr int kMaxHc = 8;

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
  if (threadIdx.x < 32) {
    const float* m = a.mix + static_cast<size_t>(blockIdx.x) * (2 + H) * H;
    mhc_pre_post(a, m, inv, blockIdx.x, true, pre);
    mhc_comb(a, m, inv, blockIdx.x, c);
  }
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

// Column d of row r's streams after the post with the sublayer output yv (explicit fmas:
// gpu/mhc_decode.cu's fused post makes the same bits).
__device__ __forceinline__ void post_column(float* streams, float yv, const float* post, const float* comb, size_t r,
                                            size_t d, uint32_t H, uint32_t D) {
  float* R = streams + r * H * D + d;
  float old[kMaxHc];
  for (uint32_t h = 0; h < H; ++h) old[h] = R[h * D];
  const float* c = comb + r * H * H;
  for (uint32_t h2 = 0; h2 < H; ++h2) {
    float v = post[r * H + h2] * yv;
    for (uint32_t h = 0; h < H; ++h) v = __fmaf_rn(c[h * H + h2], old[h], v);
    R[h2 * D] = v;
  }
}

// mhc_post over float4 columns for H streams (GLM's 4; D a multiple of 4, 16-byte aligned rows), a
// thread's 4 columns of every stream at once in 32-bit index math, the streams in registers:
// post_column's fmas in its order, component by component (its bits), without a 64-bit division and
// modulo a column.
template <uint32_t H>
__global__ void mhc_post_vec_kernel(float4* streams, const float4* y, const float* post, const float* comb,
                                    uint32_t total4, uint32_t D4) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total4; i += gridDim.x * blockDim.x) {
    const uint32_t r = i / D4, d = i - r * D4;
    float4* R = streams + static_cast<size_t>(r) * H * D4 + d;
    float4 old[H];
#pragma unroll
    for (uint32_t h = 0; h < H; ++h) old[h] = R[h * D4];
    const float4 yv = y[i];
    const float* c = comb + static_cast<size_t>(r) * H * H;
#pragma unroll
    for (uint32_t h2 = 0; h2 < H; ++h2) {
      const float p = post[r * H + h2];
      float4 v = make_float4(p * yv.x, p * yv.y, p * yv.z, p * yv.w);
#pragma unroll
      for (uint32_t h = 0; h < H; ++h) {
        const float w = c[h * H + h2];
        v.x = __fmaf_rn(w, old[h].x, v.x), v.y = __fmaf_rn(w, old[h].y, v.y);
        v.z = __fmaf_rn(w, old[h].z, v.z), v.w = __fmaf_rn(w, old[h].w, v.w);
      }
      R[h2 * D4] = v;
    }
  }
}

__global__ void mhc_post_kernel(float* streams, const float* y, const float* post, const float* comb, uint32_t rows,
                                uint32_t H, uint32_t D) {
  const size_t total = static_cast<size_t>(rows) * D;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    post_column(streams, y[i], post, comb, i / D, i % D, H, D);
  }
}

// Column d of row r of the MoE combine: the routes' weighted expert outputs summed by explicit fmas in
// route order (gpu/mhc_decode.cu's float4 combine does the same), then the shared expert's added;
// `where` maps a route to its expert-output row (null: route order).
__device__ __forceinline__ float moe_combined(const float* eo, const int32_t* where, const float* weights,
                                              const float* shared, size_t r, size_t d, uint32_t k, uint32_t D) {
  float v = 0.0f;
  for (uint32_t j = 0; j < k; ++j) {
    const size_t slot = where ? static_cast<size_t>(where[r * k + j]) : r * k + j;
    v = __fmaf_rn(weights[r * k + j], eo[slot * D + d], v);
  }
  return (shared ? shared[r * D + d] : 0.0f) + v;
}

// moe_combine's value (no `where`) as the post's y.
__global__ void mhc_post_combine_kernel(float* streams, MoeCombineIn m, const float* post, const float* comb,
                                        uint32_t rows, uint32_t H, uint32_t D) {
  const size_t total = static_cast<size_t>(rows) * D;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t r = i / D, d = i % D;
    post_column(streams, moe_combined(m.eo, nullptr, m.weights, m.shared, r, d, m.k, D), post, comb, r, d, H, D);
  }
}

__global__ void hc_head_kernel(const float* streams, const int32_t* rows_idx, uint32_t H, uint32_t D, const float* w,
                               float eps, float* out) {
  extern __shared__ float m[];  // [D]
  __shared__ float scratch[32];
  const float* R = streams + static_cast<size_t>(rows_idx[blockIdx.x]) * H * D;
  float* const o = out + static_cast<size_t>(blockIdx.x) * D;
  // A thread's columns d = threadIdx.x + i * blockDim.x: the first kAhead (all of them at GLM's D = 4,096)
  // with their streams and norm weights asked for at once, before any sum (one memory round trip, not
  // one a column and another a weight); the rest as they come. The same sums in the same order.
  constexpr uint32_t kAhead = 8;
  float r[kAhead][kMaxHc], wv[kAhead];
#pragma unroll
  for (uint32_t i = 0; i < kAhead; ++i) {
    const uint32_t d = threadIdx.x + i * blockDim.x;
#pragma unroll
    for (uint32_t h = 0; h < kMaxHc; ++h) r[i][h] = d < D && h < H ? R[h * D + d] : 0.0f;
    wv[i] = d < D ? w[d] : 0.0f;
  }
  float ss = 0.0f;
  auto column = [&](uint32_t d, float v) {
    v /= static_cast<float>(H);
    m[d] = v;
    ss += v * v;
  };
#pragma unroll
  for (uint32_t i = 0; i < kAhead; ++i) {
    float v = 0.0f;
#pragma unroll
    for (uint32_t h = 0; h < kMaxHc; ++h) {
      if (h < H) v += r[i][h];
    }
    if (threadIdx.x + i * blockDim.x < D) column(threadIdx.x + i * blockDim.x, v);
  }
  for (uint32_t d = threadIdx.x + kAhead * blockDim.x; d < D; d += blockDim.x) {
    float v = 0.0f;
    for (uint32_t h = 0; h < H; ++h) v += R[h * D + d];
    column(d, v);
  }
  const float inv = rsqrtf(block_sum(ss, scratch) / static_cast<float>(D) + eps);
#pragma unroll
  for (uint32_t i = 0; i < kAhead; ++i) {
    const uint32_t d = threadIdx.x + i * blockDim.x;
    if (d < D) o[d] = m[d] * inv * wv[i];
  }
  for (uint32_t d = threadIdx.x + kAhead * blockDim.x; d < D; d += blockDim.x) o[d] = m[d] * inv * w[d];
}

// Rows laid end to end (stride == n), four values a thread in 32-bit index math: the element kernel
// below pays a 64-bit division and modulo a value, which bound it, not the bytes.
__global__ void swiglu_vec_kernel(float4* gate, const float4* up, uint32_t total4, float limit) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total4; i += gridDim.x * blockDim.x) {
    const float4 g = gate[i], u = up[i];
    gate[i] = make_float4(swiglu_value(g.x, u.x, limit), swiglu_value(g.y, u.y, limit), swiglu_value(g.z, u.z, limit),
                          swiglu_value(g.w, u.w, limit));
  }
}

// swiglu_vec_kernel's values as LayerRunner::mm_staged's split input (half_split.cuh): row r's lo values, then its
// hi values, rows 2 n apart; 8 values a thread (n a multiple of 8), one 16-byte store of each half.
__global__ void swiglu_split_kernel(const float4* gate, const float4* up, uint32_t vpr, uint32_t total, float limit,
                                    __half* lo_hi) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const float4 g0 = gate[2 * i], g1 = gate[2 * i + 1], u0 = up[2 * i], u1 = up[2 * i + 1];
    const float v[8] = {swiglu_value(g0.x, u0.x, limit), swiglu_value(g0.y, u0.y, limit),
                        swiglu_value(g0.z, u0.z, limit), swiglu_value(g0.w, u0.w, limit),
                        swiglu_value(g1.x, u1.x, limit), swiglu_value(g1.y, u1.y, limit),
                        swiglu_value(g1.z, u1.z, limit), swiglu_value(g1.w, u1.w, limit)};
    uint4 hi, lo;
    split8(v, hi, lo);
    const uint32_t r = i / vpr, at = r * 16 * vpr + 8 * (i - r * vpr);
    *reinterpret_cast<uint4*>(lo_hi + at) = lo;
    *reinterpret_cast<uint4*>(lo_hi + at + 8 * vpr) = hi;
  }
}

__global__ void swiglu_kernel(float* gate, const float* up, size_t stride, uint32_t rows, uint32_t n, float limit) {
  const size_t total = static_cast<size_t>(rows) * n;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t at = (i / n) * stride + i % n;
    gate[at] = swiglu_value(gate[at], up[at], limit);
  }
}

// One block a row, one thread an expert (gpu/moe_route.cuh).
__global__ void __launch_bounds__(1024) moe_route_kernel(RouterArgs a) {
  pdl_launch_dependents();  // the shared expert's matvec may request its weights now (gpu/pdl.hpp)
  __shared__ RouteScratch s;
  route_row(a, blockIdx.x, s);
}

__global__ void moe_combine_kernel(const float* eo, const int32_t* where, const float* weights, const float* shared,
                                   uint32_t rows, uint32_t k, uint32_t D, float* y) {
  const size_t total = static_cast<size_t>(rows) * D;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    y[i] = moe_combined(eo, where, weights, shared, i / D, i % D, k, D);
  }
}

// moe_combine_kernel's values a row a block, four columns a thread (D a multiple of 4, every row
// 16-byte aligned): the row's slots and weights read once into shared memory, each column's k
// products added in the same order by the same FMAs (the same bits), without a 64-bit division an
// element.
constexpr uint32_t kCombineThreads = 256, kMaxCombineK = 32;

__global__ void __launch_bounds__(kCombineThreads) moe_combine_rows_kernel(const float* eo, const int32_t* where,
                                                                         const float* weights, const float* shared,
                                                                         uint32_t k, uint32_t D, float* y) {
  __shared__ const float* src[kMaxCombineK];
  __shared__ float w[kMaxCombineK];
  const size_t r = blockIdx.x;
  if (threadIdx.x < k) {
    const size_t route = r * k + threadIdx.x;
    const size_t slot = where ? static_cast<size_t>(where[route]) : route;
    src[threadIdx.x] = eo + slot * D;
    w[threadIdx.x] = weights[route];
  }
  __syncthreads();
  for (uint32_t c = 4 * threadIdx.x; c < D; c += 4 * kCombineThreads) {
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
    for (uint32_t j = 0; j < k; ++j) {
      const float4 e = *reinterpret_cast<const float4*>(src[j] + c);
      v.x = __fmaf_rn(w[j], e.x, v.x);
      v.y = __fmaf_rn(w[j], e.y, v.y);
      v.z = __fmaf_rn(w[j], e.z, v.z);
      v.w = __fmaf_rn(w[j], e.w, v.w);
    }
    if (shared != nullptr) {
      const float4 s = *reinterpret_cast<const float4*>(shared + r * D + c);
      v = make_float4(s.x + v.x, s.y + v.y, s.z + v.z, s.w + v.w);
    } else {
      v = make_float4(0.0f + v.x, 0.0f + v.y, 0.0f + v.z, 0.0f + v.w);
    }
    *reinterpret_cast<float4*>(y + r * D + c) = v;
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
  rms_norm_kernel<<<rows, kRmsNormThreads, 0, stream>>>(x, x_stride, w, n, eps, out, out_stride);
  FERRY_CUDA_LAUNCHED();
}

void layer_norm(const float* x, size_t x_stride, const float* w, const float* b, uint32_t rows, uint32_t n, float eps,
                float* out, size_t out_stride, cudaStream_t stream) {
  if (rows == 0) return;
  layer_norm_kernel<<<rows, kLayerNormThreads, 0, stream>>>(x, x_stride, w, b, n, eps, out, out_stride);
  FERRY_CUDA_LAUNCHED();
}

void mhc_pre(const MhcArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  if (mhc_pre_clustered(a, stream)) return;
  mhc_pre_one_block(a, stream);
}

void mhc_pre_one_block(const MhcArgs& a, cudaStream_t stream) {
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
  const size_t total4 = static_cast<size_t>(rows) * D / 4;
  const auto aligned = [](const float* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (H == 4 && D % 4 == 0 && total4 < (size_t{1} << 31) && aligned(streams) && aligned(y)) {
    mhc_post_vec_kernel<4><<<grid_for(total4), 256, 0, stream>>>(reinterpret_cast<float4*>(streams),
                                                                  reinterpret_cast<const float4*>(y), post, comb,
                                                                  static_cast<uint32_t>(total4), D / 4);
    FERRY_CUDA_LAUNCHED();
    return;
  }
  mhc_post_kernel<<<grid_for(static_cast<size_t>(rows) * D), 256, 0, stream>>>(streams, y, post, comb, rows, H, D);
  FERRY_CUDA_LAUNCHED();
}

void mhc_post_combine(float* streams, const MoeCombineIn& combine, const float* post, const float* comb, uint32_t rows,
                      uint32_t H, uint32_t D, cudaStream_t stream) {
  if (rows == 0) return;
  if (H > kMaxHc) throw CudaError("mHC with more than 8 streams");
  if (combine.eo == nullptr || combine.weights == nullptr || combine.k == 0) {
    throw CudaError("mhc_post_combine: a MoE combine needs its expert outputs, weights and k");
  }
  mhc_post_combine_kernel<<<grid_for(static_cast<size_t>(rows) * D), 256, 0, stream>>>(streams, combine, post, comb,
                                                                                     rows, H, D);
  FERRY_CUDA_LAUNCHED();
}

void hc_head(const float* streams, const int32_t* rows_idx, uint32_t n, uint32_t H, uint32_t D, const float* w,
             float eps, float* out, cudaStream_t stream) {
  if (n == 0) return;
  if (H > kMaxHc) throw CudaError("mHC with more than 8 streams");
  const size_t smem = D * sizeof(float);
  if (smem > 48 * 1024) FERRY_CUDA(cudaFuncSetAttribute(hc_head_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  hc_head_kernel<<<n, 512, smem, stream>>>(streams, rows_idx, H, D, w, eps, out);
  FERRY_CUDA_LAUNCHED();
}

bool swiglu_split(const float* gate, const float* up, uint32_t rows, uint32_t n, float limit, void* lo_hi,
                  cudaStream_t stream) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (rows == 0 || n % 8 != 0 || 2 * size_t{rows} * n >= (size_t{1} << 31) || !aligned(gate) || !aligned(up) ||
      !aligned(lo_hi)) {
    return false;
  }
  const uint32_t total = rows * (n / 8);
  swiglu_split_kernel<<<grid_for(total), 256, 0, stream>>>(reinterpret_cast<const float4*>(gate),
                                                           reinterpret_cast<const float4*>(up), n / 8, total, limit,
                                                           static_cast<__half*>(lo_hi));
  FERRY_CUDA_LAUNCHED();
  return true;
}

void swiglu(float* gate, const float* up, size_t stride, uint32_t rows, uint32_t n, float limit, cudaStream_t stream) {
  if (rows == 0) return;
  const size_t total = static_cast<size_t>(rows) * n;
  const auto aligned = [](const float* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (stride == n && total % 4 == 0 && total / 4 < (size_t{1} << 31) && aligned(gate) && aligned(up)) {
    swiglu_vec_kernel<<<grid_for(total / 4), 256, 0, stream>>>(reinterpret_cast<float4*>(gate),
                                                                reinterpret_cast<const float4*>(up),
                                                                static_cast<uint32_t>(total / 4), limit);
    FERRY_CUDA_LAUNCHED();
    return;
  }
  swiglu_kernel<<<grid_for(static_cast<size_t>(rows) * n), 256, 0, stream>>>(gate, up, stride, rows, n, limit);
  FERRY_CUDA_LAUNCHED();
}

void moe_route(const RouterArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  if (a.E == 0 || a.E > 1024 || a.k == 0 || a.k > 32 || a.k > a.E || a.n_group > 64 || a.n_group == 0 ||
      a.E % a.n_group != 0 || a.topk_group == 0) {
    throw CudaError("MoE router: unsupported shape: " + std::to_string(a.E) + " experts, top " + std::to_string(a.k) +
                    ", " + std::to_string(a.topk_group) + " of " + std::to_string(a.n_group) +
                    " groups (at most 1,024 experts, top 32, 64 groups; groups divide the experts)");
  }
  moe_route_kernel<<<a.rows, (a.E + 31) / 32 * 32, 0, stream>>>(a);
  FERRY_CUDA_LAUNCHED();
}

void moe_combine(const float* expert_out, const int32_t* where, const float* weights, const float* shared,
                 uint32_t rows, uint32_t k, uint32_t D, float* y, cudaStream_t stream) {
  if (rows == 0) return;
  const auto aligned = [](const float* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (D % 4 == 0 && k <= kMaxCombineK && aligned(expert_out) && aligned(y) && (shared == nullptr || aligned(shared))) {
    moe_combine_rows_kernel<<<rows, kCombineThreads, 0, stream>>>(expert_out, where, weights, shared, k, D, y);
  } else {
    moe_combine_kernel<<<grid_for(static_cast<size_t>(rows) * D), 256, 0, stream>>>(expert_out, where, weights,
                                                                                     shared, rows, k, D, y);
  }
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
