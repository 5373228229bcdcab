// Prefill pool scores on mma.sync (sm80+; gpu/indexer_prefill.hpp says what and why).
//
// A block: 8 warps, kRows query rows (rows in reverse: a chunk's later rows see more pools, so the
// longest blocks start first), their queries split into fp16 hi/lo in shared memory once, then tiles
// of kTile pool keys of the rows' slot, split as they are loaded. Warp w takes row w / 2 (its 32 heads,
// two m16 tiles) against pools [32 (w % 2), 32 (w % 2) + 32) of the tile: per k16 step the queries'
// and the keys' fragments by ldmatrix, hi hi products into one accumulator and the hi lo, lo hi ones
// (2^12 too large, gpu/half_split.cuh) into another. Then per pool: dot = hi + cross 2^-12, the
// weighted ReLU of each of the thread's four heads summed from +0.0 (so that a pool every head of
// which scores <= 0 is exactly +0.0, as on the CPU: the ReLU's ties), and the sum over the heads'
// lanes (three shuffles). Heads past a.heads and dims past head_dim are zero queries and weights.
// A block's rows of other slots (a step with several slots' chunks) take further passes over their
// own slot's pools; the grid's x strides the pool tiles, as many as keep the device's blocks busy.
#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "gpu/cuda_check.hpp"
#include "gpu/indexer_prefill.hpp"
#include "gpu/kernels.hpp"
#include "gpu/mma_f16.cuh"
#include "gpu/pdl.hpp"

namespace ferry::gpu {
namespace {

constexpr uint32_t kRows = 4;     // query rows a block
constexpr uint32_t kHeads = 32;   // heads a row: two m16 tiles
constexpr uint32_t kTile = 64;    // pools a step: two warps of 32
constexpr uint32_t kWarps = 8;
constexpr uint32_t kThreads = kWarps * 32;
constexpr uint32_t kMaxDim = 128;
constexpr uint32_t kPad = 8;      // halves past each row: ldmatrix's 8 rows on distinct banks
static_assert(kWarps == 2 * kRows && kTile == 64, "two warps a row, 32 pools each");

struct Layout {
  uint32_t kd, ld;  // dims padded to k16 steps; halves a shared row
  size_t q_hi, q_lo, k_hi, k_lo, w, bytes;
  __host__ __device__ explicit Layout(uint32_t head_dim) : kd((head_dim + 15) / 16 * 16), ld(kd + kPad) {
    const size_t q = size_t{kRows} * kHeads * ld * sizeof(__half), k = size_t{kTile} * ld * sizeof(__half);
    q_hi = 0;          // [kRows][kHeads][ld]
    q_lo = q_hi + q;
    k_hi = q_lo + q;   // [kTile][ld]
    k_lo = k_hi + k;
    w = k_lo + k;      // [kRows][kHeads] f32, weights_proj * heads^-0.5
    bytes = w + size_t{kRows} * kHeads * sizeof(float);
  }
};

__global__ void __launch_bounds__(kThreads, 2) prefill_score_kernel(IndexerArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using mma::ldsm_x4;
  using mma::mma_f16;
  using mma::smem_address;
  using mma::split_pair;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ int s_slot[kRows], s_nv[kRows];
  const Layout lay(a.head_dim);
  const uint32_t kd = lay.kd, ld = lay.ld, H = a.heads, hd = a.head_dim, hd4 = hd / 4;
  __half* q_hi = reinterpret_cast<__half*>(smem + lay.q_hi);
  __half* q_lo = reinterpret_cast<__half*>(smem + lay.q_lo);
  __half* k_hi = reinterpret_cast<__half*>(smem + lay.k_hi);
  __half* k_lo = reinterpret_cast<__half*>(smem + lay.k_lo);
  float* s_w = reinterpret_cast<float*>(smem + lay.w);
  const uint32_t r0 = (gridDim.y - 1 - blockIdx.y) * kRows;
  const int kp = static_cast<int>(a.kpool);
  const uint32_t max_pools = a.ctx / a.kpool;

  // The block's rows; nothing to do when none sees a pool of this block's first tile.
  int nv_all = 0;
#pragma unroll
  for (uint32_t i = 0; i < kRows; ++i) {
    const uint32_t r = r0 + i;
    nv_all = max(nv_all, r < a.rows ? (a.row.pos[r] + 1) / kp : 0);
  }
  if (static_cast<int>(blockIdx.x * kTile) >= nv_all) return;
  if (threadIdx.x < kRows) {
    const uint32_t r = r0 + threadIdx.x;
    s_slot[threadIdx.x] = r < a.rows ? a.row.slot[r] : -1;
    s_nv[threadIdx.x] = r < a.rows ? (a.row.pos[r] + 1) / kp : 0;
  }
  // Queries as hi/lo pairs of dims (zero past the heads, the dims and the rows), weights pre-scaled.
  for (uint32_t i = threadIdx.x; i < kRows * kHeads * (kd / 2); i += kThreads) {
    const uint32_t m = i / (kd / 2), c = 2 * (i % (kd / 2)), r = r0 + m / kHeads, h = m % kHeads;
    float x = 0.0f, y = 0.0f;
    if (r < a.rows && h < H && c < hd) {
      const float2 v = *reinterpret_cast<const float2*>(a.q + (static_cast<size_t>(r) * H + h) * hd + c);
      x = v.x, y = v.y;
    }
    uint32_t hi, lo;
    split_pair(x, y, hi, lo);
    *reinterpret_cast<uint32_t*>(q_hi + m * ld + c) = hi;
    *reinterpret_cast<uint32_t*>(q_lo + m * ld + c) = lo;
  }
  const float wscale = rsqrtf(static_cast<float>(H));
  for (uint32_t m = threadIdx.x; m < kRows * kHeads; m += kThreads) {
    const uint32_t r = r0 + m / kHeads, h = m % kHeads;
    s_w[m] = r < a.rows && h < H ? a.w[static_cast<size_t>(r) * H + h] * wscale : 0.0f;
  }
  // The keys' dims past head_dim stay zero (the tile loads write only those below).
  for (uint32_t i = threadIdx.x; i < kTile * (kd - hd); i += kThreads) {
    const uint32_t p = i / (kd - hd), c = hd + i % (kd - hd);
    k_hi[p * ld + c] = __float2half_rn(0.0f);
    k_lo[p * ld + c] = __float2half_rn(0.0f);
  }

  const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const uint32_t wr = warp / 2, wn = warp % 2;
  const float scale = rsqrtf(static_cast<float>(hd));
  // ldmatrix rows: A matrix lane / 8 is heads + 8 ((lane / 8) & 1), dims + 8 (lane / 16); B matrix
  // lane / 8 is pools + 8 (lane / 16), dims + 8 ((lane / 8) & 1): registers b0, b1 of two n8 tiles.
  const uint32_t a_at = (wr * kHeads + (lane & 15)) * ld + 8 * (lane >> 4);
  const uint32_t b_at = (wn * 32 + 8 * (lane >> 4) + (lane & 7)) * ld + 8 * ((lane >> 3) & 1);
  __syncthreads();
  const int row_slot = s_slot[wr], row_nv = s_nv[wr];
  float wv[2][2];
#pragma unroll
  for (uint32_t mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (uint32_t half = 0; half < 2; ++half) wv[mt][half] = s_w[wr * kHeads + 16 * mt + 8 * half + g];
  }
  float* out = a.scores + static_cast<size_t>(r0 + wr) * max_pools;

  uint32_t done = 0;  // rows whose slot has had its pass
  for (;;) {
    int slot = -1, nv_max = 0;
    uint32_t mine = 0;
#pragma unroll
    for (uint32_t i = 0; i < kRows; ++i) {
      if ((done >> i & 1u) || s_slot[i] < 0) continue;
      if (slot < 0) slot = s_slot[i];
      if (s_slot[i] == slot) {
        mine |= 1u << i;
        nv_max = max(nv_max, s_nv[i]);
      }
    }
    if (slot < 0) break;
    done |= mine;
    const bool active = row_slot == slot;
    const float4* pools = reinterpret_cast<const float4*>(a.pool_cache + static_cast<size_t>(slot) * max_pools * hd);
    for (int p0 = static_cast<int>(blockIdx.x * kTile); p0 < nv_max; p0 += static_cast<int>(gridDim.x * kTile)) {
      __syncthreads();  // the previous tile's fragments are read
      for (uint32_t i = threadIdx.x; i < kTile * hd4; i += kThreads) {
        const uint32_t p = i / hd4, c = 4 * (i % hd4);
        const float4 v = p0 + static_cast<int>(p) < nv_max ? __ldg(pools + static_cast<size_t>(p0 + p) * hd4 + c / 4)
                                                           : make_float4(0.f, 0.f, 0.f, 0.f);
        uint2 hi, lo;
        split_pair(v.x, v.y, hi.x, lo.x);
        split_pair(v.z, v.w, hi.y, lo.y);
        *reinterpret_cast<uint2*>(k_hi + p * ld + c) = hi;
        *reinterpret_cast<uint2*>(k_lo + p * ld + c) = lo;
      }
      __syncthreads();
      const int pw = p0 + static_cast<int>(wn * 32);  // the warp's first pool
      if (!active || pw >= row_nv) continue;
      float hh[2][4][4] = {}, cross[2][4][4] = {};
      for (uint32_t k0 = 0; k0 < kd; k0 += 16) {
        uint32_t ah[2][4], al[2][4];
#pragma unroll
        for (uint32_t mt = 0; mt < 2; ++mt) {
          ldsm_x4(ah[mt], smem_address(q_hi + a_at + 16 * mt * ld + k0));
          ldsm_x4(al[mt], smem_address(q_lo + a_at + 16 * mt * ld + k0));
        }
#pragma unroll
        for (uint32_t np = 0; np < 2; ++np) {
          uint32_t bh[4], bl[4];
          ldsm_x4(bh, smem_address(k_hi + b_at + 16 * np * ld + k0));
          ldsm_x4(bl, smem_address(k_lo + b_at + 16 * np * ld + k0));
#pragma unroll
          for (uint32_t t = 0; t < 2; ++t) {
            const uint32_t n = 2 * np + t;
#pragma unroll
            for (uint32_t mt = 0; mt < 2; ++mt) {
              mma_f16(hh[mt][n], ah[mt], bh[2 * t], bh[2 * t + 1]);
              mma_f16(cross[mt][n], ah[mt], bl[2 * t], bl[2 * t + 1]);
              mma_f16(cross[mt][n], al[mt], bh[2 * t], bh[2 * t + 1]);
            }
          }
        }
      }
#pragma unroll
      for (uint32_t n = 0; n < 4; ++n) {
#pragma unroll
        for (uint32_t e = 0; e < 2; ++e) {
          float s = 0.0f;
#pragma unroll
          for (uint32_t mt = 0; mt < 2; ++mt) {
#pragma unroll
            for (uint32_t half = 0; half < 2; ++half) {
              const float dot = hh[mt][n][2 * half + e] + cross[mt][n][2 * half + e] * (1.0f / kHalfLoScale);
              s += wv[mt][half] * fmaxf(dot * scale, 0.0f);
            }
          }
#pragma unroll
          for (int o = 4; o < 32; o <<= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
          const int p = pw + static_cast<int>(8 * n + 2 * q + e);
          if (g == 0 && p < row_nv) out[p] = s;
        }
      }
    }
  }
#else
  (void)a;
  __trap();  // hosts launch this kernel only on sm80+ code (indexer_prefill_applies)
#endif
}

}  // namespace

bool indexer_prefill_applies(const IndexerArgs& a) {
  if (a.rows == 0 || a.heads == 0 || a.heads > kHeads || a.head_dim < 4 || a.head_dim % 4 != 0 ||
      a.head_dim > kMaxDim || reinterpret_cast<uintptr_t>(a.pool_cache) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(a.q) % 8 != 0) {
    return false;
  }
  if (!code_built_for(reinterpret_cast<const void*>(prefill_score_kernel), 8)) return false;
  return Layout(a.head_dim).bytes <= static_cast<size_t>(current_smem_optin());
}

void indexer_prefill_scores(const IndexerArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  if (!indexer_prefill_applies(a)) {
    throw CudaError("indexer prefill scores on mma.sync: needs <= 32 heads, head_dim a multiple of 4 up to 128 and "
                    "sm80+ code, has " + std::to_string(a.heads) + " heads of " + std::to_string(a.head_dim));
  }
  const size_t smem = Layout(a.head_dim).bytes;
  FERRY_CUDA(cudaFuncSetAttribute(prefill_score_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(smem)));
  int per_sm = 0;
  FERRY_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, prefill_score_kernel, kThreads, smem));
  // About four blocks for each the device holds at once: a block's queries are loaded once for its
  // tiles, and the chunk's early rows (fewer pools) finish early.
  const uint32_t groups = (a.rows + kRows - 1) / kRows;
  const uint32_t tiles = std::max(1u, (a.ctx / a.kpool + kTile - 1) / kTile);
  const uint32_t want = 4u * static_cast<uint32_t>(std::max(per_sm, 1) * current_sm_count());
  const uint32_t strides = std::clamp((want + groups - 1) / groups, 1u, tiles);
  prefill_score_kernel<<<dim3(strides, groups), kThreads, smem, stream>>>(a);
  FERRY_CUDA_LAUNCHED();
}

}  // namespace ferry::gpu
