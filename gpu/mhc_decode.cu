// mhc_pre for decode rows on sm90+: a cluster of 8 blocks a row. The one-block kernel (gpu/ops.cu)
// reads a row's H streams twice on one SM and runs the coefficients on one warp while the rest wait;
// here each block holds a slice of the streams in registers, sums the slice's Gram matrix
// (G[h][h'] = sum_d R[h][d] R[h'][d], in f64), and the cluster adds the slices' sums through
// distributed shared memory. trace(G) is the row's sum of squares (the 1/rms), and pre^T G pre the
// collapsed stream's (its RMSNorm), so no block reads the streams a second time. Every block then
// computes the coefficients (the same inputs in the same order: the same bits), and its slice of x.
#include <cooperative_groups.h>

#include <array>
#include <atomic>
#include <cmath>

#include "gpu/cuda_check.hpp"
#include "gpu/mhc_decode.hpp"

namespace ferry::gpu {
namespace {

namespace cg = cooperative_groups;

constexpr uint32_t kBlocks = 8;  // a row's cluster (the portable maximum)
constexpr uint32_t kH = 4;       // GLM's hc_mult; other stream counts take the one-block kernel
constexpr uint32_t kPairs = kH * (kH + 1) / 2;
constexpr uint32_t kMaxThreads = 1024;

__device__ __forceinline__ double dot4(float4 a, float4 b) {
  return double(a.x) * b.x + double(a.y) * b.y + double(a.z) * b.z + double(a.w) * b.w;
}

// The coefficients of one row on one warp, each lane one entry of comb (H*H <= 32), the row and
// column sums gathered by shuffles: the one-block kernel's operations (ops.cu mhc_coefficients, the
// CPU's order and precision) on registers instead of shared memory.
__device__ void coefficients(const MhcArgs& a, const float* m, float inv, uint32_t row, bool write, float* pre) {
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

// Grid (kBlocks, rows), clusters of kBlocks along x; block `rank` of row blockIdx.y owns the float4
// columns [rank * per, rank * per + per) of every stream, one a thread.
__global__ void __launch_bounds__(kMaxThreads) mhc_pre_cluster_kernel(MhcArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ double warp_part[kMaxThreads / 32][kPairs];
  __shared__ double part[kPairs];  // this block's Gram sums, read by the whole cluster
  __shared__ double gram[kPairs];
  __shared__ float pre[kH];
  __shared__ float inv_u;
  const cg::cluster_group cluster = cg::this_cluster();
  const uint32_t rank = cluster.block_rank(), row = blockIdx.y, D4 = a.D / 4;
  const uint32_t per = (D4 + kBlocks - 1) / kBlocks, d = rank * per + threadIdx.x;
  const bool mine = threadIdx.x < per && d < D4;
  const float4* R = reinterpret_cast<const float4*>(a.streams + static_cast<size_t>(row) * kH * a.D);
  float4 r[kH];
#pragma unroll
  for (uint32_t h = 0; h < kH; ++h) r[h] = mine ? R[h * D4 + d] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  double g[kPairs];
  {
    uint32_t p = 0;
#pragma unroll
    for (uint32_t h = 0; h < kH; ++h) {
#pragma unroll
      for (uint32_t h2 = h; h2 < kH; ++h2) g[p++] = dot4(r[h], r[h2]);
    }
  }
  const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
#pragma unroll
  for (uint32_t p = 0; p < kPairs; ++p) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) g[p] += __shfl_xor_sync(0xffffffffu, g[p], o);
    if (lane == 0) warp_part[warp][p] = g[p];
  }
  __syncthreads();
  if (threadIdx.x < kPairs) {
    double s = 0.0;
    for (uint32_t w = 0; w < warps; ++w) s += warp_part[w][threadIdx.x];
    part[threadIdx.x] = s;
  }
  cluster.sync();
  if (threadIdx.x < kPairs) {
    double s = 0.0;  // the ranks in order: every block gets the same bits
    for (uint32_t q = 0; q < kBlocks; ++q) s += cluster.map_shared_rank(part, q)[threadIdx.x];
    gram[threadIdx.x] = s;
  }
  // No block leaves (its `part` unmapped) before every block has read the sums: the wait is at the end.
  cluster.barrier_arrive();
  __syncthreads();
  if (warp == 0) {
    double ss = 0.0;
    for (uint32_t h = 0, p = 0; h < kH; p += kH - h, ++h) ss += gram[p];
    const float inv = rsqrtf(static_cast<float>(ss) / static_cast<float>(kH * a.D) + a.rms_eps);
    coefficients(a, a.mix + static_cast<size_t>(row) * (2 + kH) * kH, inv, row, rank == 0, pre);
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
      v.x += pre[h] * r[h].x, v.y += pre[h] * r[h].y, v.z += pre[h] * r[h].z, v.w += pre[h] * r[h].w;
    }
    const float4 w = reinterpret_cast<const float4*>(a.norm_w)[d];
    reinterpret_cast<float4*>(a.x + static_cast<size_t>(row) * a.D)[d] =
        make_float4(v.x * inv_u * w.x, v.y * inv_u * w.y, v.z * inv_u * w.z, v.w * inv_u * w.w);
  }
  cluster.barrier_wait();
#else
  (void)a;
  __trap();  // mhc_pre_clustered launches it only where it was built for sm90+
#endif
}

// Whether this device's build of the kernel has the cluster code (a compute_70 build JIT-compiled
// on an sm90 device does not), cached per device.
bool cluster_kernel_built() {
  static std::array<std::atomic<int>, 64> known{};  // 0 unknown, 1 yes, 2 no
  int dev = 0;
  FERRY_CUDA(cudaGetDevice(&dev));
  if (dev < 0 || dev >= static_cast<int>(known.size())) return false;
  int k = known[dev].load(std::memory_order_relaxed);
  if (k == 0) {
    int major = 0;
    FERRY_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    cudaFuncAttributes fa{};
    FERRY_CUDA(cudaFuncGetAttributes(&fa, mhc_pre_cluster_kernel));
    k = major >= 9 && fa.ptxVersion >= 90 ? 1 : 2;
    known[dev].store(k, std::memory_order_relaxed);
  }
  return k == 1;
}

}  // namespace

bool mhc_pre_clustered(const MhcArgs& a, cudaStream_t stream) {
  if (a.rows == 0 || a.rows > 65535 || a.H != kH || a.D % 4 != 0) return false;
  const uint32_t per = (a.D / 4 + kBlocks - 1) / kBlocks;
  if (per > kMaxThreads || !cluster_kernel_built()) return false;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(kBlocks, a.rows);
  cfg.blockDim = dim3((per + 31) / 32 * 32);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kBlocks;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  FERRY_CUDA(cudaLaunchKernelEx(&cfg, mhc_pre_cluster_kernel, a));
  return true;
}

}  // namespace ferry::gpu
