// The grouped expert GEMMs of a prefill chunk (gpu/moe_grouped.hpp says what and why).
//
// A block: 8 warps, a tile of 64 weight rows x 64 sorted token rows, k-tiles of 64 columns. Per
// k-tile it decodes the weight rows' units (quant_device.cuh) into fp16 hi/lo tiles in shared memory,
// then each warp multiplies 16 rows x 32 tokens by WMMA 16x16x16. Each weight is decoded once per
// token tile of its expert (a chunk of 2,048 rows routes ~57 rows to each of 288 experts: about once
// per chunk); no dequantised copy is written. Q6_K units span 128 columns, so a 64-column k-tile
// decodes them twice and keeps the half inside it. The input rows are split into fp16 hi/lo once,
// by a pass before the products (float_to_half), not once per tile that reads them (each token
// row is read by every row tile of each of its k experts). While the tensor cores work on a k-tile,
// the next one's activation tiles are copied in (cp.async into a second buffer on sm80+, through
// registers on sm70) and its weight lines asked of L2; two blocks share an SM (128 registers a
// thread), so one decodes while the other multiplies. A warp skips the products of its token halves
// past the tile's rows; down, on sm80+, decodes its next k-tile into a second weight buffer.
#include <cuda_fp16.h>
#include <mma.h>

#include <algorithm>
#include <string>

#include "gpu/block_reduce.cuh"
#include "gpu/cuda_check.hpp"
#include "gpu/half_split.cuh"
#include "gpu/moe_grouped.hpp"
#include "gpu/moe_grouped_int8.hpp"
#include "gpu/quant_device.cuh"
#include "model/formats/iq_grids.hpp"

namespace ferry::gpu {
namespace {

namespace wm = nvcuda::wmma;

constexpr uint32_t BM = kGroupedTileRows, BN = kGroupedTileTokens, BK = 64;
constexpr uint32_t LDS = BK + 8;  // fp16 per shared row: 16-byte multiple, rows off the same banks
constexpr uint32_t LDC = BM + 4;  // f32 per token of the output tile
constexpr uint32_t kThreads = 256;

// Columns one group of a row's units covers (aligned): the units of a k-tile are those of the
// groups it overlaps.
template <int T>
constexpr uint32_t kSpan = T == qd::kQ6_K ? 128
                           : (T == qd::kQ4_K || T == qd::kQ5_K) ? 64
                           : T == qd::kF32Scalar ? 1
                           : (T == qd::kF32 || T == qd::kF16 || T == qd::kBF16) ? 8
                                                                               : 32;

struct GemmArgs {
  const uint8_t* base[2];
  size_t stride[2];
  const uint8_t* const* table[2];
  uint32_t rows, cols;
  size_t row_bytes;
  const __half* xh;  // the input rows split by float_to_half, ldh apart
  const __half* xl;
  size_t ldh;
  bool h_vec;  // xh, xl 16-byte aligned and ldh a multiple of 8: 16-byte copies
  bool w_double;  // shared memory for two weight buffers (NM 1; used by code with kAsyncCopy)
  const int32_t* gather;
  const uint32_t* offsets;
  const uint32_t* tiles;
  uint32_t E;
  float* y;
  size_t ldy;
  float limit;
  const uint32_t* iq3s_grid;
  int8_t iq4nl[16];
};

// The activation tiles' copies: cp.async into a second buffer where the device code has it (sm80+),
// else through registers into the one buffer. The host sizes shared memory by the device (a build
// for sm_70 run on a newer device JITs the one-buffer code: it is given more than it uses).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
constexpr bool kAsyncCopy = true;
#else
constexpr bool kAsyncCopy = false;
#endif

template <int NM>
constexpr size_t smem_bytes(uint32_t weight_buffers, uint32_t act_buffers) {
  const size_t tiles =
      (size_t{weight_buffers} * NM * 2 * BM * LDS + size_t{act_buffers} * 2 * BN * LDS) * sizeof(__half);
  const size_t out = size_t{NM} * BN * LDC * sizeof(float);
  return tiles > out ? tiles : out;
}

// split_half() of two adjacent columns, stored as one 32-bit word each (same values).
__device__ __forceinline__ void split2(float a, float b, __half* hi, __half* lo) {
  const __half2 h = __floats2half2_rn(a, b);
  const float2 f = __half22float2(h);
  *reinterpret_cast<__half2*>(hi) = h;
  *reinterpret_cast<__half2*>(lo) = __floats2half2_rn((a - f.x) * kHalfLoScale, (b - f.y) * kHalfLoScale);
}

// Rows [m0, m0 + BM) x columns [k0, k0 + BK) of each expert matrix w[m] into its hi/lo tiles
// (row-major, LDS apart; matrix m's at As + 2m and 2m + 1 tiles); what lies beyond the rows or
// columns is zero. The matrices' units are one work list, so that gate and up keep every thread busy.
template <int T, int NM>
__device__ void load_weights(const uint8_t* const (&w)[NM], const GemmArgs& a, uint32_t m0, uint32_t k0, __half* As,
                             const uint32_t* grid, const int8_t* kvalues) {
  using Tr = qd::Traits<T>;
  constexpr uint32_t S = kSpan<T>;
  constexpr uint32_t kUnits = (BK > S ? BK : S) / Tr::UE;  // units of a row the k-tile overlaps
  const uint32_t u_first = k0 / S * S / Tr::UE, units_row = a.cols / Tr::UE;
  for (uint32_t i = threadIdx.x; i < NM * BM * kUnits; i += kThreads) {
    const uint32_t m = i / (BM * kUnits), r = i / kUnits % BM, u = u_first + i % kUnits;
    if (m0 + r >= a.rows || u >= units_row) continue;
    __half* hi = As + (2 * m) * BM * LDS + r * LDS;
    __half* lo = hi + BM * LDS;
    float v[Tr::UE];
    qd::decode_unit<T>(w[m] + static_cast<size_t>(m0 + r) * a.row_bytes, u, v, grid, kvalues);
#pragma unroll
    for (int run = 0; run < Tr::RUNS; ++run) {
      const uint32_t c0 = qd::run_col<T>(u, run);
      if constexpr (Tr::RL % 2 == 0) {  // runs start at even columns
#pragma unroll
        for (int j = 0; j < Tr::RL; j += 2) {
          const uint32_t c = c0 + j;
          if (S > BK && (c < k0 || c >= k0 + BK)) continue;
          split2(v[run * Tr::RL + j], v[run * Tr::RL + j + 1], hi + c - k0, lo + c - k0);
        }
      } else {
        split_half(v[run], hi[c0 - k0], lo[c0 - k0]);
      }
    }
  }
  if (m0 + BM > a.rows || k0 + BK > a.cols) {
    const __half zero = __float2half_rn(0.0f);
    for (uint32_t i = threadIdx.x; i < NM * BM * BK; i += kThreads) {
      const uint32_t m = i / (BM * BK), r = i / BK % BM, c = i % BK;
      __half* hi = As + (2 * m) * BM * LDS + r * LDS;
      if (m0 + r >= a.rows || k0 + c >= a.cols) hi[c] = hi[BM * LDS + c] = zero;
    }
  }
}

// Asks L2 for the bytes of the k-tile at k0 of each matrix's rows (the decode of the next k-tile
// then waits on L2, not on device memory), while the tensor cores work on the current one.
template <int NM>
__device__ void prefetch_weights(const uint8_t* const (&w)[NM], const GemmArgs& a, uint32_t m0, uint32_t k0) {
  const size_t lo = size_t{k0} * a.row_bytes / a.cols / 128 * 128;
  const size_t end = (size_t{k0} + BK) * a.row_bytes / a.cols + 1;
  const size_t hi = end < a.row_bytes ? end : a.row_bytes;
  const uint32_t lines = static_cast<uint32_t>((hi - lo + 127) / 128);
  for (uint32_t i = threadIdx.x; i < NM * BM * lines; i += kThreads) {
    const uint32_t m = i / (BM * lines), r = i / lines % BM, l = i % lines;
    if (m0 + r >= a.rows) continue;
    const uint8_t* p = w[m] + static_cast<size_t>(m0 + r) * a.row_bytes + lo + 128 * l;
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
  }
}

// An activation tile (hi, then lo: [2][BN][LDS]) at columns [k0, k0 + BK) is 2 x 64 token rows of
// eight 16-byte chunks: a thread copies chunk (thread % 8) of token rows thread / 8 and thread / 8 + 32,
// both parts. Rows past the expert's tokens (ok false) and columns past the matrix are zero.
constexpr uint32_t kChunks = BK / 8;
static_assert(kThreads / kChunks * 2 == BN, "two token rows a thread");

struct ActRows {
  size_t off[2];  // the rows' offsets in xh and xl
  bool ok[2];
};

__device__ __forceinline__ void cp_async16(__half* dst, const __half* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
#else
  *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
#endif
}

__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n\tcp.async.wait_group 0;" ::: "memory");
#endif
}

// h_vec: the chunks straight into the tile (cp.async on sm80+; waited by cp_async_wait).
__device__ void copy_activations(const ActRows& r, const GemmArgs& a, uint32_t k0, __half* B) {
  const uint32_t cc = threadIdx.x % kChunks * 8, c = k0 + cc;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint32_t tok = threadIdx.x / kChunks + i * (BN / 2);
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      __half* dst = B + p * BN * LDS + tok * LDS + cc;
      if (r.ok[i] && c < a.cols) {
        cp_async16(dst, (p == 0 ? a.xh : a.xl) + r.off[i] + c);
      } else {
        *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
      }
    }
  }
}

// h_vec on sm70: the chunks into registers here, into the tile by store_activations.
__device__ void load_activations(const ActRows& r, const GemmArgs& a, uint32_t k0, uint4 (&v)[4]) {
  const uint32_t c = k0 + threadIdx.x % kChunks * 8;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      v[2 * i + p] = r.ok[i] && c < a.cols ? *reinterpret_cast<const uint4*>((p == 0 ? a.xh : a.xl) + r.off[i] + c)
                                           : make_uint4(0, 0, 0, 0);
    }
  }
}

__device__ void store_activations(const uint4 (&v)[4], __half* B) {
  const uint32_t cc = threadIdx.x % kChunks * 8;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint32_t tok = threadIdx.x / kChunks + i * (BN / 2);
#pragma unroll
    for (int p = 0; p < 2; ++p) *reinterpret_cast<uint4*>(B + p * BN * LDS + tok * LDS + cc) = v[2 * i + p];
  }
}

// Not h_vec (rows of a width not a multiple of 8, or unaligned parts): element by element, the
// same layout.
__device__ void copy_activations_scalar(const ActRows& r, const GemmArgs& a, uint32_t k0, __half* B) {
  const uint32_t cc = threadIdx.x % kChunks * 8;
  const __half zero = __float2half_rn(0.0f);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint32_t tok = threadIdx.x / kChunks + i * (BN / 2);
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      const __half* src = (p == 0 ? a.xh : a.xl) + r.off[i];
      __half* dst = B + p * BN * LDS + tok * LDS + cc;
#pragma unroll
      for (int j = 0; j < 8; ++j) dst[j] = r.ok[i] && k0 + cc + j < a.cols ? src[k0 + cc + j] : zero;
    }
  }
}

using Acc = wm::fragment<wm::accumulator, 16, 16, 16, float>;

// One k-tile's products of a warp: rows wr * 16 of each matrix's tiles in A ([NM][hi, lo][BM][LDS])
// times tokens wt * 32 of B ([hi, lo][BN][LDS]), the 16-token halves that are live.
template <int NM>
__device__ __forceinline__ void multiply_tile(Acc (&acc)[NM][2][2], const __half* A, const __half* B, uint32_t wr,
                                              uint32_t wt, const bool (&live)[2]) {
  if (!live[0]) return;
#pragma unroll
  for (uint32_t kk = 0; kk < BK; kk += 16) {
    wm::fragment<wm::matrix_b, 16, 16, 16, __half, wm::col_major> bh[2], bl[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      if (!live[j]) continue;
      wm::load_matrix_sync(bh[j], B + (wt * 32 + j * 16) * LDS + kk, LDS);
      wm::load_matrix_sync(bl[j], B + BN * LDS + (wt * 32 + j * 16) * LDS + kk, LDS);
    }
#pragma unroll
    for (int m = 0; m < NM; ++m) {
      wm::fragment<wm::matrix_a, 16, 16, 16, __half, wm::row_major> ah, al;
      wm::load_matrix_sync(ah, A + ((m * 2) * BM + wr * 16) * LDS + kk, LDS);
      wm::load_matrix_sync(al, A + ((m * 2 + 1) * BM + wr * 16) * LDS + kk, LDS);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        if (!live[j]) continue;
        wm::mma_sync(acc[m][0][j], ah, bh[j], acc[m][0][j]);
        wm::mma_sync(acc[m][1][j], ah, bl[j], acc[m][1][j]);
        wm::mma_sync(acc[m][1][j], al, bh[j], acc[m][1][j]);
      }
    }
  }
}

template <int T, int NM>
__global__ void __launch_bounds__(kThreads, 2) grouped_gemm_kernel(GemmArgs a) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ uint32_t grid[T == qd::kIQ3_S ? 512 : 1];
  __shared__ int8_t kvalues[16];
  const uint32_t tile = blockIdx.y;
  if (tile >= a.tiles[a.E]) return;  // the grid is sized for the most tiles the routes can make
  // The expert whose tiles hold this one: tiles[lo] <= tile < tiles[hi] throughout.
  uint32_t lo_e = 0, hi_e = a.E;
  while (hi_e - lo_e > 1) {
    const uint32_t mid = (lo_e + hi_e) / 2;
    if (a.tiles[mid] <= tile) {
      lo_e = mid;
    } else {
      hi_e = mid;
    }
  }
  const uint32_t e = lo_e;
  const uint32_t t0 = (tile - a.tiles[e]) * BN;
  const uint32_t first = a.offsets[e] + t0;
  const uint32_t ntok = min(BN, a.offsets[e + 1] - a.offsets[e] - t0);
  const uint32_t m0 = blockIdx.x * BM;
  if constexpr (T == qd::kIQ3_S) {
    for (uint32_t i = threadIdx.x; i < 512; i += kThreads) grid[i] = a.iq3s_grid[i];
  }
  if constexpr (T == qd::kIQ4_XS) {
    if (threadIdx.x < 16) kvalues[threadIdx.x] = a.iq4nl[threadIdx.x];
  }
  if constexpr (T == qd::kIQ3_S || T == qd::kIQ4_XS) __syncthreads();  // the tables before any decode
  const uint8_t* w[NM];
#pragma unroll
  for (int m = 0; m < NM; ++m) w[m] = a.table[m] != nullptr ? a.table[m][e] : a.base[m] + e * a.stride[m];
  ActRows xr;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint32_t tok = threadIdx.x / kChunks + i * (BN / 2);
    xr.ok[i] = tok < ntok;
    const size_t row = !xr.ok[i] ? 0 : a.gather != nullptr ? static_cast<size_t>(a.gather[first + tok]) : first + tok;
    xr.off[i] = row * a.ldh;
  }

  // With kAsyncCopy and w_double, two weight buffers: the weights of k-tile `it` are in buffer it % 2,
  // decoded after the previous tile's products in each warp's order (the tensor cores work on those
  // while it decodes), and one barrier a k-tile suffices. One projection only (down): with gate and up the
  // second loop beside the first spills ~35 registers a thread.
  const bool w2 = NM == 1 && kAsyncCopy && a.w_double;
  constexpr uint32_t kA = NM * 2 * BM * LDS, kB = 2 * BN * LDS;  // halves of a weight and an activation buffer
  __half* As = reinterpret_cast<__half*>(smem);  // [buffer][NM][hi, lo][BM][LDS]
  __half* Bs = As + (w2 ? 2 : 1) * kA;           // [buffer][hi, lo][BN][LDS]: 2 buffers with kAsyncCopy
  const uint32_t warp = threadIdx.x / 32, wr = warp % 4, wt = warp / 4;  // 16 rows x 32 tokens a warp
  // A warp multiplies only the 16-token halves that hold tokens (the same for all its lanes): an
  // expert's last tile is often a few rows (~57 rows an expert: one in seven spills into a second).
  const bool live[2] = {wt * 32 < ntok, wt * 32 + 16 < ntok};
  Acc acc[NM][2][2];  // [matrix][hi, lo][token half]
#pragma unroll
  for (int m = 0; m < NM; ++m) {
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      wm::fill_fragment(acc[m][p][0], 0.0f);
      wm::fill_fragment(acc[m][p][1], 0.0f);
    }
  }
  // The activations of k-tile `it` are in buffer it % 2 with kAsyncCopy, else in the one buffer. With
  // kAsyncCopy the next tile's copy goes to the other buffer, whose products ended at the previous
  // barrier; without, it waits in registers (or, not h_vec, is copied) past this tile's last barrier.
  uint4 xv[4];
  if (kAsyncCopy || !a.h_vec) {
    if (a.h_vec) {
      copy_activations(xr, a, 0, Bs);
    } else {
      copy_activations_scalar(xr, a, 0, Bs);
    }
  } else {
    load_activations(xr, a, 0, xv);
  }
  if (w2) {
    if (BK < a.cols) prefetch_weights<NM>(w, a, m0, BK);
    load_weights<T, NM>(w, a, m0, 0, As, grid, kvalues);
    if (a.h_vec) cp_async_wait();
    __syncthreads();
    uint32_t it = 0;
    for (uint32_t k0 = 0; k0 < a.cols; k0 += BK, ++it) {
      const uint32_t b = it % 2;
      const bool next = k0 + BK < a.cols;
      if (next) {  // into the buffers whose products ended at the last barrier
        if (a.h_vec) {
          copy_activations(xr, a, k0 + BK, Bs + (1 - b) * kB);
        } else {
          copy_activations_scalar(xr, a, k0 + BK, Bs + (1 - b) * kB);
        }
        if (k0 + 2 * BK < a.cols) prefetch_weights<NM>(w, a, m0, k0 + 2 * BK);
      }
      multiply_tile<NM>(acc, As + b * kA, Bs + b * kB, wr, wt, live);
      if (next) load_weights<T, NM>(w, a, m0, k0 + BK, As + (1 - b) * kA, grid, kvalues);
      if (a.h_vec) cp_async_wait();
      __syncthreads();
    }
  }
  uint32_t it = 0;
  for (uint32_t k0 = 0; !w2 && k0 < a.cols; k0 += BK, ++it) {
    __half* B = Bs + (kAsyncCopy ? (it % 2) * kB : 0);
    if (!kAsyncCopy && a.h_vec) store_activations(xv, B);
    load_weights<T, NM>(w, a, m0, k0, As, grid, kvalues);
    if (kAsyncCopy && a.h_vec) cp_async_wait();
    __syncthreads();
    if (k0 + BK < a.cols) {  // the next k-tile's loads run beside this one's products
      if (kAsyncCopy) {
        __half* next = Bs + ((it + 1) % 2) * kB;
        if (a.h_vec) {
          copy_activations(xr, a, k0 + BK, next);
        } else {
          copy_activations_scalar(xr, a, k0 + BK, next);
        }
      } else if (a.h_vec) {
        load_activations(xr, a, k0 + BK, xv);
      }
      prefetch_weights<NM>(w, a, m0, k0 + BK);
    }
    multiply_tile<NM>(acc, As, B, wr, wt, live);
    __syncthreads();
    if (!kAsyncCopy && !a.h_vec && k0 + BK < a.cols) copy_activations_scalar(xr, a, k0 + BK, Bs);
  }

  // hi + lo / 2^12 (fragments of one shape share their element layout), through shared memory to
  // the tile's valid rows and tokens.
  float* Cs = reinterpret_cast<float*>(smem);  // [NM][BN][LDC]
#pragma unroll
  for (int m = 0; m < NM; ++m) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      for (int t = 0; t < acc[m][0][j].num_elements; ++t) acc[m][0][j].x[t] += acc[m][1][j].x[t] * (1.0f / kHalfLoScale);
      wm::store_matrix_sync(Cs + m * BN * LDC + (wt * 32 + j * 16) * LDC + wr * 16, acc[m][0][j], LDC,
                            wm::mem_col_major);
    }
  }
  __syncthreads();
  for (uint32_t i = threadIdx.x; i < BM * BN; i += kThreads) {
    const uint32_t tok = i / BM, r = i % BM;
    if (tok >= ntok || m0 + r >= a.rows) continue;
    float v = Cs[tok * LDC + r];
    if constexpr (NM == 2) {
      // swiglu_kernel's arithmetic (gpu/ops.cu), on the same f32 products.
      const float g = fminf(v, a.limit);
      const float u = fminf(fmaxf(Cs[BN * LDC + tok * LDC + r], -a.limit), a.limit);
      v = g / (1.0f + expf(-g)) * u;
    }
    a.y[static_cast<size_t>(first + tok) * a.ldy + m0 + r] = v;
  }
}

// One block: counts by shared atomics, the offsets and tile starts by a scan of the block (a thread
// an expert), then each route's sorted row by a second pass. A thread loads kSortIds of its ids at
// once in each pass, so that the block waits on memory once a pass, not once an id.
constexpr uint32_t kSortThreads = 1024, kSortIds = 16;
static_assert(kMaxGroupedExperts <= kSortThreads, "sort_routes scans one expert a thread");

// The ids of pass `base` that this thread takes (-1 past the routes).
__device__ __forceinline__ void load_ids(const int32_t* ids, uint32_t routes, uint32_t base, int32_t (&id)[kSortIds]) {
#pragma unroll
  for (uint32_t j = 0; j < kSortIds; ++j) {
    const uint32_t i = base + j * kSortThreads + threadIdx.x;
    id[j] = i < routes ? ids[i] : -1;
  }
}

__global__ void __launch_bounds__(kSortThreads) sort_routes_kernel(const int32_t* ids, uint32_t routes, uint32_t k,
                                                                   uint32_t E, RouteSort out, RouteTally tally) {
  __shared__ uint32_t count[kMaxGroupedExperts], fill[kMaxGroupedExperts], sums[2][33];
  const uint32_t e = threadIdx.x;
  if (e < E) count[e] = 0;
  __syncthreads();
  for (uint32_t base = 0; base < routes; base += kSortThreads * kSortIds) {
    int32_t id[kSortIds];
    load_ids(ids, routes, base, id);
#pragma unroll
    for (uint32_t j = 0; j < kSortIds; ++j) {
      if (id[j] >= 0) atomicAdd(&count[id[j]], 1u);
    }
  }
  __syncthreads();
  const uint32_t c = e < E ? count[e] : 0, t = (c + BN - 1) / BN;
  uint32_t routes_total = 0, tiles_total = 0;
  const uint32_t o = block_exclusive_sum(c, sums[0], routes_total);
  const uint32_t first_tile = block_exclusive_sum(t, sums[1], tiles_total);
  if (e < E) {
    out.offsets[e] = o;
    out.tiles[e] = first_tile;
    fill[e] = o;
  }
  if (e == 0) {
    out.offsets[E] = routes_total;
    out.tiles[E] = tiles_total;
  }
  __syncthreads();
  for (uint32_t base = 0; base < routes; base += kSortThreads * kSortIds) {
    int32_t id[kSortIds];
    load_ids(ids, routes, base, id);
#pragma unroll
    for (uint32_t j = 0; j < kSortIds; ++j) {
      if (id[j] < 0) continue;
      const uint32_t i = base + j * kSortThreads + threadIdx.x;
      const uint32_t at = atomicAdd(&fill[id[j]], 1u);
      out.gather[at] = static_cast<int32_t>(i / k);
      out.where[i] = static_cast<int32_t>(at);
    }
  }
  if (tally.counters != nullptr && c > 0) {
    const uint32_t cat = tally.category[e];
    atomicAdd(tally.counters + cat, static_cast<unsigned long long>(c));
    if (cat > 0) atomicAdd(tally.counters + 2 + cat, static_cast<unsigned long long>(tally.expert_bytes));
  }
}

template <int T, int NM>
void launch(const GemmArgs& a, uint32_t row_tiles, uint32_t max_tiles, cudaStream_t s) {
  // Two activation buffers on devices whose code has kAsyncCopy (sm80+), one on sm70; for one
  // projection two weight buffers there too where two blocks of them still share an SM, else one.
  int dev = 0, major = 0, per_sm = 0, optin = 0, reserved = 0;
  FERRY_CUDA(cudaGetDevice(&dev));
  FERRY_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  FERRY_CUDA(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
  FERRY_CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  FERRY_CUDA(cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev));
  cudaFuncAttributes fa{};
  FERRY_CUDA(cudaFuncGetAttributes(&fa, grouped_gemm_kernel<T, NM>));
  const uint32_t act_buffers = major >= 8 ? 2 : 1;
  const size_t two = smem_bytes<NM>(2, act_buffers);
  GemmArgs args = a;
  args.w_double = NM == 1 && major >= 8 && two <= static_cast<size_t>(optin) &&
                  2 * (two + fa.sharedSizeBytes + static_cast<size_t>(reserved)) <= static_cast<size_t>(per_sm);
  const size_t smem = args.w_double ? two : smem_bytes<NM>(1, act_buffers);
  FERRY_CUDA(cudaFuncSetAttribute(grouped_gemm_kernel<T, NM>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(smem)));
  grouped_gemm_kernel<T, NM><<<dim3(row_tiles, max_tiles), kThreads, smem, s>>>(args);
}

template <int NM>
void dispatch(int type, const GemmArgs& a, uint32_t row_tiles, uint32_t max_tiles, cudaStream_t s) {
  switch (type) {
    case qd::kF32: launch<qd::kF32, NM>(a, row_tiles, max_tiles, s); break;
    case qd::kF32Scalar: launch<qd::kF32Scalar, NM>(a, row_tiles, max_tiles, s); break;
    case qd::kF16: launch<qd::kF16, NM>(a, row_tiles, max_tiles, s); break;
    case qd::kBF16: launch<qd::kBF16, NM>(a, row_tiles, max_tiles, s); break;
    case qd::kQ8_0: launch<qd::kQ8_0, NM>(a, row_tiles, max_tiles, s); break;
    case qd::kQ4_K: launch<qd::kQ4_K, NM>(a, row_tiles, max_tiles, s); break;
    case qd::kQ5_K: launch<qd::kQ5_K, NM>(a, row_tiles, max_tiles, s); break;
    case qd::kQ6_K: launch<qd::kQ6_K, NM>(a, row_tiles, max_tiles, s); break;
    case qd::kIQ4_XS: launch<qd::kIQ4_XS, NM>(a, row_tiles, max_tiles, s); break;
    case qd::kIQ3_S: launch<qd::kIQ3_S, NM>(a, row_tiles, max_tiles, s); break;
    default: throw CudaError("grouped expert GEMM: the CUDA backend cannot read weights of ggml type " + std::to_string(type));
  }
}

// The kernel family of `m` (as matvec.cu's kernel_type: f32 rows not a multiple of 8 read by element).
int family(const DevMatrix& m) {
  const int t = static_cast<int>(m.type);
  if (t == qd::kF32 && m.cols % 8 != 0) return qd::kF32Scalar;
  if ((t == qd::kF16 || t == qd::kBF16) && m.cols % 8 != 0) {
    throw CudaError("f16/bf16 matrix rows of " + std::to_string(m.cols) + " elements are not a multiple of 8");
  }
  return t;
}

bool same_layout(const DevMatrix& a, const DevMatrix& b) {
  return a.type == b.type && a.rows == b.rows && a.cols == b.cols && a.row_bytes == b.row_bytes;
}

// The products of grouped_gemm on inputs split already (xh, xl: rows of w.m.cols halves).
void run_products(const ExpertMatrices& w, const ExpertMatrices* up, const __half* xh, const __half* xl,
                  const int32_t* gather, const RouteSort& sort, uint32_t routes, uint32_t E, float limit, float* y,
                  size_t ldy, float* up_scratch, cudaStream_t stream) {
  if (up != nullptr && !same_layout(w.m, up->m)) {
    if (up_scratch == nullptr) throw CudaError("grouped_gemm: gate and up differ and no scratch for up");
    run_products(w, nullptr, xh, xl, gather, sort, routes, E, limit, y, ldy, nullptr, stream);
    run_products(*up, nullptr, xh, xl, gather, sort, routes, E, limit, up_scratch, ldy, nullptr, stream);
    swiglu(y, up_scratch, ldy, routes, w.m.rows, limit, stream);
    return;
  }
  if (w.table == nullptr && w.m.data == nullptr) throw CudaError("grouped_gemm: no expert weights");
  GemmArgs a{};
  a.base[0] = w.m.data;
  a.stride[0] = w.stride;
  a.table[0] = w.table;
  if (up != nullptr) {
    a.base[1] = up->m.data;
    a.stride[1] = up->stride;
    a.table[1] = up->table;
  }
  a.rows = w.m.rows;
  a.cols = w.m.cols;
  a.row_bytes = w.m.row_bytes;
  a.xh = xh;
  a.xl = xl;
  a.ldh = w.m.cols;
  a.h_vec = reinterpret_cast<uintptr_t>(xh) % 16 == 0 && reinterpret_cast<uintptr_t>(xl) % 16 == 0 && a.ldh % 8 == 0;
  a.gather = gather;
  a.offsets = sort.offsets;
  a.tiles = sort.tiles;
  a.E = E;
  a.y = y;
  a.ldy = ldy;
  a.limit = limit;
  const int t = family(w.m);
  if (t == qd::kIQ3_S) a.iq3s_grid = iq3s_grid_address();
  std::copy(model::kIq4nlValues, model::kIq4nlValues + 16, a.iq4nl);
  // Each expert with c rows makes ceil(c / BN) tiles: at most routes / BN + one per used expert.
  const size_t max_tiles = (size_t{routes} + BN - 1) / BN + std::min(E, routes);
  const size_t row_tiles = (size_t{w.m.rows} + BM - 1) / BM;
  if (max_tiles > 65535 || row_tiles > 0x7fffffffu) {
    throw CudaError("grouped_gemm: " + std::to_string(routes) + " routes over " + std::to_string(w.m.rows) +
                    " rows make too large a grid");
  }
  if (up != nullptr) {
    dispatch<2>(t, a, static_cast<uint32_t>(row_tiles), static_cast<uint32_t>(max_tiles), stream);
  } else {
    dispatch<1>(t, a, static_cast<uint32_t>(row_tiles), static_cast<uint32_t>(max_tiles), stream);
  }
  FERRY_CUDA_LAUNCHED();
}

}  // namespace

void sort_routes(const int32_t* ids, uint32_t routes, uint32_t k, uint32_t E, const RouteSort& out,
                 const RouteTally& tally, cudaStream_t stream) {
  if (E == 0 || E > kMaxGroupedExperts) {
    throw CudaError("sort_routes: " + std::to_string(E) + " experts (1 to " + std::to_string(kMaxGroupedExperts) +
                    " supported)");
  }
  if (k == 0) throw CudaError("sort_routes: no experts per row");
  sort_routes_kernel<<<1, kSortThreads, 0, stream>>>(ids, routes, k, E, out, tally);
  FERRY_CUDA_LAUNCHED();
}

void grouped_gemm(const ExpertMatrices& w, const ExpertMatrices* up, const float* x, size_t ldx, uint32_t x_rows,
                  const int32_t* gather, const RouteSort& sort, uint32_t routes, uint32_t E, float limit, float* y,
                  size_t ldy, float* up_scratch, const SplitScratch& split, cudaStream_t stream,
                  GroupedPath path) {
  if (routes == 0 || w.m.rows == 0) return;
  const uint32_t cols = w.m.cols;
  if (up != nullptr && up->m.cols != cols) {
    throw CudaError("grouped_gemm: gate reads " + std::to_string(cols) + " columns, up " + std::to_string(up->m.cols));
  }
  if (gather == nullptr && x_rows < routes) {
    throw CudaError("grouped_gemm: " + std::to_string(routes) + " routes read rows of an input of " +
                    std::to_string(x_rows));
  }
  const size_t need = size_t{x_rows} * cols;
  if (split.hi == nullptr || split.lo == nullptr || need > split.elems) {
    throw CudaError("grouped_gemm: splitting " + std::to_string(x_rows) + " input rows of " + std::to_string(cols) +
                    " columns needs " + std::to_string(need) + " halves a part; the scratch holds " +
                    std::to_string(split.hi == nullptr || split.lo == nullptr ? 0 : split.elems));
  }
  if (x_rows == 0) return;
  if (path == GroupedPath::best && grouped_int8_takes(w, up, x, ldx, x_rows, split)) {
    grouped_gemm_int8(w, up, x, ldx, x_rows, gather, sort, routes, E, limit, y, ldy, split, stream);
    return;
  }
  __half* hi = static_cast<__half*>(split.hi);
  __half* lo = static_cast<__half*>(split.lo);
  float_to_half(x, ldx, x_rows, cols, hi, stream, lo);
  run_products(w, up, hi, lo, gather, sort, routes, E, limit, y, ldy, up_scratch, stream);
}

}  // namespace ferry::gpu
