// TEMPORARY (h71 A/B check): the cluster kernel before h71, selected by FERRY_MHC_SITE=old; removed before the final commit.
// One mHC site for decode rows on sm90+, a cluster of 8 blocks a row. The one-block kernel
// (gpu/ops.cu) reads a row's H streams twice on one SM and runs the coefficients on one warp while the
// rest wait; here each block reads a slice of the streams once (kept in registers and shared memory),
// sums the slice's Gram matrix (G[h][h'] = sum_d R[h][d] R[h'][d], in f64) and, when it makes the
// mixing logits itself, the slice's part of fn @ streams; the cluster adds the slices' sums through
// distributed shared memory. trace(G) is the row's sum of squares (the 1/rms), and pre^T G pre the
// collapsed stream's (its RMSNorm), so no block reads the streams a second time. Every block then
// computes the coefficients (the same inputs in the same order: the same bits), and its slice of x.
// The post of the site before is local to a slice too (each column mixes only its own H values), so
// it runs first in the same launch.
#include <cooperative_groups.h>

#include <cmath>
#include <cstdint>

#include "gpu/block_reduce.cuh"
#include "gpu/cuda_check.hpp"
#include "gpu/mhc_decode.hpp"
#include "gpu/pdl.cuh"
#include "gpu/pdl.hpp"

namespace ferry::gpu {
namespace {

namespace cg = cooperative_groups;

constexpr uint32_t kBlocks = 8;  // a row's cluster (the portable maximum)
constexpr uint32_t kH = 4;       // GLM's hc_mult; other stream counts take the one-block kernel
// [[maybe_unused]]: kPairs, dot4 and coefficients serve only the sm90 kernel body, which a pre-sm90
// pass leaves out.
[[maybe_unused]] constexpr uint32_t kPairs = kH * (kH + 1) / 2;
constexpr uint32_t kMix = (2 + kH) * kH;
constexpr uint32_t kMaxThreads = 1024;
constexpr uint32_t kMaxPer = 256;  // float4 columns a block: D <= 8,192

[[maybe_unused]] __device__ __forceinline__ double dot4(float4 a, float4 b) {
  return double(a.x) * b.x + double(a.y) * b.y + double(a.z) * b.z + double(a.w) * b.w;
}

// The coefficients of one row on one warp, each lane one entry of comb (H*H <= 32), the row and
// column sums gathered by shuffles: the one-block kernel's operations (ops.cu mhc_coefficients, the
// CPU's order and precision) on registers instead of shared memory.
[[maybe_unused]] __device__ void coefficients(const MhcArgs& a, const float* m, float inv, uint32_t row, bool write,
                                              float* pre) {
  static_assert(kH * kH <= 32 && 32 % kH == 0, "one comb entry a lane; source lanes stay below 32");
  const uint32_t lane = threadIdx.x & 31, HH = kH * kH;
  if (lane < kH) {
    pre[lane] = 1.0f / (1.0f + expf(-(m[lane] * inv * a.scale[0] + a.base[lane]))) + a.hc_eps;
    if (write) a.post[row * kH + lane] = 2.0f / (1.0f + expf(-(m[kH + lane] * inv * a.scale[1] + a.base[kH + lane])));
  }
  const bool has = lane < HH;
  const uint32_t i = lane / kH, j = lane % kH;
  float v = has ? m[2 * kH + lane] * inv * a.scale[2] + a.base[2 * kH + lane] : 0.0f;
  float mx = -INFINITY;
  float row_v[kH];
#pragma unroll
  for (uint32_t k = 0; k < kH; ++k) {
    row_v[k] = __shfl_sync(0xffffffffu, v, i * kH + k);
    mx = fmaxf(mx, row_v[k]);
  }
  double sum = 0.0;
#pragma unroll
  for (uint32_t k = 0; k < kH; ++k) sum += expf(row_v[k] - mx);
  v = expf(v - mx) * static_cast<float>(1.0 / sum) + a.hc_eps;
  // Every entry divided by (its row's or column's sum + eps), the sum in index order.
  auto normalise = [&](bool rows) {
    float s = 0.0f;
#pragma unroll
    for (uint32_t k = 0; k < kH; ++k) s += __shfl_sync(0xffffffffu, v, rows ? i * kH + k : k * kH + j);
    v = v / (s + a.hc_eps);
  };
  for (uint32_t it = 0; it < max(a.iters, 1u); ++it) {
    if (it > 0) normalise(true);
    normalise(false);
  }
  if (write && has) a.comb[row * HH + lane] = v;
}

// What a launch does: mhc_pre alone (fn null: the mixing logits given in a.mix), or with the mixer
// product (fn: the logits made here), after the post of the site before (y: streams updated in place).
struct ClusterArgs {
  MhcArgs a;
  const float* fn = nullptr;       // [kMix][kH * D] f32
  const float* y = nullptr;        // [rows][D] the sublayer output of the site before; null: no post
  const float* post_in = nullptr;  // [rows][kH] and [rows][kH * kH]: that site's mixer, read before
  const float* comb_in = nullptr;  //   rank 0 of the row's cluster writes this site's over them
  float* streams = nullptr;        // a.streams, written by the post
  MoeCombineIn combine;            // combine.eo set: the post's y is the MoE combine, not f.y
};

// moe_combine's sum (gpu/ops.cu: the same fmas in the same order, then the shared expert's add) for
// the float4 column d of a row.
[[maybe_unused]] __device__ __forceinline__ float4 combined(const MoeCombineIn& c, uint32_t row, uint32_t d,
                                                            uint32_t D4) {
  float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (uint32_t j = 0; j < c.k; ++j) {
    const float w = c.weights[row * c.k + j];
    const float4 e = reinterpret_cast<const float4*>(c.eo)[(static_cast<size_t>(row) * c.k + j) * D4 + d];
    v.x = __fmaf_rn(w, e.x, v.x), v.y = __fmaf_rn(w, e.y, v.y);
    v.z = __fmaf_rn(w, e.z, v.z), v.w = __fmaf_rn(w, e.w, v.w);
  }
  float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (c.shared != nullptr) s = reinterpret_cast<const float4*>(c.shared)[static_cast<size_t>(row) * D4 + d];
  return make_float4(s.x + v.x, s.y + v.y, s.z + v.z, s.w + v.w);
}

// Grid (kBlocks, rows), clusters of kBlocks along x; block `rank` of row blockIdx.y owns the float4
// columns [rank * per, rank * per + per) of every stream, one a thread (per <= kMaxPer). With fn,
// 1,024 threads also share the mixer product over the slice (each (mixer row, column) one partial,
// summed per row in column order: fixed order, deterministic).
__global__ void __launch_bounds__(kMaxThreads) mhc_cluster_kernel(ClusterArgs f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  pdl_launch_dependents();  // the next matvec may request its weights now (gpu/pdl.hpp)
  __shared__ float4 rn[kH][kMaxPer];  // the slice of the streams (after the post)
  __shared__ float pm[kMix][kMaxPer];  // the mixer product's partials
  __shared__ double warp_part[kMaxThreads / 32][kPairs];
  __shared__ double part[kPairs];   // this block's Gram sums, read by the whole cluster
  __shared__ float part_mix[kMix];  // and its mixer partials
  __shared__ double gram[kPairs];
  __shared__ float mix[kMix];
  __shared__ float pre[kH];
  __shared__ float inv_u;
  const MhcArgs& a = f.a;
  const cg::cluster_group cluster = cg::this_cluster();
  const uint32_t rank = cluster.block_rank(), row = blockIdx.y, D4 = a.D / 4, tid = threadIdx.x;
  const uint32_t per = (D4 + kBlocks - 1) / kBlocks, d = rank * per + tid;
  const bool mine = tid < per && d < D4;
  const size_t at = static_cast<size_t>(row) * kH * D4;
  float4 r[kH];
#pragma unroll
  for (uint32_t h = 0; h < kH; ++h) {
    r[h] = mine ? reinterpret_cast<const float4*>(a.streams)[at + h * D4 + d] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  if ((f.y != nullptr || f.combine.eo != nullptr) && mine) {
    // mhc_post's arithmetic (ops.cu, the same explicit fmas), component by component: the same bits.
    const float4 yv = f.combine.eo != nullptr ? combined(f.combine, row, d, D4)
                                              : reinterpret_cast<const float4*>(f.y)[static_cast<size_t>(row) * D4 + d];
    const float* po = f.post_in + row * kH;
    const float* cb = f.comb_in + row * kH * kH;
    float4 nr[kH];
#pragma unroll
    for (uint32_t h2 = 0; h2 < kH; ++h2) {
      float4 v = make_float4(po[h2] * yv.x, po[h2] * yv.y, po[h2] * yv.z, po[h2] * yv.w);
#pragma unroll
      for (uint32_t h = 0; h < kH; ++h) {
        const float c = cb[h * kH + h2];
        v.x = __fmaf_rn(c, r[h].x, v.x), v.y = __fmaf_rn(c, r[h].y, v.y);
        v.z = __fmaf_rn(c, r[h].z, v.z), v.w = __fmaf_rn(c, r[h].w, v.w);
      }
      nr[h2] = v;
    }
#pragma unroll
    for (uint32_t h = 0; h < kH; ++h) {
      r[h] = nr[h];
      reinterpret_cast<float4*>(f.streams)[at + h * D4 + d] = nr[h];
    }
  }
  if (tid < per) {
#pragma unroll
    for (uint32_t h = 0; h < kH; ++h) rn[h][tid] = r[h];
  }
  const uint32_t lane = tid & 31, warp = tid >> 5, warps = (blockDim.x + 31) >> 5;
  {
    double g[kPairs];
    uint32_t p = 0;
#pragma unroll
    for (uint32_t h = 0; h < kH; ++h) {
#pragma unroll
      for (uint32_t h2 = h; h2 < kH; ++h2) g[p++] = dot4(r[h], r[h2]);
    }
#pragma unroll
    for (uint32_t q = 0; q < kPairs; ++q) {
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) g[q] += __shfl_xor_sync(0xffffffffu, g[q], o);
      if (lane == 0) warp_part[warp][q] = g[q];
    }
  }
  if (f.fn != nullptr) {
    __syncthreads();  // rn complete
    const float4* F = reinterpret_cast<const float4*>(f.fn);
    const uint32_t total = per * kMix;
    // Two (row, column) pairs a thread at a time: eight float4 loads in flight.
    for (uint32_t i0 = tid; i0 < total; i0 += 2 * blockDim.x) {
      const uint32_t i1 = i0 + blockDim.x;
      const uint32_t m0 = i0 / per, c0 = i0 % per, m1 = i1 / per, c1 = i1 % per;
      const bool ok0 = rank * per + c0 < D4, ok1 = i1 < total && rank * per + c1 < D4;
      float4 w0[kH], w1[kH];
#pragma unroll
      for (uint32_t h = 0; h < kH; ++h) {
        const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        w0[h] = ok0 ? F[(static_cast<size_t>(m0) * kH + h) * D4 + rank * per + c0] : z;
        w1[h] = ok1 ? F[(static_cast<size_t>(m1) * kH + h) * D4 + rank * per + c1] : z;
      }
      float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
      for (uint32_t h = 0; h < kH; ++h) {
        const float4 x0 = rn[h][c0];
        s0 += w0[h].x * x0.x + w0[h].y * x0.y + w0[h].z * x0.z + w0[h].w * x0.w;
        if (ok1) {
          const float4 x1 = rn[h][c1];
          s1 += w1[h].x * x1.x + w1[h].y * x1.y + w1[h].z * x1.z + w1[h].w * x1.w;
        }
      }
      pm[m0][c0] = s0;
      if (i1 < total) pm[m1][c1] = s1;
    }
    __syncthreads();
    if (warp < kMix) {
      float s = 0.0f;
      for (uint32_t c = lane; c < per; c += 32) s += pm[warp][c];
      s = warp_sum(s);
      if (lane == 0) part_mix[warp] = s;
    }
  }
  __syncthreads();
  if (tid < kPairs) {
    double s = 0.0;
    for (uint32_t w = 0; w < warps; ++w) s += warp_part[w][tid];
    part[tid] = s;
  }
  cluster.sync();
  // The ranks in order: every block gets the same bits.
  if (tid < kPairs) {
    double s = 0.0;
    for (uint32_t q = 0; q < kBlocks; ++q) s += cluster.map_shared_rank(part, q)[tid];
    gram[tid] = s;
  } else if (f.fn != nullptr && tid >= 32 && tid < 32 + kMix) {
    float s = 0.0f;
    for (uint32_t q = 0; q < kBlocks; ++q) s += cluster.map_shared_rank(part_mix, q)[tid - 32];
    mix[tid - 32] = s;
  }
  // No block leaves (its shared memory unmapped) before every block has read the sums: the wait is
  // at the end.
  cluster.barrier_arrive();
  __syncthreads();
  if (warp == 0) {
    double ss = 0.0;
    for (uint32_t h = 0, p = 0; h < kH; p += kH - h, ++h) ss += gram[p];
    const float inv = rsqrtf(static_cast<float>(ss) / static_cast<float>(kH * a.D) + a.rms_eps);
    const float* m = f.fn != nullptr ? mix : a.mix + static_cast<size_t>(row) * kMix;
    coefficients(a, m, inv, row, rank == 0, pre);
    __syncwarp();
    if (lane == 0) {
      double su = 0.0;
      uint32_t p = 0;
      for (uint32_t h = 0; h < kH; ++h) {
        for (uint32_t h2 = h; h2 < kH; ++h2, ++p) {
          su += (h == h2 ? 1.0 : 2.0) * double(pre[h]) * double(pre[h2]) * gram[p];
        }
      }
      inv_u = rsqrtf(static_cast<float>(su) / static_cast<float>(a.D) + a.rms_eps);
    }
  }
  __syncthreads();
  if (mine) {
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (uint32_t h = 0; h < kH; ++h) {
      const float4 x = rn[h][tid];
      v.x += pre[h] * x.x, v.y += pre[h] * x.y, v.z += pre[h] * x.z, v.w += pre[h] * x.w;
    }
    const float4 w = reinterpret_cast<const float4*>(a.norm_w)[d];
    reinterpret_cast<float4*>(a.x + static_cast<size_t>(row) * a.D)[d] =
        make_float4(v.x * inv_u * w.x, v.y * inv_u * w.y, v.z * inv_u * w.z, v.w * inv_u * w.w);
  }
  cluster.barrier_wait();
#else
  (void)f;
  __trap();  // launched only where it was built for sm90+ (cluster_kernel_built)
#endif
}

// Whether this device's build of the kernel has the cluster code.
bool cluster_kernel_built() { return sm90_code_built(reinterpret_cast<const void*>(mhc_cluster_kernel)); }

// Whether a launch applies: the stream count, the slices' size, the rows, the build.
bool cluster_applies(const MhcArgs& a) {
  if (a.rows == 0 || a.rows > kMhcClusterMaxRows || a.H != kH || a.D % 4 != 0) return false;
  return (a.D / 4 + kBlocks - 1) / kBlocks <= kMaxPer && cluster_kernel_built();
}

void launch(const ClusterArgs& f, uint32_t threads, cudaStream_t stream) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(kBlocks, f.a.rows);
  cfg.blockDim = dim3(threads);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kBlocks;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  FERRY_CUDA(cudaLaunchKernelEx(&cfg, mhc_cluster_kernel, f));
}

}  // namespace

bool mhc_pre_clustered_old(const MhcArgs& a, cudaStream_t stream) {
  if (!cluster_applies(a)) return false;
  ClusterArgs f;
  f.a = a;
  const uint32_t per = (a.D / 4 + kBlocks - 1) / kBlocks;
  launch(f, (per + 31) / 32 * 32, stream);
  return true;
}

bool mhc_post_pre_old(const MhcPostPre& p, cudaStream_t stream) {
  const MhcArgs& a = p.pre;
  const DevMatrix& fn = *p.fn;
  if (p.combine != nullptr && (p.combine->eo == nullptr || p.combine->weights == nullptr || p.combine->k == 0)) {
    throw CudaError("mhc_post_pre: a MoE combine needs its expert outputs, weights and k");
  }
  const bool f32_mixer =
      fn.type == model::GgmlType::F32 && fn.rows == kMix && fn.cols == kH * a.D && fn.row_bytes == size_t{fn.cols} * 4;
  bool aligned = reinterpret_cast<uintptr_t>(fn.data) % 16 == 0 && reinterpret_cast<uintptr_t>(p.y) % 16 == 0;
  if (p.combine != nullptr) {
    aligned = aligned && reinterpret_cast<uintptr_t>(p.combine->eo) % 16 == 0 &&
              reinterpret_cast<uintptr_t>(p.combine->shared) % 16 == 0;
  }
  if (!f32_mixer || !aligned || !cluster_applies(a)) return false;
  ClusterArgs f;
  f.a = a;
  f.a.mix = nullptr;
  f.fn = reinterpret_cast<const float*>(fn.data);
  f.y = p.y;
  f.post_in = p.post_in;
  f.comb_in = p.comb_in;
  if (p.combine != nullptr) f.combine = *p.combine;
  f.streams = p.streams;
  f.a.streams = p.streams;
  launch(f, kMaxThreads, stream);
  return true;
}

}  // namespace ferry::gpu
