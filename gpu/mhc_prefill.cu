// One mHC site of a prefill chunk in one launch on sm90+ (gpu/mhc_prefill.hpp). Before, a site of
// 2,048 rows ran mhc_post (the streams read and written: 145 us), the mixer product on cuBLAS SGEMM
// (24 rows of fn against the streams, read again: 92 us) and the one-block-a-row mhc_pre (read twice
// more: 151 us): ~0.37 ms for ~0.34 GB that copy bandwidth moves in ~85 us.
//
// Here a cluster of 16 blocks takes 16 rows (a tile) at a time, persistently: block `rank` owns
// columns [rank * per * 16, ...) of every stream, one unit of 16 columns a warp, and its slice of fn
// sits in shared memory for the whole launch. A tile's streams are read once (into registers, the
// next tile's loads issued while the cluster works on this one) and, after the post, written once.
// A unit's values are the A operand of tf32 MMAs (m16n8k8: 16 rows, 8 mixer rows, 8 columns) over
// f32 operands split into big + small tf32 parts (three MMAs, small x small dropped), so the logits
// keep ~f32 accuracy. Lane (g, t) holds rows g and g + 8 at columns 4t..4t+3 of its unit for all 4
// streams; the MMA's k slots t and t + 4 take columns 2j and 2j + 1 of those, in A and B alike (a sum
// does not care which k is where). The Gram sums of the rows' streams (f64, as gpu/mhc_decode.cu
// makes them) give the 1/rms and the collapsed stream's norm, so nothing is read twice. The warps'
// partial sums meet in shared memory and the cluster's in distributed shared memory; each block then
// makes pre and its slice of x, and one rank a row's post and comb logits, whose Sinkhorn (a chain of
// ~40 dependent rounds on one warp) runs after the launch in comb_kernel, off the tiles' path.
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "gpu/cuda_check.hpp"
#include "gpu/mhc_coefficients.cuh"
#include "gpu/mhc_prefill.hpp"
#include "gpu/pdl.hpp"

namespace ferry::gpu {
namespace {

namespace cg = cooperative_groups;

constexpr uint32_t kH = 4, kMix = (2 + kH) * kH, kPairs = kH * (kH + 1) / 2, kRows = kMhcPrefillTileRows;
// A cluster of 16 blocks (non-portable: the H200 places them) of 16 warps, one unit of 16 columns a
// warp: D up to 4,096, the tile's rows one a warp for the coefficients.
constexpr uint32_t kB = 16, kWarps = 16, kThreads = kWarps * 32;
static_assert(kWarps == kRows, "a warp a row of the tile for the coefficients");
constexpr uint32_t kSums = kRows * (kMix + kPairs);  // a tile's logits and Gram sums
static_assert(kSums % kB == 0 && kB == 16, "the ranks own equal shares, an entry's ranks a half-warp");
[[maybe_unused]] constexpr uint32_t kTiles = kMix / 8;  // MMA column tiles of 8 mixer rows

struct SiteArgs {
  MhcArgs a;
  const float* fn = nullptr;       // [kMix][kH * D]
  const float* y = nullptr;        // [rows][D]; null: no post
  const float* post_in = nullptr;  // [rows][kH], [rows][kH * kH]: read before rank 0 writes a.post / a.comb
  const float* comb_in = nullptr;
  float* streams = nullptr;        // [rows][kH * D], a.streams
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ float comp(const float4& v, uint32_t i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

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

// A tile's loads of one thread: its streams and y (rows g and g + 8, columns col..col + 3), and entry
// threadIdx.x of the post's coefficients (post_in, then comb_in).
__device__ __forceinline__ void fetch_tile(const SiteArgs& f, uint32_t tile, uint32_t g, bool have, uint32_t col,
                                           float4 (&rn)[2][kH], float4 (&yn)[2], float& cn) {
  const MhcArgs& a = f.a;
  const uint32_t row0 = tile * kRows, D = a.D;
  const size_t HD = size_t{kH} * D;
  const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (uint32_t q = 0; q < 2; ++q) {
    const uint32_t row = row0 + g + 8 * q;
    const bool ok = have && row < a.rows;
#pragma unroll
    for (uint32_t h = 0; h < kH; ++h) {
      rn[q][h] = ok ? reinterpret_cast<const float4*>(f.streams)[(row * HD + h * D + col) / 4] : zero;
    }
    yn[q] = ok && f.y != nullptr ? reinterpret_cast<const float4*>(f.y)[(size_t{row} * D + col) / 4] : zero;
  }
  const uint32_t tid = threadIdx.x;
  if (f.y != nullptr && tid < kRows * kH * (kH + 1)) {
    const bool is_post = tid < kRows * kH;
    const uint32_t j = is_post ? tid : tid - kRows * kH;
    if (row0 + j / (is_post ? kH : kH * kH) < a.rows) {
      cn = is_post ? f.post_in[size_t{row0} * kH + j] : f.comb_in[size_t{row0} * kH * kH + j];
    }
  }
}
#endif

// Dynamic shared memory of a block that owns `per` units: each warp's partial Gram sums and logits of
// a tile's rows, the tile's streams (each thread's own 8 float4), and the block's slice of fn, one
// (mixer row, stream) per `per * 16 + 4` floats (the 4 put rows g and g + 1 of a B fragment's loads
// in different banks).
__host__ __device__ constexpr uint32_t fn_stride(uint32_t per) { return per * 16 + 4; }
constexpr size_t smem_bytes(uint32_t per) {
  return size_t{kWarps} * kRows * (kPairs * sizeof(double) + kMix * sizeof(float)) + size_t{kThreads} * 2 * kH * 16 +
         size_t{kMix} * kH * fn_stride(per) * sizeof(float);
}
static_assert(smem_bytes(kWarps) + 8 * 1024 <= 227 * 1024, "a block's shared memory fits the sm90 opt-in");

// Grid (kB, clusters), clusters of kB along x; cluster blockIdx.y takes tiles blockIdx.y,
// blockIdx.y + gridDim.y, ..., each thread's loads of the next tile in flight while the cluster works
// on the current one.
__global__ void __launch_bounds__(kThreads, 1) mhc_prefill_kernel(SiteArgs f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) unsigned char smem[];
  double* const gram_w = reinterpret_cast<double*>(smem);                     // [kWarps][kRows * kPairs]
  float4* const rs = reinterpret_cast<float4*>(gram_w + kWarps * kRows * kPairs);  // [2 * kH][kThreads]
  float* const mix_w = reinterpret_cast<float*>(rs + 2 * kH * kThreads);      // [kWarps][kRows * kMix]
  float* const fns = mix_w + kWarps * kRows * kMix;                           // [kMix * kH][fn_stride]
  __shared__ double owned[kSums / kB];  // this rank's entries of the cluster's sums
  __shared__ double gram[kRows * kPairs];
  __shared__ float mix[kRows * kMix];
  __shared__ float coef[kRows * kH * (kH + 1)];  // the tile's post_in [kRows][kH], then comb_in [kRows][kH * kH]
  __shared__ float pre[kRows][kH];
  __shared__ float inv_u[kRows];
  const MhcArgs& a = f.a;
  const cg::cluster_group cluster = cg::this_cluster();
  const uint32_t rank = cluster.block_rank(), tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const uint32_t g = lane >> 2, t = lane & 3;
  const uint32_t D = a.D, units = D / 16, per = (units + kB - 1) / kB, stride = fn_stride(per);
  const uint32_t tiles = (a.rows + kRows - 1) / kRows;
  const size_t HD = size_t{kH} * D;
  const uint32_t unit = rank * per + warp;
  const bool have = warp < per && unit < units;  // the same for the whole warp
  const uint32_t col = unit * 16 + 4 * t;        // lane t's 4 columns of each stream
  const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  // The block's slice of fn, once: columns [rank * per * 16, ...) of each (mixer row, stream).
  {
    const uint32_t c0 = rank * per * 16, n4 = per * 4;
    const float4* F = reinterpret_cast<const float4*>(f.fn);
    for (uint32_t i = tid; i < kMix * kH * n4; i += kThreads) {
      const uint32_t mh = i / n4, c4 = i % n4;
      const float4 v = c0 + 4 * c4 < D ? F[(size_t{mh} * D + c0) / 4 + c4] : zero;
      *reinterpret_cast<float4*>(fns + mh * stride + 4 * c4) = v;
    }
  }
  float4 rn[2][kH], yn[2];
  float cn = 0.0f;
  fetch_tile(f, blockIdx.y, g, have, col, rn, yn, cn);
  for (uint32_t tile = blockIdx.y; tile < tiles; tile += gridDim.y) {
    const uint32_t row0 = tile * kRows;
    const bool ok[2] = {have && row0 + g < a.rows, have && row0 + g + 8 < a.rows};
    float4 r[2][kH], yv[2];
#pragma unroll
    for (uint32_t q = 0; q < 2; ++q) {
      yv[q] = yn[q];
#pragma unroll
      for (uint32_t h = 0; h < kH; ++h) r[q][h] = rn[q][h];
    }
    __syncthreads();  // the last tile's reads of coef, pre and inv_u are done
    if (f.y != nullptr && tid < kRows * kH * (kH + 1)) coef[tid] = cn;
    __syncthreads();
    if (f.y != nullptr) {
      // mhc_post's arithmetic (ops.cu, the same explicit fmas), component by component: the same bits.
#pragma unroll
      for (uint32_t q = 0; q < 2; ++q) {
        if (!ok[q]) continue;
        const float* po = coef + (g + 8 * q) * kH;
        const float* cb = coef + kRows * kH + (g + 8 * q) * kH * kH;
        float4 nr[kH];
#pragma unroll
        for (uint32_t h2 = 0; h2 < kH; ++h2) {
          float4 v = make_float4(po[h2] * yv[q].x, po[h2] * yv[q].y, po[h2] * yv[q].z, po[h2] * yv[q].w);
#pragma unroll
          for (uint32_t h = 0; h < kH; ++h) {
            const float c = cb[h * kH + h2];
            v.x = __fmaf_rn(c, r[q][h].x, v.x), v.y = __fmaf_rn(c, r[q][h].y, v.y);
            v.z = __fmaf_rn(c, r[q][h].z, v.z), v.w = __fmaf_rn(c, r[q][h].w, v.w);
          }
          nr[h2] = v;
        }
        const size_t row = row0 + g + 8 * q;
#pragma unroll
        for (uint32_t h = 0; h < kH; ++h) {
          r[q][h] = nr[h];
          reinterpret_cast<float4*>(f.streams)[(row * HD + h * D + col) / 4] = nr[h];
        }
      }
    }
#pragma unroll
    for (uint32_t q = 0; q < 2; ++q) {
#pragma unroll
      for (uint32_t h = 0; h < kH; ++h) rs[(q * kH + h) * kThreads + tid] = r[q][h];
    }
    if (tile + gridDim.y < tiles) fetch_tile(f, tile + gridDim.y, g, have, col, rn, yn, cn);
    // The logits: acc[j] is the MMA tile of mixer rows 8j..8j+7.
    float acc[kTiles][4] = {};
    if (have) {
#pragma unroll 1
      for (uint32_t h = 0; h < kH; ++h) {
        const float4 ra = rs[h * kThreads + tid], rb = rs[(kH + h) * kThreads + tid];
        float4 fb[kTiles];
#pragma unroll
        for (uint32_t j = 0; j < kTiles; ++j) {
          fb[j] = *reinterpret_cast<const float4*>(fns + ((8 * j + g) * kH + h) * stride + warp * 16 + 4 * t);
        }
#pragma unroll
        for (uint32_t k2 = 0; k2 < 2; ++k2) {
          uint32_t big[4], small[4];
          split_tf32(comp(ra, 2 * k2), big[0], small[0]);
          split_tf32(comp(rb, 2 * k2), big[1], small[1]);
          split_tf32(comp(ra, 2 * k2 + 1), big[2], small[2]);
          split_tf32(comp(rb, 2 * k2 + 1), big[3], small[3]);
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
    float* const m_w = mix_w + warp * kRows * kMix;
#pragma unroll
    for (uint32_t j = 0; j < kTiles; ++j) {
      m_w[g * kMix + 8 * j + 2 * t] = acc[j][0];
      m_w[g * kMix + 8 * j + 2 * t + 1] = acc[j][1];
      m_w[(g + 8) * kMix + 8 * j + 2 * t] = acc[j][2];
      m_w[(g + 8) * kMix + 8 * j + 2 * t + 1] = acc[j][3];
    }
    // The Gram sums of each row over the warp's columns: the lanes' in f64, then the row's 4 lanes.
#pragma unroll
    for (uint32_t q = 0; q < 2; ++q) {
      float4 x[kH];
#pragma unroll
      for (uint32_t h = 0; h < kH; ++h) x[h] = rs[(q * kH + h) * kThreads + tid];
      double s[kPairs];
      uint32_t p = 0;
#pragma unroll
      for (uint32_t h = 0; h < kH; ++h) {
#pragma unroll
        for (uint32_t h2 = h; h2 < kH; ++h2) s[p++] = dot4(x[h], x[h2]);
      }
#pragma unroll
      for (uint32_t e = 0; e < kPairs; ++e) {
        s[e] += __shfl_xor_sync(0xffffffffu, s[e], 1);
        s[e] += __shfl_xor_sync(0xffffffffu, s[e], 2);
        if (t == 0) gram_w[warp * kRows * kPairs + (g + 8 * q) * kPairs + e] = s[e];
      }
    }
    __syncthreads();
    // The block's sums into warp 0's slots (each thread its own entries, in warp order).
    for (uint32_t i = tid; i < kRows * (kMix + kPairs); i += kThreads) {
      if (i < kRows * kMix) {
        float s = 0.0f;
        for (uint32_t w = 0; w < kWarps; ++w) s += mix_w[w * kRows * kMix + i];
        mix_w[i] = s;
      } else {
        const uint32_t e = i - kRows * kMix;
        double s = 0.0;
        for (uint32_t w = 0; w < kWarps; ++w) s += gram_w[w * kRows * kPairs + e];
        gram_w[e] = s;
      }
    }
    // The cluster's sums in two steps: rank q adds entries q, q + kB, ... over the ranks (16 lanes an
    // entry, a fixed shuffle order, in f64), then every block reads each entry from its owner: the same
    // bits in every block, two remote loads a thread instead of kB.
    cluster.sync();
    for (uint32_t j = tid; j < kSums; j += kThreads) {  // kSums is a multiple of 16: whole half-warps
      const uint32_t k = j / kB, src = j % kB, i = k * kB + rank;
      double v = i < kRows * kMix ? double(cluster.map_shared_rank(mix_w, src)[i])
                                  : cluster.map_shared_rank(gram_w, src)[i - kRows * kMix];
#pragma unroll
      for (uint32_t o = kB / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (src == 0) owned[k] = v;
    }
    cluster.sync();
    for (uint32_t i = tid; i < kSums; i += kThreads) {
      const double v = cluster.map_shared_rank(owned, i % kB)[i / kB];
      if (i < kRows * kMix) {
        mix[i] = static_cast<float>(v);
      } else {
        gram[i - kRows * kMix] = v;
      }
    }
    __syncthreads();
    // Row warp of the tile (kRows == kWarps): pre and inv_u in every block; post and the comb logits
    // (the Sinkhorn is comb_kernel's) by rank warp % kB.
    {
      const uint32_t lr = warp, row = row0 + lr;
      if (row < a.rows) {  // the same for the whole warp
        const float* m = mix + lr * kMix;
        const double* gr = gram + lr * kPairs;
        double ss = 0.0;
        for (uint32_t h = 0, p = 0; h < kH; p += kH - h, ++h) ss += gr[p];
        const float inv = rsqrtf(static_cast<float>(ss) / static_cast<float>(kH * D) + a.rms_eps);
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
    }
    __syncthreads();
    const float4* nw = reinterpret_cast<const float4*>(a.norm_w);
#pragma unroll
    for (uint32_t q = 0; q < 2; ++q) {
      if (!ok[q]) continue;
      const uint32_t lr = g + 8 * q;
      float4 v = zero;
#pragma unroll
      for (uint32_t h = 0; h < kH; ++h) {
        const float4 x = rs[(q * kH + h) * kThreads + tid];
        const float p = pre[lr][h];
        v.x += p * x.x, v.y += p * x.y, v.z += p * x.z, v.w += p * x.w;
      }
      const float4 w = nw[col / 4];
      const float iu = inv_u[lr];
      reinterpret_cast<float4*>(a.x)[(size_t{row0 + lr} * D + col) / 4] =
          make_float4(v.x * iu * w.x, v.y * iu * w.y, v.z * iu * w.z, v.w * iu * w.w);
    }
  }
  cluster.sync();  // no block leaves (its shared memory unmapped) while another reads its sums
#else
  (void)f;
  __trap();  // launched only where it was built for sm90+ (clusters_for)
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

// Clusters of the kernel that the device holds at once for a block's `per` units, asked once per device
// and size; 0: none.
uint32_t clusters_for(uint32_t per) {
  static std::mutex mutex;
  static std::map<std::pair<int, uint32_t>, uint32_t> known;
  int dev = 0;
  FERRY_CUDA(cudaGetDevice(&dev));
  const std::lock_guard<std::mutex> lock(mutex);
  auto [it, fresh] = known.try_emplace({dev, per}, 0u);
  if (!fresh) return it->second;
  if (!sm90_code_built(reinterpret_cast<const void*>(mhc_prefill_kernel))) return 0;
  const size_t smem = smem_bytes(per);
  FERRY_CUDA(cudaFuncSetAttribute(mhc_prefill_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(smem)));
  FERRY_CUDA(cudaFuncSetAttribute(mhc_prefill_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(kB, 1);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = kB;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, mhc_prefill_kernel, &cfg) == cudaSuccess && clusters > 0) {
    it->second = static_cast<uint32_t>(clusters);
  }
  (void)cudaGetLastError();  // a refused query leaves no error behind
  return it->second;
}

}  // namespace

bool mhc_site_prefill(const MhcPostPre& p, cudaStream_t stream) {
  const MhcArgs& a = p.pre;
  const DevMatrix& fn = *p.fn;
  if (a.rows == 0 || a.H != kH || a.D % 16 != 0 || a.D / 16 > kB * kWarps || p.combine != nullptr) return false;
  if (fn.type != model::GgmlType::F32 || fn.rows != kMix || fn.cols != kH * a.D || fn.row_bytes != size_t{fn.cols} * 4) {
    return false;
  }
  const auto aligned = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  if (!aligned(fn.data) || !aligned(p.streams) || !aligned(a.x) || !aligned(a.norm_w) || (p.y && !aligned(p.y))) {
    return false;
  }
  const char* env = std::getenv("FERRY_MHC_PREFILL");  // TEMPORARY A/B switch for the H200 checks
  if (env != nullptr && std::string(env) == "off") return false;
  const uint32_t per = (a.D / 16 + kB - 1) / kB;
  const uint32_t clusters = clusters_for(per);
  if (clusters == 0) return false;
  SiteArgs f;
  f.a = a;
  f.a.mix = nullptr;
  f.a.streams = p.streams;
  f.fn = reinterpret_cast<const float*>(fn.data);
  f.y = p.y;
  f.post_in = p.post_in;
  f.comb_in = p.comb_in;
  f.streams = p.streams;
  const uint32_t tiles = (a.rows + kRows - 1) / kRows;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(kB, std::min(tiles, clusters));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem_bytes(per);
  cfg.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = kB;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  FERRY_CUDA(cudaLaunchKernelEx(&cfg, mhc_prefill_kernel, f));
  comb_kernel<<<(a.rows + kCombRows - 1) / kCombRows, kCombRows * 32, 0, stream>>>(f.a);
  FERRY_CUDA_LAUNCHED();
  return true;
}

}  // namespace ferry::gpu
