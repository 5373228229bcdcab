// The grouped expert GEMMs on Hopper's fp16 warpgroup MMA over exact integer weights for Q4_K, Q5_K and
// IQ3_S (gpu/moe_grouped_f16.hpp says what and why). Built for sm_90a alone (gpu/CMakeLists.txt).
//
// First a pass quantizes each input row as the decode matvec does (int16 values, a step per 32) and
// writes each value times its step, scaled by a power of two that brings the row's largest |x| into
// [2^11, 2^12), as an fp16 high part (xh) and the rest (xl); per 32 values the f32 sum of x (the
// K-quant minimum terms) under the same power of two, and per row that power's inverse. Within each
// 16 columns the values lie even columns first, then odd: the order in which a lane's weight bytes
// give its fp16 pairs (below).
//
// A block: warpgroups of 64 weight rows each (gate and up: 32 of each, whose SwiGLU is then taken in
// registers) x every live token of a tile of 64 sorted rows, k-tiles of 128 columns copied by cp.async
// into a ring of stages, the tokens' parts laid out as the core matrices of wgmma's B operand. Per
// 32-column sub-block a warp makes its A fragments from its rows' quant bytes, turned into fp16 by a
// mask and the bits of 1024 (or 1152 for IQ3_S's signed bytes) and one HFMA2 with the sub-block's
// scale (exact: scale * q is a small integer), then the warpgroup issues 4 products m64nNk16 (the two
// k16 halves against the high and the low parts) while it makes the next sub-block's A. A 256-column
// block's sums stay in the accumulators, as the rows' sums over the block's d (times 1 / d before it,
// d after it), and the minimum terms (dmin * min_j * sum_j(x)) are a tf32 mma.sync product a block.
#include "gpu/moe_grouped_f16.hpp"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "gpu/block_reduce.cuh"
#include "gpu/cuda_check.hpp"
#include "gpu/mma_f16.cuh"
#include "gpu/mma_int8.cuh"
#include "gpu/moe_grouped_f16_tile.cuh"
#include "gpu/pdl.hpp"
#include "gpu/quant_device.cuh"
#include "gpu/swiglu.cuh"
#include "gpu/x_int16.cuh"
#include "model/formats/ggml_type.hpp"

namespace ferry::gpu {
namespace {

using namespace grouped_f16;


// One row's 16-value piece as int16 values two a word (x16_pack's), in the order the products take them
// (even columns, then odd): words 0..3 columns (0, 2), (4, 6).., words 4..7 (1, 3), (5, 7)..
__device__ __forceinline__ void even_first(const uint32_t (&packed)[8], uint32_t (&w)[8]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    w[j] = __byte_perm(packed[2 * j], packed[2 * j + 1], 0x5410);
    w[4 + j] = __byte_perm(packed[2 * j], packed[2 * j + 1], 0x7632);
  }
}

// A block a row: the row's largest |x| first (its power of two), then each thread's 16-value
// pieces as quantize_rows_kernel of the int8 path makes them, written as split_pair's parts (or, Cvt,
// as the int16 words and each 32 values' step times the power of two, which the loader splits).
template <bool Cvt>
__global__ void __launch_bounds__(256) quantize_rows_f16_kernel(const float* x, size_t ldx, uint32_t cols, __half* xh,
                                                                __half* xl, float* xs, float* xp, uint32_t* xq,
                                                                float* xstep) {
  __shared__ float scratch[32];
  const uint32_t r = blockIdx.x, pieces = cols / 16;
  const float* row = x + static_cast<size_t>(r) * ldx;
  float amax = 0.0f;
  for (uint32_t p = threadIdx.x; p < pieces; p += blockDim.x) {
    const float4* src = reinterpret_cast<const float4*>(row + 16 * p);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float4 f = src[k];
      amax = fmaxf(amax, fmaxf(fmaxf(fabsf(f.x), fabsf(f.y)), fmaxf(fabsf(f.z), fabsf(f.w))));
    }
  }
  const float rmax = block_max(amax, scratch);
  int e = 0;
  frexpf(rmax, &e);
  const int se = rmax > 0.0f ? min(kRowExp - e, 126) : 0;
  const float scale = ldexpf(1.0f, se);
  if (threadIdx.x == 0) xp[r] = ldexpf(1.0f, -se);
  for (uint32_t p0 = 0; p0 < pieces; p0 += blockDim.x) {
    const uint32_t p = p0 + threadIdx.x;
    const bool valid = p < pieces;  // pieces are a multiple of 16: a pair (p even, p + 1) is valid together
    float v[16];
    float a16 = 0.0f, sum = 0.0f;
    if (valid) {
      const float4* src = reinterpret_cast<const float4*>(row + 16 * p);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float4 f = src[k];
        v[4 * k] = f.x, v[4 * k + 1] = f.y, v[4 * k + 2] = f.z, v[4 * k + 3] = f.w;
      }
      x16_stats(v, a16, sum);
    }
    const float a32 = x32_amax(a16);
    const float sum32 = sum + __shfl_xor_sync(0xffffffffu, sum, 1);
    if (!valid) continue;
    uint32_t packed[8], w[8];
    x16_pack(v, a32, packed);
    even_first(packed, w);
    const float step = x32_scale(a32) * scale;
    const size_t at = static_cast<size_t>(r) * cols + 16 * p;
    if constexpr (Cvt) {
      uint4* dq = reinterpret_cast<uint4*>(xq + at / 2);
      dq[0] = make_uint4(w[0], w[1], w[2], w[3]);
      dq[1] = make_uint4(w[4], w[5], w[6], w[7]);
      if (p % 2 == 0) xstep[static_cast<size_t>(r) * (cols / 32) + p / 2] = step;
    } else {
      uint32_t hi[8], lo[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) split_pair(w[k], step, hi[k], lo[k]);
      uint4* dh = reinterpret_cast<uint4*>(xh + at);
      uint4* dl = reinterpret_cast<uint4*>(xl + at);
      dh[0] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
      dh[1] = make_uint4(hi[4], hi[5], hi[6], hi[7]);
      dl[0] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
      dl[1] = make_uint4(lo[4], lo[5], lo[6], lo[7]);
    }
    if (p % 2 == 0) xs[static_cast<size_t>(r) * (cols / 32) + p / 2] = sum32 * scale;
  }
}

// A warp's part of the block's tile: warpgroup wg takes 64 weight rows x every live token of the tile
// (N = 8 x live in its products). With gate and up (NM 2) the warp's fragment rows g are gate rows
// 32 wg + 8 w + g and rows g + 8 the same rows of up, so SwiGLU stays in registers; one matrix, rows
// 64 wg + 16 w.. rows[r]: the local row (0..127) of fragment rows 8r..; acc[4n + k] is row g (k 0, 1)
// or g + 8 (k 2, 3) for tokens 8n + 2q + k % 2.
struct WgTile {
  uint32_t g, q, rows[2];
  __device__ uint32_t row(int r) const { return rows[r] + g; }
};

template <int NM, uint32_t BR>
__device__ __forceinline__ WgTile wg_tile() {
  const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = warp / 4, wr = warp % 4;
  WgTile t;
  t.g = lane / 4;
  t.q = lane % 4;
  t.rows[0] = NM == 2 ? 32 * wg + 8 * wr : 64 * wg + 16 * wr;
  t.rows[1] = NM == 2 ? BR / 2 + t.rows[0] : t.rows[0] + 8;
  return t;
}

// The warp's words of its 16 fragment rows, 16-byte chunks at words `word` (registers 0, 1: rows g,
// g + 8, word q) and `word` + 4 (2, 3), by ldmatrix: lane l gives fragment row l % 8 (+ 8 for odd
// l / 8) of chunk l / 16.
template <uint32_t kWWords>
__device__ __forceinline__ void load_a_rows(uint32_t (&r)[4], const uint32_t* w, const WgTile& t, uint32_t word) {
  const uint32_t lane = threadIdx.x % 32;
  mma::ldmatrix_x4(r, w + (t.rows[lane / 8 % 2] + lane % 8) * kWWords + word + 4 * (lane / 16));
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Bytes 0 and 2 of w (the caller shifts for 1 and 3), masked, XORed with `bits` (KQuant::kBits): fp16
// bias + their value, then * scale + offset (-bias * scale): the exact integer scale * value.
__device__ __forceinline__ uint32_t decode_pair(uint32_t w, uint32_t mask, uint32_t bits, uint32_t scale,
                                                uint32_t offset) {
  const uint32_t v = (w & mask) ^ bits;
  return mma::half2_bits(__hfma2(mma::bits_half2(v), mma::bits_half2(scale), mma::bits_half2(offset)));
}

// The A fragment of a k16 half of a sub-block from the words of its values (r[0], r[1]: fragment rows
// g, g + 8, the half's columns 4q..4q + 3), each byte's value masked: registers 0 / 1 are bytes 0 and 2
// of rows g / g + 8 (logical k 2q, 2q + 1: columns 4q, 4q + 2), 2 / 3 bytes 1 and 3 (logical k 8 + 2q..:
// columns 4q + 1, 4q + 3), the order the inputs are written in (even columns, then odd); f: rows g
// and g + 8's scale and offset.
__device__ __forceinline__ void decode_a(const uint32_t (&r)[2], uint32_t mask, uint32_t bits, const uint2 (&f)[2],
                                         uint32_t (&A)[4]) {
#pragma unroll
  for (int row = 0; row < 2; ++row) {
    A[row] = decode_pair(r[row], mask, bits, f[row].x, f[row].y);
    A[2 + row] = decode_pair(r[row] >> 8, mask, bits, f[row].x, f[row].y);
  }
}

// Fragment rows g and g + 8's scale and offset of a sub-block.
template <int T, class S>
__device__ __forceinline__ void factors(const S& s, uint32_t step, const WgTile& t, uint2 (&f)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if constexpr (KQuant<T>::kDecoded) {
      const uint32_t scale = s.wf[step][t.row(r)];
      f[r] = make_uint2(scale, mma::half2_bits(__hmul2(mma::bits_half2(scale), __float2half2_rn(-KQuant<T>::kBias))));
    } else {
      f[r] = s.wf[step][t.row(r)];
    }
  }
}
#endif

// Each row's sums times its s.dk (1 / d of the 256-column block before its even k-tile, d after its
// odd one), so that the block's products accumulate onto the rows' sums over d.
template <int NL>
__device__ __forceinline__ void rescale(const float* dk, const WgTile& t, float (&acc)[4 * NL]) {
  const float f[2] = {dk[t.row(0)], dk[t.row(1)]};
#pragma unroll
  for (int i = 0; i < 4 * NL; ++i) acc[i] *= f[i % 4 / 2];
}

// The K-quants' minimum terms of a 256-column block, sum_j min_j * sum_j(x) over its 8 sub-blocks (two
// tf32 m16n8k4 k-steps), on tensor cores: the 6-bit mins are exact in tf32, each f32 sum is split into
// a tf32 head and the rest, and dmin / d times the result is taken off the rows' sums over d in f32:
// one FFMA an output a block.
template <int NL, class S>
__device__ __forceinline__ void minimum_terms(const S& s, const WgTile& t, float (&acc)[4 * NL]) {
  const uint32_t g = t.g, q = t.q;
  uint32_t am[2][2];
  float dmin[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    dmin[r] = s.dmin[t.row(r)];
#pragma unroll
    for (int h = 0; h < 2; ++h) am[h][r] = __float_as_uint(static_cast<float>(s.wm[4 * h + q][t.row(r)]));
  }
#pragma unroll
  for (int n = 0; n < NL; ++n) {
    uint32_t m[4] = {0, 0, 0, 0};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float sx = s.xs[4 * h + q][8 * n + g];
      const uint32_t head = __float_as_uint(sx) & 0xffffe000u;
      const uint32_t rest = __float_as_uint(sx - __uint_as_float(head));
      uint32_t part[4];
      mma::mma_tf32_k4(part, am[h], rest, m);
      mma::mma_tf32_k4(m, am[h], head, part);
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) acc[4 * n + k] = fmaf(-dmin[k / 2], __uint_as_float(m[k]), acc[4 * n + k]);
  }
}

// One k-tile's products of a warpgroup with NL live 8-token tiles (k-tile kt, in s) onto acc, the rows'
// sums over d of the 256-column block (rescale): a block's products accumulate inside the tensor
// cores, and its d costs two multiplications an output, not one a sub-block. Per sub-block one group
// of 4 products (its two k16 halves against the inputs' high and low parts), A made in registers while
// the group before runs. The k-tile's products are done when this returns, but with Lag 1 those of an
// even k-tile: its last group runs on into the next k-tile, whose first wait retires it (A's two sets
// alternate across k-tiles too: kSteps is even).
template <int T, int NL, int Lag, uint32_t Parity, class S>
__device__ __forceinline__ void multiply(const S& s, const WgTile& t, float (&acc)[4 * NL]) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr uint32_t kt = Parity;  // the k-tile's parity is all its products ask of it
  using K = KQuant<T>;
  constexpr uint32_t kWWords = K::kWWords;
  if (kt % 2 == 0) rescale<NL>(s.dk, t, acc);
  // B of k16 step j: chunks 2j, 2j + 1 (high parts) or 16 + 2j.. (low), 128 bytes apart along k, the
  // 8-token tiles 4 KiB apart.
  const uint64_t desc = mma::smem_desc(s.x, 128, 4 * kXTileWords);
  uint32_t high[4];
  if constexpr (K::kHighBits) {  // the fifth bits of the k-tile's columns: words 16 + q and 20 + q
    load_a_rows<kWWords>(high, s.w, t, 16);
#pragma unroll
    for (int k = 0; k < 4; ++k) high[k] >>= 4 * (kt % 2);
  }
  uint32_t A[2][2][4];  // [sub-block parity][k16 half]
  uint32_t raw[4];
#pragma unroll
  for (uint32_t step = 0; step < kSteps; ++step) {
    if constexpr (K::kDecoded) {  // int8 values in column order: words 8 * step + q and + 4
      load_a_rows<kWWords>(raw, s.w, t, 8 * step);
    } else if (step % 2 == 0) {  // the sub-blocks of 64 columns share their bytes
      load_a_rows<kWWords>(raw, s.w, t, 4 * step);
    }
    uint2 f[2];
    factors<T>(s, step, t, f);
    uint32_t (&a)[2][4] = A[step % 2];
#pragma unroll
    for (int m = 0; m < 2; ++m) {  // the sub-block's k16 halves
      const uint32_t r[2] = {raw[2 * m], raw[2 * m + 1]};
      if constexpr (K::kHighBits) {
        uint32_t u[2];
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          u[k] = ((r[k] >> (4 * (step % 2))) & 0x0f0f0f0fu) | ((high[2 * m + k] << (4 - step)) & 0x10101010u);
        }
        decode_a(u, 0x001f001fu, K::kBits, f, a[m]);
      } else if constexpr (K::kDecoded) {
        decode_a(r, 0x00ff00ffu, K::kBits, f, a[m]);
      } else {  // Q4_K's high nibbles as they lie: 1024 + 16 n (store_factors' scale / 16)
        decode_a(r, step % 2 == 0 ? 0x000f000fu : 0x00f000f0u, K::kBits, f, a[m]);
      }
    }
    mma::wgmma_fence();
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      const uint32_t j = 2 * step + m;
      mma::wgmma_f16<8 * NL>(acc, a[m], desc + 8 * (2 * j));
      mma::wgmma_f16<8 * NL>(acc, a[m], desc + 8 * (16 + 2 * j));
    }
    mma::wgmma_commit();
    if (step + 1 < kSteps || (Lag == 1 && kt % 2 == 0)) {
      mma::wgmma_wait<1>();  // the group before: its A registers are free for the next sub-block
    } else {
      mma::wgmma_wait<0>();
    }
    // Both sets: each stays live up to the wait that retires its group.
#pragma unroll
    for (int p = 0; p < 2; ++p) {
#pragma unroll
      for (int m = 0; m < 2; ++m) {
#pragma unroll
        for (int k = 0; k < 4; ++k) mma::fence_operand(A[p][m][k]);
      }
    }
  }
  if (kt % 2 == 1 || Lag == 0) {
#pragma unroll
    for (int i = 0; i < 4 * NL; ++i) mma::fence_operand(acc[i]);
  }
  if (kt % 2 == 1) {
    if constexpr (!K::kDecoded) minimum_terms<NL>(s, t, acc);
    rescale<NL>(s.dk, t, acc);
  }
#else
  (void)s, (void)t, (void)acc;
  __trap();
#endif
}

// The warp's outputs of the tile's tokens (NM 2: SwiGLU of its gate and up rows), each token's times
// its row's xp.
template <int NM, int NL>
__device__ __forceinline__ void store_outputs(const F16Args& a, const BlockTile& bt, const WgTile& t,
                                              const float (&acc)[4 * NL]) {
#pragma unroll
  for (int n = 0; n < NL; ++n) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t tok = 8 * n + 2 * t.q + k % 2;
      if (tok >= bt.ntok || (NM == 2 && k >= 2)) continue;
      const uint32_t src = a.gather != nullptr ? static_cast<uint32_t>(a.gather[bt.first + tok]) : bt.first + tok;
      const float p = a.xp[src];
      float* yt = a.y + static_cast<size_t>(bt.first + tok) * a.ldy;
      const uint32_t row = bt.m0 + t.row(k / 2);
      if (row >= a.rows) continue;
      yt[row] = NM == 2 ? swiglu_value(acc[4 * n + k] * p, acc[4 * n + k + 2] * p, a.limit) : acc[4 * n + k] * p;
    }
  }
}

// The block's k-tiles with NL live 8-token tiles: k-tile kt's copies and factors in buffer kt % Stages,
// the copies P = Stages - 1 - Lag k-tiles ahead of the products, one group a k-tile (empty past the
// last); one barrier a k-tile: after it kt's copies (waited for and fenced for the products'
// asynchronous reads) and factors are seen by every warp, and every warpgroup's products of kt - 1 -
// Lag are done, whose buffer k-tile kt + P's copies then take.
template <int T, int NM, class C, int NL>
__device__ __forceinline__ void k_loop(const F16Args& a, TileLoader<T, NM, C>& ld, Stage<T, C::BR>* st,
                                       const uint32_t* grid, const BlockTile& bt) {
  constexpr int kP = C::kStages - 1 - C::kLag;
  const WgTile wt = wg_tile<NM, C::BR>();
  float acc[4 * NL];
#pragma unroll
  for (int i = 0; i < 4 * NL; ++i) acc[i] = 0.0f;
  const uint32_t ktiles = a.cols / BK;
  ld.load_headers(0);
#pragma unroll
  for (int j = 0; j < kP; ++j) {
    if (static_cast<uint32_t>(j) < ktiles) {
      ld.issue(a, j, st[j]);
      if constexpr (C::kCvt) {
        ld.load_x(a, j);
        ld.store_x(st[j]);
      }
    } else {
      cp_commit();
    }
  }
  // A 256-column block (two k-tiles) an iteration, one stretch of code: with Lag 1 an even k-tile's
  // last products, in flight past the barrier, stay within the loop's body (across its back edge
  // ptxas serialises them).
  for (uint32_t kb = 0; kb < ktiles; kb += 2) {
#pragma unroll
    for (uint32_t h = 0; h < 2; ++h) {
      const uint32_t kt = kb + h, b = kt % C::kStages;
      ld.store_factors(kt, st[b], grid);
      cp_wait<kP - 1>();
      mma::fence_proxy_async();
      __syncthreads();
      const uint32_t next = kt + kP;
      if (next < ktiles) {
        ld.issue(a, next, st[next % C::kStages]);
        if constexpr (C::kCvt) ld.load_x(a, next);  // split into the stage after the products
      } else {
        cp_commit();
      }
      if (kt + 1 < ktiles && (KQuant<T>::kDecoded || h == 1)) ld.load_headers(kt + 1);
      if (h == 0) {
        multiply<T, NL, C::kLag, 0>(st[b], wt, acc);
      } else {
        multiply<T, NL, C::kLag, 1>(st[b], wt, acc);
      }
      // Its buffer's k-tile, kt - 1 - Lag, is retired (before this k-tile's barrier); fenced for the
      // products at the barrier of k-tile next.
      if (C::kCvt && next < ktiles) ld.store_x(st[next % C::kStages]);
    }
  }
  store_outputs<NM, NL>(a, bt, wt, acc);
}

template <int T, int NM, class C>
__global__ void __launch_bounds__(C::kThreads, 512 / C::kThreads) kquant_f16_kernel(F16Args a) {
  constexpr uint32_t kThreads = C::kThreads;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ uint32_t grid[KQuant<T>::kDecoded ? 512 : 1];
  Stage<T, C::BR>* st = reinterpret_cast<Stage<T, C::BR>*>(smem);
  __shared__ uint32_t tile_of[3];  // the block's expert, its first sorted row and its tokens
  const uint32_t tile = blockIdx.y;
  if (tile >= a.tiles[a.E]) return;  // the grid is sized for the most tiles the routes can make
  for (uint32_t e = threadIdx.x; e < a.E; e += kThreads) {
    const uint32_t start = a.tiles[e];
    if (start <= tile && tile < a.tiles[e + 1]) {
      const uint32_t first = a.offsets[e] + (tile - start) * BN;
      tile_of[0] = e;
      tile_of[1] = first;
      tile_of[2] = min(BN, a.offsets[e + 1] - first);
    }
  }
  if constexpr (KQuant<T>::kDecoded) {
    for (uint32_t i = threadIdx.x; i < 512; i += kThreads) grid[i] = a.iq3s_grid[i];
  }
  __syncthreads();  // the tile, and the grid before the first decode
  BlockTile bt;
  bt.e = tile_of[0];
  bt.first = tile_of[1];
  bt.ntok = tile_of[2];
  bt.m0 = blockIdx.x * (C::BR / NM);
  TileLoader<T, NM, C> ld(a, bt);
  switch ((bt.ntok + 7) / 8) {  // block-uniform: every warpgroup takes every live token
    case 1: k_loop<T, NM, C, 1>(a, ld, st, grid, bt); break;
    case 2: k_loop<T, NM, C, 2>(a, ld, st, grid, bt); break;
    case 3: k_loop<T, NM, C, 3>(a, ld, st, grid, bt); break;
    case 4: k_loop<T, NM, C, 4>(a, ld, st, grid, bt); break;
    case 5: k_loop<T, NM, C, 5>(a, ld, st, grid, bt); break;
    case 6: k_loop<T, NM, C, 6>(a, ld, st, grid, bt); break;
    case 7: k_loop<T, NM, C, 7>(a, ld, st, grid, bt); break;
    default: k_loop<T, NM, C, 8>(a, ld, st, grid, bt); break;
  }
}

int f16_type(model::GgmlType type) {
  switch (type) {
    case model::GgmlType::Q4_K: return qd::kQ4_K;
    case model::GgmlType::Q5_K: return qd::kQ5_K;
    case model::GgmlType::IQ3_S: return qd::kIQ3_S;
    default: return -1;
  }
}

using Default = Cfg<2, 2, 0>;

template <int NM>
const void* kernel_of(int t) {
  return t == qd::kQ4_K   ? reinterpret_cast<const void*>(kquant_f16_kernel<qd::kQ4_K, NM, Default>)
         : t == qd::kQ5_K ? reinterpret_cast<const void*>(kquant_f16_kernel<qd::kQ5_K, NM, Default>)
                          : reinterpret_cast<const void*>(kquant_f16_kernel<qd::kIQ3_S, NM, Default>);
}
const void* kernel_of(int t, bool up) { return up ? kernel_of<2>(t) : kernel_of<1>(t); }

bool same_layout(const DevMatrix& a, const DevMatrix& b) {
  return a.type == b.type && a.rows == b.rows && a.cols == b.cols && a.row_bytes == b.row_bytes;
}

// Where the split inputs go: the high parts over split.hi, the low parts over split.lo and past them
// the sums, then the row factors (Cvt: the int16 words over split.hi; the steps, sums and row factors
// over split.lo); null where they do not fit.
struct F16Scratch {
  __half* xh = nullptr;
  __half* xl = nullptr;
  float* xs = nullptr;
  float* xp = nullptr;
  uint32_t* xq = nullptr;
  float* xstep = nullptr;
};
F16Scratch f16_scratch(const SplitScratch& split, uint32_t rows, uint32_t cols, bool cvt = false) {
  if (split.hi == nullptr || split.lo == nullptr || reinterpret_cast<uintptr_t>(split.hi) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(split.lo) % 16 != 0) {
    return {};
  }
  const size_t values = size_t{rows} * cols, blocks = size_t{rows} * (cols / 32);
  if (split.elems < grouped_split_elems(rows, cols)) return {};  // 2 bytes an elem: the sums' 4 per 32, 4 a row
  F16Scratch f;
  f.xh = static_cast<__half*>(split.hi);
  f.xl = static_cast<__half*>(split.lo);
  f.xq = static_cast<uint32_t*>(split.hi);
  f.xstep = static_cast<float*>(split.lo);
  f.xs = cvt ? f.xstep + blocks : reinterpret_cast<float*>(f.xl + values);
  f.xp = f.xs + blocks;
  return f;
}

template <int T, int NM, class C>
void launch_cfg(F16Args a, uint32_t rows, uint32_t tiles, cudaStream_t stream) {
  constexpr size_t smem = C::kStages * sizeof(Stage<T, C::BR>);
  FERRY_CUDA(cudaFuncSetAttribute(kquant_f16_kernel<T, NM, C>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(smem)));
  const uint32_t rm = C::BR / NM;
  const dim3 grid((rows + rm - 1) / rm, tiles);
  kquant_f16_kernel<T, NM, C><<<grid, C::kThreads, smem, stream>>>(a);
}

// Temporary (the device checks' A/B): FERRY_WGMMA_CFG 1 = 4 warpgroups, 2 stages; 2 = 4 warpgroups, 3
// stages with a lag of one k-tile; 3 = 4 warpgroups, 3 stages (copies two k-tiles ahead); 4, 5 = 2 and
// 3 with the inputs as int16 (Cvt); else 2 warpgroups, 2 stages.
int cfg_choice() {
  static const int v = [] {
    const char* e = std::getenv("FERRY_WGMMA_CFG");
    return e != nullptr ? std::atoi(e) : 0;
  }();
  return v;
}

template <int T, int NM>
void launch(const F16Args& a, uint32_t rows, uint32_t tiles, cudaStream_t stream) {
  if constexpr (T == qd::kQ4_K) {
    switch (cfg_choice()) {
      case 1: launch_cfg<T, NM, Cfg<4, 2, 0>>(a, rows, tiles, stream); return;
      case 2: launch_cfg<T, NM, Cfg<4, 3, 1>>(a, rows, tiles, stream); return;
      case 3: launch_cfg<T, NM, Cfg<4, 3, 0>>(a, rows, tiles, stream); return;
      case 4: launch_cfg<T, NM, Cfg<4, 3, 1, true>>(a, rows, tiles, stream); return;
      case 5: launch_cfg<T, NM, Cfg<4, 3, 0, true>>(a, rows, tiles, stream); return;
      default: break;
    }
  }
  launch_cfg<T, NM, Default>(a, rows, tiles, stream);
}

template <int NM>
void launch(int t, const F16Args& a, uint32_t rows, uint32_t tiles, cudaStream_t stream) {
  if (t == qd::kQ4_K) {
    launch<qd::kQ4_K, NM>(a, rows, tiles, stream);
  } else if (t == qd::kQ5_K) {
    launch<qd::kQ5_K, NM>(a, rows, tiles, stream);
  } else {
    launch<qd::kIQ3_S, NM>(a, rows, tiles, stream);
  }
}

}  // namespace

bool grouped_f16_takes(const ExpertMatrices& w, const ExpertMatrices* up, const float* x, size_t ldx,
                       uint32_t x_rows, const SplitScratch& split) {
  const int t = f16_type(w.m.type);
  if (t < 0 || w.m.cols == 0 || w.m.cols % 256 != 0) return false;
  const uint32_t block = t == qd::kQ4_K   ? KQuant<qd::kQ4_K>::kBlockBytes
                         : t == qd::kQ5_K ? KQuant<qd::kQ5_K>::kBlockBytes
                                          : KQuant<qd::kIQ3_S>::kBlockBytes;
  if (w.m.row_bytes != size_t{w.m.cols} / 256 * block) return false;
  if (up != nullptr && !same_layout(w.m, up->m)) return false;
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0 || ldx % 4 != 0 || ldx < w.m.cols) return false;
  if (f16_scratch(split, x_rows, w.m.cols).xh == nullptr) return false;
  int dev = 0, major = 0, minor = 0;
  FERRY_CUDA(cudaGetDevice(&dev));
  FERRY_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  FERRY_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  // sm_90a code loads on 9.0 only: no other device is asked about the kernel.
  if (major != 9 || minor != 0) return false;
  return code_built_for(kernel_of(t, up != nullptr), 9);
}

void grouped_gemm_f16(const ExpertMatrices& w, const ExpertMatrices* up, const float* x, size_t ldx, uint32_t x_rows,
                      const int32_t* gather, const RouteSort& sort, uint32_t routes, uint32_t E, float limit, float* y,
                      size_t ldy, const SplitScratch& split, cudaStream_t stream) {
  if (routes == 0 || w.m.rows == 0 || x_rows == 0) return;
  if (!grouped_f16_takes(w, up, x, ldx, x_rows, split)) {
    throw CudaError("grouped_gemm_f16: not an f16 call (Q4_K / Q5_K / IQ3_S rows of whole blocks, gate and up alike, aligned "
                    "input, a scratch for " + std::to_string(x_rows) + " x " + std::to_string(w.m.cols) +
                    " values and their factors, sm_90a code)");
  }
  if (gather == nullptr && x_rows < routes) {
    throw CudaError("grouped_gemm_f16: " + std::to_string(routes) + " routes read rows of an input of " +
                    std::to_string(x_rows));
  }
  if (w.table == nullptr && w.m.data == nullptr) throw CudaError("grouped_gemm_f16: no expert weights");
  const uint32_t cols = w.m.cols;
  const int t = f16_type(w.m.type);
  const bool cvt = t == qd::kQ4_K && cfg_choice() >= 4;
  const F16Scratch fs = f16_scratch(split, x_rows, cols, cvt);
  if (cvt) {
    quantize_rows_f16_kernel<true><<<x_rows, 256, 0, stream>>>(x, ldx, cols, fs.xh, fs.xl, fs.xs, fs.xp, fs.xq,
                                                               fs.xstep);
  } else {
    quantize_rows_f16_kernel<false><<<x_rows, 256, 0, stream>>>(x, ldx, cols, fs.xh, fs.xl, fs.xs, fs.xp, fs.xq,
                                                                fs.xstep);
  }
  FERRY_CUDA_LAUNCHED();

  F16Args a{};
  a.base[0] = w.m.data;
  a.stride[0] = w.stride;
  a.table[0] = w.table;
  if (up != nullptr) {
    a.base[1] = up->m.data;
    a.stride[1] = up->stride;
    a.table[1] = up->table;
  }
  a.rows = w.m.rows;
  a.cols = cols;
  a.row_bytes = w.m.row_bytes;
  a.xh = fs.xh;
  a.xl = fs.xl;
  a.xs = fs.xs;
  a.xp = fs.xp;
  a.xq = fs.xq;
  a.xstep = fs.xstep;
  a.gather = gather;
  a.offsets = sort.offsets;
  a.tiles = sort.tiles;
  a.E = E;
  a.y = y;
  a.ldy = ldy;
  a.limit = limit;
  const size_t max_tiles = (size_t{routes} + BN - 1) / BN + std::min(E, routes);
  if (max_tiles > 65535) {
    throw CudaError("grouped_gemm_f16: " + std::to_string(routes) + " routes make too large a grid");
  }
  if (t == qd::kIQ3_S) a.iq3s_grid = iq3s_grid_address();
  if (up != nullptr) {
    launch<2>(t, a, w.m.rows, static_cast<uint32_t>(max_tiles), stream);
  } else {
    launch<1>(t, a, w.m.rows, static_cast<uint32_t>(max_tiles), stream);
  }
  FERRY_CUDA_LAUNCHED();
}

}  // namespace ferry::gpu
