// One mHC site of a prefill chunk in one launch on sm90+ (gpu/mhc_prefill.hpp). Before, a site of
// 2,048 rows ran mhc_post (the streams read and written: 145 us on the H200), the mixer product on
// cuBLAS SGEMM (24 rows of fn against the streams, read again: 92 us) and the one-block-a-row mhc_pre
// (read twice more, the second time mostly from L2: 151 us): ~0.37 ms for ~0.34 GB that copy
// bandwidth moves in ~85 us.
//
// Here a cluster of 8 blocks takes 16 rows; block `rank` owns the columns [rank * per * 16, ...) of
// every stream in units of 16 columns, two units a warp, and keeps the 16 rows of its units in
// registers from the load to the store of x: the streams are read once and, after the post, written
// once. A unit's values are the A operand of tf32 MMAs (m16n8k8: 16 rows, 8 mixer rows, 8 columns)
// whose B is fn's matching columns read from L2 (fn is 1.5 MB, read once per 16 rows); f32 operands
// split into big + small tf32 parts make three MMAs (small x small dropped), so the logits keep ~f32
// accuracy. A lane (g, t) holds rows g and g + 8 at columns 4t..4t+3 of a unit for all 4 streams; the
// MMA's k slots t and t + 4 take columns 2j and 2j + 1 of those, in A and B alike (a sum does not
// care which k is where). The Gram sums of the rows' streams (f64, as gpu/mhc_decode.cu makes them)
// give the 1/rms and the collapsed stream's norm, so nothing is read twice. The warps' partial sums
// meet in shared memory and the cluster's in distributed shared memory, added in rank order by every
// block (the same bits in each); each block then makes pre and its slice of x, and one rank a row's
// post and comb logits, whose Sinkhorn (which only the next post reads) runs in a launch of its own.
//
// Clusters of 16 blocks (non-portable; one unit a warp, or 8 warps of two units: 383 / 337 us a
// chunk's site, against 242 us here) and a persistent cluster of 16 that kept fn's slice in shared
// memory and the next tile's loads in flight (310 us a site in the bench) were slower (gpu/PERF.md).
#include <cooperative_groups.h>

#include <cstdint>
#include <map>
#include <mutex>

#include "gpu/cuda_check.hpp"
#include "gpu/mhc_coefficients.cuh"
#include "gpu/mhc_prefill.hpp"
#include "gpu/pdl.cuh"

namespace ferry::gpu {
namespace {

namespace cg = cooperative_groups;

constexpr uint32_t kH = 4, kMix = (2 + kH) * kH, kPairs = kH * (kH + 1) / 2, kRows = kMhcPrefillTileRows;
[[maybe_unused]] constexpr uint32_t kTiles = kMix / 8;  // MMA column tiles of 8 mixer rows
// A cluster of kB blocks of kThreads, kUnits units of 16 columns a warp: D up to 16 * 8 * 16 * 2 = 4,096.
constexpr uint32_t kB = 8, kThreads = 512, kUnits = 2, kMaxD = 16 * kB * (kThreads / 32) * kUnits;

struct SiteArgs {
  MhcArgs a;
  const float* fn = nullptr;       // [kMix][kH * D]
  const float* y = nullptr;        // [rows][D]; null: no post
  const float* post_in = nullptr;  // [rows][kH], [rows][kH * kH]: read before a rank writes a.post / a.comb
  const float* comb_in = nullptr;
  float* streams = nullptr;        // [rows][kH * D], a.streams
};

// Dynamic shared memory: each warp's partial Gram sums and logits of the tile's rows.
constexpr size_t kSmemBytes = size_t{kThreads / 32} * kRows * (kPairs * sizeof(double) + kMix * sizeof(float));

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ float comp(const float4& v, uint32_t i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// x as big + small tf32 parts (nearest, ties away): big + small is x to ~22 bits.
__device__ __forceinline__ void split_tf32(float x, uint32_t& big, uint32_t& small) {
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(big) : "f"(x));
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(small) : "f"(x - __uint_as_float(big)));
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ double dot4(const float4& a, const float4& b) {
  return double(a.x) * b.x + double(a.y) * b.y + double(a.z) * b.z + double(a.w) * b.w;
}
#endif

// Grid (kB, tiles), clusters of kB along x.
__global__ void __launch_bounds__(kThreads, 1) mhc_prefill_kernel(SiteArgs f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr uint32_t W = kThreads / 32;
  extern __shared__ __align__(16) unsigned char smem[];
  double* const gram_w = reinterpret_cast<double*>(smem);                  // [W][kRows * kPairs]
  float* const mix_w = reinterpret_cast<float*>(gram_w + W * kRows * kPairs);  // [W][kRows * kMix]
  __shared__ double gram[kRows * kPairs];
  __shared__ float mix[kRows * kMix];
  __shared__ float post_in[kRows * kH], comb_in[kRows * kH * kH];
  __shared__ float pre[kRows][kH];
  __shared__ float inv_u[kRows];
  const MhcArgs& a = f.a;
  const cg::cluster_group cluster = cg::this_cluster();
  const uint32_t rank = cluster.block_rank(), tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const uint32_t g = lane >> 2, t = lane & 3;
  const uint32_t D = a.D, units = D / 16, per = (units + kB - 1) / kB, row0 = blockIdx.y * kRows;
  const size_t HD = size_t{kH} * D;
  const uint32_t rows[2] = {row0 + g, row0 + g + 8};
  const bool ok[2] = {rows[0] < a.rows, rows[1] < a.rows};
  if (f.y != nullptr) {
    for (uint32_t i = tid; i < kRows * kH * (kH + 1); i += kThreads) {
      const bool is_post = i < kRows * kH;
      const uint32_t j = is_post ? i : i - kRows * kH, r = row0 + j / (is_post ? kH : kH * kH);
      if (r >= a.rows) continue;
      if (is_post) {
        post_in[j] = f.post_in[size_t{row0} * kH + j];
      } else {
        comb_in[j] = f.comb_in[size_t{row0} * kH * kH + j];
      }
    }
    __syncthreads();
  }
  // The warp's units: column d (of each stream) of lane t, for rows[0] and rows[1].
  bool have[kUnits];
  uint32_t col[kUnits];
  float4 r[kUnits][2][kH];
  const float4* S = reinterpret_cast<const float4*>(f.streams);
#pragma unroll
  for (uint32_t i = 0; i < kUnits; ++i) {
    const uint32_t u = warp + i * W, unit = rank * per + u;
    have[i] = u < per && unit < units;
    col[i] = unit * 16 + 4 * t;
#pragma unroll
    for (uint32_t q = 0; q < 2; ++q) {
#pragma unroll
      for (uint32_t h = 0; h < kH; ++h) {
        r[i][q][h] = have[i] && ok[q] ? S[(rows[q] * HD + h * D + col[i]) / 4] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
  }
  if (f.y != nullptr) {
    // mhc_post's arithmetic (ops.cu, the same explicit fmas), component by component: the same bits.
#pragma unroll
    for (uint32_t i = 0; i < kUnits; ++i) {
#pragma unroll
      for (uint32_t q = 0; q < 2; ++q) {
        if (!have[i] || !ok[q]) continue;
        const float4 yv = reinterpret_cast<const float4*>(f.y)[(size_t{rows[q]} * D + col[i]) / 4];
        const float* po = post_in + (g + 8 * q) * kH;
        const float* cb = comb_in + (g + 8 * q) * kH * kH;
        float4 nr[kH];
#pragma unroll
        for (uint32_t h2 = 0; h2 < kH; ++h2) {
          float4 v = make_float4(po[h2] * yv.x, po[h2] * yv.y, po[h2] * yv.z, po[h2] * yv.w);
#pragma unroll
          for (uint32_t h = 0; h < kH; ++h) {
            const float c = cb[h * kH + h2];
            const float4 o = r[i][q][h];
            v.x = __fmaf_rn(c, o.x, v.x), v.y = __fmaf_rn(c, o.y, v.y);
            v.z = __fmaf_rn(c, o.z, v.z), v.w = __fmaf_rn(c, o.w, v.w);
          }
          nr[h2] = v;
        }
#pragma unroll
        for (uint32_t h = 0; h < kH; ++h) {
          r[i][q][h] = nr[h];
          reinterpret_cast<float4*>(f.streams)[(rows[q] * HD + h * D + col[i]) / 4] = nr[h];
        }
      }
    }
  }
  // The logits: acc[j] is the MMA tile of mixer rows 8j..8j+7.
  float acc[kTiles][4] = {};
  const float4* F = reinterpret_cast<const float4*>(f.fn);
#pragma unroll
  for (uint32_t i = 0; i < kUnits; ++i) {
    if (!have[i]) continue;  // the same for the whole warp
#pragma unroll
    for (uint32_t h = 0; h < kH; ++h) {
      float4 fb[kTiles];
#pragma unroll
      for (uint32_t j = 0; j < kTiles; ++j) fb[j] = F[((8 * j + g) * HD + h * D + col[i]) / 4];
#pragma unroll
      for (uint32_t k2 = 0; k2 < 2; ++k2) {
        uint32_t big[4], small[4];
        split_tf32(comp(r[i][0][h], 2 * k2), big[0], small[0]);
        split_tf32(comp(r[i][1][h], 2 * k2), big[1], small[1]);
        split_tf32(comp(r[i][0][h], 2 * k2 + 1), big[2], small[2]);
        split_tf32(comp(r[i][1][h], 2 * k2 + 1), big[3], small[3]);
#pragma unroll
        for (uint32_t j = 0; j < kTiles; ++j) {
          uint32_t b0, b0s, b1, b1s;
          split_tf32(comp(fb[j], 2 * k2), b0, b0s);
          split_tf32(comp(fb[j], 2 * k2 + 1), b1, b1s);
          mma_tf32(acc[j], small, b0, b1);
          mma_tf32(acc[j], big, b0s, b1s);
          mma_tf32(acc[j], big, b0, b1);
        }
      }
    }
  }
#pragma unroll
  for (uint32_t j = 0; j < kTiles; ++j) {
    float* m = mix_w + warp * kRows * kMix;
    m[g * kMix + 8 * j + 2 * t] = acc[j][0];
    m[g * kMix + 8 * j + 2 * t + 1] = acc[j][1];
    m[(g + 8) * kMix + 8 * j + 2 * t] = acc[j][2];
    m[(g + 8) * kMix + 8 * j + 2 * t + 1] = acc[j][3];
  }
  // The Gram sums of each row over the warp's columns: the lanes' in f64, then the row's 4 lanes.
#pragma unroll
  for (uint32_t q = 0; q < 2; ++q) {
    double s[kPairs] = {};
#pragma unroll
    for (uint32_t i = 0; i < kUnits; ++i) {
      uint32_t p = 0;
#pragma unroll
      for (uint32_t h = 0; h < kH; ++h) {
#pragma unroll
        for (uint32_t h2 = h; h2 < kH; ++h2) s[p++] += dot4(r[i][q][h], r[i][q][h2]);
      }
    }
#pragma unroll
    for (uint32_t p = 0; p < kPairs; ++p) {
      s[p] += __shfl_xor_sync(0xffffffffu, s[p], 1);
      s[p] += __shfl_xor_sync(0xffffffffu, s[p], 2);
      if (t == 0) gram_w[warp * kRows * kPairs + (g + 8 * q) * kPairs + p] = s[p];
    }
  }
  __syncthreads();
  // The block's sums into warp 0's slots (each thread its own entries, in warp order).
  for (uint32_t i = tid; i < kRows * (kMix + kPairs); i += kThreads) {
    if (i < kRows * kMix) {
      float s = 0.0f;
      for (uint32_t w = 0; w < W; ++w) s += mix_w[w * kRows * kMix + i];
      mix_w[i] = s;
    } else {
      const uint32_t e = i - kRows * kMix;
      double s = 0.0;
      for (uint32_t w = 0; w < W; ++w) s += gram_w[w * kRows * kPairs + e];
      gram_w[e] = s;
    }
  }
  cluster.sync();
  // The cluster's sums, the ranks in order: every block gets the same bits.
  for (uint32_t i = tid; i < kRows * (kMix + kPairs); i += kThreads) {
    if (i < kRows * kMix) {
      float s = 0.0f;
#pragma unroll
      for (uint32_t q = 0; q < kB; ++q) s += cluster.map_shared_rank(mix_w, q)[i];
      mix[i] = s;
    } else {
      const uint32_t e = i - kRows * kMix;
      double s = 0.0;
#pragma unroll
      for (uint32_t q = 0; q < kB; ++q) s += cluster.map_shared_rank(gram_w, q)[e];
      gram[e] = s;
    }
  }
  // No block leaves (its shared memory unmapped) before every block has read the sums: the wait is
  // at the end.
  cluster.barrier_arrive();
  __syncthreads();
  for (uint32_t lr = warp; lr < kRows; lr += W) {
    const uint32_t row = row0 + lr;
    if (row >= a.rows) continue;  // the same for the whole warp
    const float* m = mix + lr * kMix;
    const double* gr = gram + lr * kPairs;
    double ss = 0.0;
    for (uint32_t h = 0, p = 0; h < kH; p += kH - h, ++h) ss += gr[p];
    const float inv = rsqrtf(static_cast<float>(ss) / static_cast<float>(kH * D) + a.rms_eps);
    // pre and inv_u in every block; post and the comb logits by rank lr % kB (comb_kernel's Sinkhorn
    // then finishes comb: ~40 dependent rounds on a warp, which held rank 0's SM here).
    const bool writer = lr % kB == rank;
    mhc_pre_post(a, m, inv, row, writer, pre[lr]);
    if (writer && lane < kH * kH) a.comb[size_t{row} * kH * kH + lane] = mhc_comb_logit(a, m, inv, lane);
    __syncwarp();
    if (lane == 0) {
      double su = 0.0;
      uint32_t p = 0;
      for (uint32_t h = 0; h < kH; ++h) {
        for (uint32_t h2 = h; h2 < kH; ++h2, ++p) {
          su += (h == h2 ? 1.0 : 2.0) * double(pre[lr][h]) * double(pre[lr][h2]) * gr[p];
        }
      }
      inv_u[lr] = rsqrtf(static_cast<float>(su) / static_cast<float>(D) + a.rms_eps);
    }
  }
  __syncthreads();
  const float4* nw = reinterpret_cast<const float4*>(a.norm_w);
#pragma unroll
  for (uint32_t i = 0; i < kUnits; ++i) {
#pragma unroll
    for (uint32_t q = 0; q < 2; ++q) {
      if (!have[i] || !ok[q]) continue;
      const uint32_t lr = g + 8 * q;
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (uint32_t h = 0; h < kH; ++h) {
        const float4 x = r[i][q][h];
        const float p = pre[lr][h];
        v.x += p * x.x, v.y += p * x.y, v.z += p * x.z, v.w += p * x.w;
      }
      const float4 w = nw[col[i] / 4];
      const float iu = inv_u[lr];
      reinterpret_cast<float4*>(a.x)[(size_t{rows[q]} * D + col[i]) / 4] =
          make_float4(v.x * iu * w.x, v.y * iu * w.y, v.z * iu * w.z, v.w * iu * w.w);
    }
  }
  cluster.barrier_wait();
#else
  (void)f;
  __trap();  // launched only where it was built for sm90+ (placeable)
#endif
}

// The Sinkhorn of every row, one warp a row, from the comb logits mhc_prefill_kernel left in a.comb:
// the one-block kernel's operations (gpu/mhc_coefficients.cuh).
constexpr uint32_t kCombRows = 8;
__global__ void __launch_bounds__(kCombRows * 32) comb_kernel(MhcArgs a) {
  __shared__ float c[kCombRows][kH * kH];
  const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31, row = blockIdx.x * kCombRows + warp;
  if (row >= a.rows) return;  // the same for the whole warp
  if (lane < kH * kH) c[warp][lane] = a.comb[size_t{row} * kH * kH + lane];
  mhc_sinkhorn(a, row, c[warp]);
}

// Whether this build's kernel runs here and the device can place one cluster of it (asked once per
// device).
bool placeable() {
  static std::mutex mutex;
  static std::map<int, bool> known;
  int dev = 0;
  FERRY_CUDA(cudaGetDevice(&dev));
  const std::lock_guard<std::mutex> lock(mutex);
  auto [it, fresh] = known.try_emplace(dev, false);
  if (!fresh) return it->second;
  if (!sm90_code_built(reinterpret_cast<const void*>(mhc_prefill_kernel))) return false;
  FERRY_CUDA(cudaFuncSetAttribute(mhc_prefill_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(kSmemBytes)));
  const ClusterLaunch l(reinterpret_cast<const void*>(mhc_prefill_kernel), dim3(kB, 1), dim3(kThreads), kSmemBytes,
                        nullptr, dim3(kB, 1, 1), false);
  int clusters = 0;
  it->second = cudaOccupancyMaxActiveClusters(&clusters, mhc_prefill_kernel, &l.cfg) == cudaSuccess && clusters > 0;
  (void)cudaGetLastError();  // a refused query leaves no error behind
  return it->second;
}

}  // namespace

bool mhc_site_prefill(const MhcPostPre& p, cudaStream_t stream) {
  const MhcArgs& a = p.pre;
  const DevMatrix& fn = *p.fn;
  if (a.rows == 0 || a.H != kH || a.D % 16 != 0 || a.D > kMaxD || p.combine != nullptr) return false;
  const bool f32_mixer =
      fn.type == model::GgmlType::F32 && fn.rows == kMix && fn.cols == kH * a.D && fn.row_bytes == size_t{fn.cols} * 4;
  if (!f32_mixer) return false;
  const auto aligned = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  if (!aligned(fn.data) || !aligned(p.streams) || !aligned(a.x) || !aligned(a.norm_w) || (p.y && !aligned(p.y))) {
    return false;
  }
  if (!placeable()) return false;
  SiteArgs f;
  f.a = a;
  f.a.mix = nullptr;
  f.a.streams = p.streams;
  f.fn = reinterpret_cast<const float*>(fn.data);
  f.y = p.y;
  f.post_in = p.post_in;
  f.comb_in = p.comb_in;
  f.streams = p.streams;
  const ClusterLaunch l(reinterpret_cast<const void*>(mhc_prefill_kernel), dim3(kB, (a.rows + kRows - 1) / kRows),
                        dim3(kThreads), kSmemBytes, stream, dim3(kB, 1, 1), false);
  FERRY_CUDA(cudaLaunchKernelEx(&l.cfg, mhc_prefill_kernel, f));
  comb_kernel<<<(a.rows + kCombRows - 1) / kCombRows, kCombRows * 32, 0, stream>>>(f.a);
  FERRY_CUDA_LAUNCHED();
  return true;
}

}  // namespace ferry::gpu
