// One mHC site for decode rows on sm90+, a cluster of 16 blocks a row (8 where the device cannot
// place 16). The one-block kernel (gpu/ops.cu) reads a row's H streams twice on one SM and runs the
// coefficients on one warp while the rest wait; here each block reads a slice of the streams once
// (kept in registers and shared memory), sums the slice's Gram matrix (G[h][h'] = sum_d R[h][d]
// R[h'][d], in f64) and, when it makes the mixing logits itself, the slice's part of fn @ streams; the
// cluster adds the slices' sums through distributed shared memory. trace(G) is the row's sum of
// squares (the 1/rms), and pre^T G pre the collapsed stream's (its RMSNorm), so no block reads the
// streams a second time. Every block then computes pre and the norm (the same inputs in the same
// order: the same bits) and its slice of x; rank 0 alone runs the Sinkhorn for comb, beside the x
// stores. The post of the site before is local to a slice too (each column mixes only its own H
// values), so it runs first in the same launch.
//
// The mixer (24 x 4 x D f32: 1.5 MB a site at D = 4,096) is most of the bytes: 16 SMs instead of 8
// share it, and each thread asks for all its weights of a pass (6 (mixer row, column) pairs, in
// registers) before it multiplies, so that a slice costs one memory round trip, not one a pair. Inside
// the decode graphs the launch takes PDL (gpu/pdl.hpp): the blocks are placed while the matvec ahead
// finishes and the first pass (all of it at D = 4,096) is asked before the wait, since no kernel
// writes fn. The blocks stay small (256 threads, <= 40 KiB of shared memory): staging the slice in
// 108 KiB of shared memory instead was slower (the SMs' carveout then differs from the matvecs').
#include <cooperative_groups.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "gpu/block_reduce.cuh"
#include "gpu/cuda_check.hpp"
#include "gpu/mhc_decode.hpp"
#include "gpu/pdl.cuh"
#include "gpu/pdl.hpp"

namespace ferry::gpu {

namespace {

namespace cg = cooperative_groups;

constexpr uint32_t kWide = 16, kNarrow = 8;  // a row's cluster: 16 where the device allows, else 8
constexpr uint32_t kH = 4;                    // GLM's hc_mult; other stream counts take the one-block kernel
// [[maybe_unused]]: kPairs, kBatch, dot4, pre_post and comb_logit serve only the sm90 kernel body, which a pre-sm90
// pass leaves out.
[[maybe_unused]] constexpr uint32_t kPairs = kH * (kH + 1) / 2;
constexpr uint32_t kMix = (2 + kH) * kH;
constexpr uint32_t kThreads = 256;
constexpr uint32_t kMaxD = 8192;  // at 8 blocks, 256 float4 columns a block: one a thread

[[maybe_unused]] __device__ __forceinline__ double dot4(float4 a, float4 b) {
  return double(a.x) * b.x + double(a.y) * b.y + double(a.z) * b.z + double(a.w) * b.w;
}

// pre (and, with `write`, post) of one row on lanes 0..H-1 of a warp: the one-block kernel's
// operations (ops.cu mhc_coefficients, the CPU's order and precision).
[[maybe_unused]] __device__ void pre_post(const MhcArgs& a, const float* m, float inv, uint32_t row, bool write,
                                          float* pre) {
  const uint32_t lane = threadIdx.x & 31;
  if (lane < kH) {
    pre[lane] = 1.0f / (1.0f + expf(-(m[lane] * inv * a.scale[0] + a.base[lane]))) + a.hc_eps;
    if (write) a.post[row * kH + lane] = 2.0f / (1.0f + expf(-(m[kH + lane] * inv * a.scale[1] + a.base[kH + lane])));
  }
}

// The Sinkhorn's input for comb entry `lane` (< H*H) of one row.
[[maybe_unused]] __device__ __forceinline__ float comb_logit(const MhcArgs& a, const float* m, float inv, uint32_t lane) {
  return m[2 * kH + lane] * inv * a.scale[2] + a.base[2 * kH + lane];
}

// comb of one row on one warp from its logits, lane e holding entry e's (H*H <= 32; lanes past H*H
// hold 0), the row and column sums gathered by shuffles: the one-block kernel's Sinkhorn (ops.cu
// mhc_coefficients) on registers. Returns the lane's entry.
__device__ float sinkhorn(float v, uint32_t iters, float hc_eps) {
  static_assert(kH * kH <= 32 && 32 % kH == 0, "one comb entry a lane; source lanes stay below 32");
  const uint32_t lane = threadIdx.x & 31;
  const uint32_t i = lane / kH, j = lane % kH;
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
  v = expf(v - mx) * static_cast<float>(1.0 / sum) + hc_eps;
  // Every entry divided by (its row's or column's sum + eps), the sum in index order.
  auto normalise = [&](bool rows) {
    float s = 0.0f;
#pragma unroll
    for (uint32_t k = 0; k < kH; ++k) s += __shfl_sync(0xffffffffu, v, rows ? i * kH + k : k * kH + j);
    v = v / (s + hc_eps);
  };
  for (uint32_t it = 0; it < max(iters, 1u); ++it) {
    if (it > 0) normalise(true);
    normalise(false);
  }
  return v;
}

// comb on a branch (MhcCombBranch): a warp a row turns the logits a site wrote into comb.
__global__ void __launch_bounds__(32) mhc_comb_kernel(const float* logits, float* comb, uint32_t iters, float hc_eps) {
  constexpr uint32_t HH = kH * kH;
  const uint32_t row = blockIdx.x, lane = threadIdx.x;
  const float c = sinkhorn(lane < HH ? logits[row * HH + lane] : 0.0f, iters, hc_eps);
  if (lane < HH) comb[row * HH + lane] = c;
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
  float* comb_logits = nullptr;    // set: rank 0 writes comb's logits here ([rows][kH * kH]), not comb
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

// combined() for k <= K with every load asked before the first fma (one memory round trip, not one
// per unrolled step of the loop): the same fmas in the same order.
template <uint32_t K>
[[maybe_unused]] __device__ __forceinline__ float4 combined_at_once(const MoeCombineIn& c, uint32_t row, uint32_t d,
                                                                    uint32_t D4) {
  float wj[K];
  float4 e[K];
#pragma unroll
  for (uint32_t j = 0; j < K; ++j) {
    if (j < c.k) {
      wj[j] = c.weights[row * c.k + j];
      e[j] = reinterpret_cast<const float4*>(c.eo)[(static_cast<size_t>(row) * c.k + j) * D4 + d];
    }
  }
  float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (c.shared != nullptr) s = reinterpret_cast<const float4*>(c.shared)[static_cast<size_t>(row) * D4 + d];
  float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (uint32_t j = 0; j < K; ++j) {
    if (j < c.k) {
      v.x = __fmaf_rn(wj[j], e[j].x, v.x), v.y = __fmaf_rn(wj[j], e[j].y, v.y);
      v.z = __fmaf_rn(wj[j], e[j].z, v.z), v.w = __fmaf_rn(wj[j], e[j].w, v.w);
    }
  }
  return make_float4(s.x + v.x, s.y + v.y, s.z + v.z, s.w + v.w);
}
[[maybe_unused]] constexpr uint32_t kCombineAtOnce = 8;  // GLM's experts a token

// Float4 columns a block owns, and the dynamic shared memory of a launch: the slice of the streams
// ([kH][per]) and the mixer's partials ([kMix][per]); at most 40 KiB (D <= kMaxD).
__host__ __device__ constexpr uint32_t per_block(uint32_t D, uint32_t blocks) { return (D / 4 + blocks - 1) / blocks; }
constexpr size_t smem_bytes(uint32_t per, bool mixer) {
  return size_t{kH} * per * 16 + (mixer ? size_t{kMix} * per * 4 : 0);
}
static_assert(smem_bytes(kMaxD / 4 / 8, true) <= 48 * 1024, "no opt-in for the shared memory");
[[maybe_unused]] constexpr uint32_t kBatch = 6;  // (mixer row, column) pairs a thread loads before it multiplies

// Grid (B, rows), clusters of B along x; block `rank` of row blockIdx.y owns the float4 columns
// [rank * per, rank * per + per) of every stream, one a thread. With fn, all threads share the
// mixer product over the slice (each (mixer row, column) one partial, summed per row in column
// order: fixed order, deterministic).
template <uint32_t B>
__global__ void __launch_bounds__(kThreads) mhc_site_kernel(ClusterArgs f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ double warp_part[kThreads / 32][kPairs];
  __shared__ double part[kPairs];   // this block's Gram sums, read by the whole cluster
  __shared__ float part_mix[kMix];  // and its mixer partials
  __shared__ double gram[kPairs];
  __shared__ float mix[kMix];
  __shared__ float pre[kH];
  __shared__ float inv_u;
  const MhcArgs& a = f.a;
  const cg::cluster_group cluster = cg::this_cluster();
  const uint32_t rank = cluster.block_rank(), row = blockIdx.y, D4 = a.D / 4, tid = threadIdx.x;
  const uint32_t per = per_block(a.D, B), d = rank * per + tid;
  float4* const rn = reinterpret_cast<float4*>(smem);         // [kH][per], after the post
  float* const pm = reinterpret_cast<float*>(rn + kH * per);  // [kMix][per]
  const float4* F = reinterpret_cast<const float4*>(f.fn);
  // The mixer's slice: row m, stream h at src[(m * kH + h) * D4 + c]. A pass loads kBatch pairs a
  // thread; the first pass's loads go out before the wait (no kernel writes fn), the rest after.
  const float4* src = f.fn != nullptr ? F + rank * per : nullptr;
  const uint32_t total = per * kMix;
  float4 w[kBatch][kH];
  auto load_pass = [&](uint32_t i0) {
#pragma unroll
    for (uint32_t b = 0; b < kBatch; ++b) {
      const uint32_t i = i0 + b * blockDim.x + tid, m = i / per, c = i % per;
      const bool ok = i < total && rank * per + c < D4;
#pragma unroll
      for (uint32_t h = 0; h < kH; ++h) {
        w[b][h] = ok ? src[(static_cast<size_t>(m) * kH + h) * D4 + c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
  };
  if (f.fn != nullptr) load_pass(0);
  // The norm weight of the first x column this thread writes (no kernel writes it either).
  const uint32_t x_col = tid - 32;
  float4 nw0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (tid >= 32 && x_col < per && rank * per + x_col < D4) {
    nw0 = reinterpret_cast<const float4*>(a.norm_w)[rank * per + x_col];
  }
  pdl_launch_dependents();  // the next matvec may request its weights now (gpu/pdl.hpp)
  pdl_wait();               // the streams, y and the post's coefficients are the kernels' ahead
  const bool mine = tid < per && d < D4;
  // The post's coefficients, the streams and y (or the combine's inputs) asked for together: one
  // memory round trip after the wait.
  const bool post = f.y != nullptr || f.combine.eo != nullptr;
  float po[kH], cb[kH * kH];
  if (post && mine) {
#pragma unroll
    for (uint32_t h = 0; h < kH; ++h) po[h] = f.post_in[row * kH + h];
#pragma unroll
    for (uint32_t i = 0; i < kH * kH; ++i) cb[i] = f.comb_in[row * kH * kH + i];
  }
  const size_t at = static_cast<size_t>(row) * kH * D4;
  float4 r[kH];
#pragma unroll
  for (uint32_t h = 0; h < kH; ++h) {
    r[h] = mine ? reinterpret_cast<const float4*>(a.streams)[at + h * D4 + d] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  if (post && mine) {
    // mhc_post's arithmetic (ops.cu, the same explicit fmas), component by component: the same bits.
    float4 yv;
    if (f.combine.eo == nullptr) {
      yv = reinterpret_cast<const float4*>(f.y)[static_cast<size_t>(row) * D4 + d];
    } else if (f.combine.k <= kCombineAtOnce) {
      yv = combined_at_once<kCombineAtOnce>(f.combine, row, d, D4);
    } else {
      yv = combined(f.combine, row, d, D4);
    }
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
    for (uint32_t h = 0; h < kH; ++h) rn[h * per + tid] = r[h];
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
    for (uint32_t i0 = 0; i0 < total; i0 += kBatch * blockDim.x) {
      if (i0 > 0) load_pass(i0);
#pragma unroll
      for (uint32_t b = 0; b < kBatch; ++b) {
        const uint32_t i = i0 + b * blockDim.x + tid, m = i / per, c = i % per;
        if (i >= total) continue;
        float s = 0.0f;
#pragma unroll
        for (uint32_t h = 0; h < kH; ++h) {
          const float4 x = rn[h * per + c];
          s += w[b][h].x * x.x + w[b][h].y * x.y + w[b][h].z * x.z + w[b][h].w * x.w;
        }
        pm[m * per + c] = s;
      }
    }
    __syncthreads();
    // Mixer rows warp, warp + 8, warp + 16 a warp, their sums side by side (each in column order).
    constexpr uint32_t kWarps = kThreads / 32, kRowsPerWarp = kMix / kWarps;
    static_assert(kMix % kWarps == 0, "the mixer rows share the warps evenly");
    float s[kRowsPerWarp] = {};
    for (uint32_t c = lane; c < per; c += 32) {
#pragma unroll
      for (uint32_t q = 0; q < kRowsPerWarp; ++q) s[q] += pm[(warp + q * kWarps) * per + c];
    }
#pragma unroll
    for (uint32_t q = 0; q < kRowsPerWarp; ++q) s[q] = warp_sum(s[q]);
    if (lane == 0) {
#pragma unroll
      for (uint32_t q = 0; q < kRowsPerWarp; ++q) part_mix[warp + q * kWarps] = s[q];
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
#pragma unroll
    for (uint32_t q = 0; q < B; ++q) s += cluster.map_shared_rank(part, q)[tid];
    gram[tid] = s;
  } else if (f.fn != nullptr && tid >= 32 && tid < 32 + kMix) {
    float s = 0.0f;
#pragma unroll
    for (uint32_t q = 0; q < B; ++q) s += cluster.map_shared_rank(part_mix, q)[tid - 32];
    mix[tid - 32] = s;
  }
  // No block leaves (its shared memory unmapped) before every block has read the sums: the wait is
  // at the end.
  cluster.barrier_arrive();
  __syncthreads();
  const float* m = f.fn != nullptr ? mix : a.mix + static_cast<size_t>(row) * kMix;
  double ss = 0.0;
  for (uint32_t h = 0, p = 0; h < kH; p += kH - h, ++h) ss += gram[p];
  const float inv = rsqrtf(static_cast<float>(ss) / static_cast<float>(kH * a.D) + a.rms_eps);
  if (warp == 0) {
    // comb is rank 0's alone, and only the next site's post reads it: its Sinkhorn runs while the
    // other warps make x, or on a branch after the launch.
    constexpr uint32_t HH = kH * kH;
    if (rank == 0 && f.comb_logits != nullptr) {
      if (lane < HH) f.comb_logits[row * HH + lane] = comb_logit(a, m, inv, lane);
    } else if (rank == 0) {
      const float c = sinkhorn(lane < HH ? comb_logit(a, m, inv, lane) : 0.0f, a.iters, a.hc_eps);
      if (lane < HH) a.comb[row * HH + lane] = c;
    }
  } else {
    const uint32_t others = blockDim.x - 32;
    if (warp == 1) {
      pre_post(a, m, inv, row, rank == 0, pre);
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
    asm volatile("bar.sync 1, %0;" ::"r"(others) : "memory");  // warps 1.. only: pre and inv_u ready
    for (uint32_t c = x_col; c < per && rank * per + c < D4; c += others) {
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (uint32_t h = 0; h < kH; ++h) {
        const float4 x = rn[h * per + c];
        v.x += pre[h] * x.x, v.y += pre[h] * x.y, v.z += pre[h] * x.z, v.w += pre[h] * x.w;
      }
      const float4 w = c == x_col ? nw0 : reinterpret_cast<const float4*>(a.norm_w)[rank * per + c];
      reinterpret_cast<float4*>(a.x + static_cast<size_t>(row) * a.D)[rank * per + c] =
          make_float4(v.x * inv_u * w.x, v.y * inv_u * w.y, v.z * inv_u * w.z, v.w * inv_u * w.w);
    }
  }
  cluster.barrier_wait();
#else
  (void)f;
  __trap();  // launched only where it was built for sm90+ (site_plan)
#endif
}

// The cluster size this device takes for a launch of `smem` dynamic bytes: 16 (non-portable) where
// it can place a cluster of them, else 8. Asked once per device and size (the eager step before a
// capture asks first).
uint32_t site_blocks(size_t smem) {
  static std::mutex mutex;
  static std::map<std::pair<int, size_t>, uint32_t> known;
  int dev = 0;
  FERRY_CUDA(cudaGetDevice(&dev));
  const std::lock_guard<std::mutex> lock(mutex);
  auto [it, fresh] = known.try_emplace({dev, smem}, kNarrow);
  if (!fresh) return it->second;
  FERRY_CUDA(cudaFuncSetAttribute(mhc_site_kernel<kWide>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  const ClusterLaunch l(reinterpret_cast<const void*>(mhc_site_kernel<kWide>), dim3(kWide, 1), dim3(kThreads), smem,
                        nullptr, dim3(kWide, 1, 1), false);
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, mhc_site_kernel<kWide>, &l.cfg) == cudaSuccess && clusters > 0) {
    it->second = kWide;
  }
  (void)cudaGetLastError();  // a refused query leaves no error behind
  return it->second;
}

// A row's cluster: its size (0: the launch does not apply) and its blocks' shared memory.
struct SitePlan {
  uint32_t blocks = 0;
  size_t smem = 0;
};

// The stream count, the width, the rows and the build decide whether the cluster kernel applies; the
// device its size.
SitePlan site_plan(const MhcArgs& a, bool mixer) {
  SitePlan p;
  if (a.rows == 0 || a.rows > kMhcClusterMaxRows || a.H != kH || a.D % 4 != 0 || a.D > kMaxD) return p;
  if (!sm90_code_built(reinterpret_cast<const void*>(mhc_site_kernel<kNarrow>))) return p;
  for (uint32_t blocks : {kWide, kNarrow}) {
    const uint32_t per = per_block(a.D, blocks);
    p.smem = smem_bytes(per, mixer);
    if (blocks == kNarrow || site_blocks(p.smem) == kWide) {
      p.blocks = blocks;
      return p;
    }
  }
  return p;
}

void launch(const ClusterArgs& f, const SitePlan& plan, cudaStream_t stream) {
  void (*kernel)(ClusterArgs) = plan.blocks == kWide ? mhc_site_kernel<kWide> : mhc_site_kernel<kNarrow>;
  // PDL inside the decode graphs, but for a whole site without a post: a stage's first, after the
  // embedding, which waited 6.3-6.9 us past it on its programmatic edge (H200, h102).
  const bool pdl = f.fn == nullptr || f.y != nullptr || f.combine.eo != nullptr;
  const ClusterLaunch l(reinterpret_cast<const void*>(kernel), dim3(plan.blocks, f.a.rows), dim3(kThreads), plan.smem,
                        stream, dim3(plan.blocks, 1, 1), pdl);
  FERRY_CUDA(cudaLaunchKernelEx(&l.cfg, kernel, f));
}

}  // namespace

bool mhc_pre_clustered(const MhcArgs& a, cudaStream_t stream) {
  const SitePlan plan = site_plan(a, false);
  if (plan.blocks == 0) return false;
  ClusterArgs f;
  f.a = a;
  launch(f, plan, stream);
  return true;
}

MhcCombBranch::MhcCombBranch() : logits_(size_t{kMhcClusterMaxRows} * kH * kH * sizeof(float)) {}

bool mhc_post_pre(const MhcPostPre& p, cudaStream_t stream) {
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
  if (!f32_mixer || !aligned) return false;
  const SitePlan plan = site_plan(a, true);
  if (plan.blocks == 0) return false;
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
  if (p.branch != nullptr) {
    p.branch->join(stream);  // the post reads comb_in
    f.comb_logits = p.branch->logits_.as<float>();
  }
  launch(f, plan, stream);
  if (p.branch != nullptr) {
    // comb from the logits beside the sublayer (the site's Sinkhorn, moved).
    const cudaStream_t side = p.branch->branch_.fork(stream);
    mhc_comb_kernel<<<a.rows, 32, 0, side>>>(p.branch->logits_.as<float>(), a.comb, a.iters, a.hc_eps);
    FERRY_CUDA_LAUNCHED();
  }
  return true;
}

}  // namespace ferry::gpu
