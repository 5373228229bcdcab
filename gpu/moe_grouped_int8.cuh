#pragma once
// What the grouped int8 kernels share (gpu/moe_grouped_int8.cu: mma.sync, sm80+; gpu/moe_grouped_wgmma.cu:
// wgmma, sm_90a): the tile sizes, each type's layout, the stages, the cp.async copies of a k-tile and
// the weight factors made from the blocks' headers (TileLoader), the warps' parts of a tile, the
// K-quants' minimum terms and the stores. gpu/moe_grouped_int8.cu's top comment says how they work.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "gpu/mma_int8.cuh"
#include "gpu/moe_grouped.hpp"
#include "gpu/quant_device.cuh"
#include "gpu/swiglu.cuh"

namespace ferry::gpu::grouped_int8 {

constexpr uint32_t BN = kGroupedTileTokens;  // sorted rows of a block: the sort's token tiles
constexpr uint32_t BR = 128;                 // weight rows of a block (NM matrices of BR / NM rows)
constexpr uint32_t BK = 128;                 // columns of a k-tile
constexpr uint32_t kSteps = BK / 32;         // k32 steps (sub-blocks) of a k-tile
constexpr uint32_t kThreads = 256;
// The tile loaders' and warp tiles' thread maps are written for these sizes.
static_assert(BN == 64 && BR == 128 && kThreads == 256, "moe_grouped_int8: thread maps assume 64 x 128 tiles, 256 threads");
// A token's k-tile in shared memory: 32 words of high bytes, 32 of low. The mma.sync kernel pads them
// to 68 words apart, so that the 8 tokens x 4 words of a fragment hit 32 banks; the wgmma kernel lays
// them out as its descriptors read them (kCoreXWords: core matrices of 8 tokens x 16 bytes, below).
constexpr uint32_t kXWords = 68;
constexpr uint32_t kCoreXWords = 64;

// Per type: a block's bytes, where its 128 bytes of nibbles lie (Q4_K, Q5_K: d, dmin and 12 bytes of
// scales first), and the words of a weight row's k-tile in shared memory: 16 of nibbles (and for
// Q5_K the block's 8 words of fifth bits), padded so that rows 20 / 28 words apart hit 32 banks.
// IQ3_S's values come from a grid with signs, so its k-tile is decoded into 32 words of int8 a row
// (36 apart) instead of copied; it has no minimum terms.
template <int T> struct KQuant;
// kLag: how many 8-token tiles before its f32 terms a tile's MMAs are issued (multiply): one for
// IQ3_S (2% off its gate+up in the user's mix), none for the K-quants (one or two were slower).
template <> struct KQuant<qd::kQ4_K> {
  static constexpr uint32_t kBlockBytes = 144, kNibbles = 16, kWWords = 20;
  static constexpr bool kHighBits = false, kDecoded = false;
  static constexpr int kLag = 0;
};
template <> struct KQuant<qd::kQ5_K> {
  static constexpr uint32_t kBlockBytes = 176, kNibbles = 48, kWWords = 28;
  static constexpr bool kHighBits = true, kDecoded = false;  // bit j of byte l of the 32 at 16: sub-block j's column l
  static constexpr int kLag = 0;
};
template <> struct KQuant<qd::kIQ3_S> {
  static constexpr uint32_t kBlockBytes = 110, kNibbles = 0, kWWords = 36;
  static constexpr bool kHighBits = false, kDecoded = true;
  static constexpr int kLag = 1;
};

template <int T, uint32_t XWords = kXWords>
struct Stage {
  uint32_t w[BR * KQuant<T>::kWWords];
  uint32_t x[BN * XWords];
  float2 wf[kSteps][BR];  // per sub-block and weight row: d * scale, and (K-quants) the 6-bit min
  float dmin[BR];         // K-quants: per weight row, its block's dmin
  float xd[kSteps][BN];   // per block and token: the int16 step
  float xs[kSteps][BN + 8];  // and the f32 sum (rows 8 banks apart: minimum_terms reads 4 of them at once)
};
static_assert(sizeof(Stage<qd::kQ4_K>) % 16 == 0 && sizeof(Stage<qd::kQ5_K>) % 16 == 0 &&
                  sizeof(Stage<qd::kIQ3_S>) % 16 == 0 && sizeof(Stage<qd::kQ4_K, kCoreXWords>) % 16 == 0 &&
                  sizeof(Stage<qd::kQ5_K, kCoreXWords>) % 16 == 0 && sizeof(Stage<qd::kIQ3_S, kCoreXWords>) % 16 == 0,
              "stages stay 16-byte aligned");

// Word of 16-byte chunk c (0..15: 8 of high bytes, then 8 of low) of token tok's k-tile in the wgmma
// kernel's layout: the chunk's 8-token core matrix is 128 contiguous bytes, chunks of an 8-token
// group 128 bytes apart, groups 2 KiB apart.
__device__ __forceinline__ uint32_t core_x_word(uint32_t tok, uint32_t c) { return ((tok / 8) * 16 + c) * 32 + (tok % 8) * 4; }


struct Int8Args {
  const uint8_t* base[2];
  size_t stride[2];
  const uint8_t* const* table[2];
  uint32_t rows, cols;
  size_t row_bytes;
  const uint8_t* xq;  // quantized rows, 2 * cols bytes apart
  const float2* xf;   // their blocks' steps and sums, cols / 32 apart
  const int32_t* gather;
  const uint32_t* offsets;
  const uint32_t* tiles;
  uint32_t E;
  float* y;
  size_t ldy;
  float limit;
  const uint32_t* iq3s_grid;  // IQ3_S: the device copy of model::kIq3sGrid
};

__device__ __forceinline__ void cp_async(void* dst, const void* src, int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  if (bytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
  } else if (bytes == 8) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(d), "l"(src) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d), "l"(src) : "memory");
  }
#else
  (void)dst;
  (void)src;
  (void)bytes;
  __trap();  // hosts launch this kernel only on sm80+ code (code_built_for)
#endif
}

__device__ __forceinline__ void cp_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

// Waits until at most `Pending` of this thread's latest groups are in flight.
template <int Pending>
__device__ __forceinline__ void cp_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(Pending) : "memory");
#endif
}

// Scale byte i (0..11) of a Q4_K / Q5_K block whose leading words are h (h[0]: d and dmin).
__device__ __forceinline__ uint32_t scale_byte(const uint32_t (&h)[4], uint32_t i) {
  const uint32_t word = i < 4 ? h[1] : i < 8 ? h[2] : h[3];
  return (word >> (8 * (i & 3))) & 0xff;
}

// Sub-block j's 6-bit scale and min, as qd::k4_scale_min and matvec_int16.cu's k4_factors read them.
__device__ __forceinline__ void k4_scale_min(const uint32_t (&h)[4], uint32_t j, uint32_t& sc, uint32_t& m) {
  if (j < 4) {
    sc = scale_byte(h, j) & 63;
    m = scale_byte(h, j + 4) & 63;
  } else {
    sc = (scale_byte(h, j + 4) & 0xf) | ((scale_byte(h, j - 4) >> 6) << 4);
    m = (scale_byte(h, j + 4) >> 4) | ((scale_byte(h, j) >> 6) << 4);
  }
}

// IQ3_S sub-block j of the block at b (2-byte aligned), as matvec_int16.cu's Reader<IQ3_S> reads it:
// its 8 grid indices' low bytes, its sign bits, and its qh byte | its scale nibble << 8 | d << 16.
__device__ __forceinline__ void iq3s_load(const uint8_t* b, uint32_t j, uint32_t (&u)[4]) {
  u[0] = qd::ld_u32_a2(b + 2 + 8 * j);
  u[1] = qd::ld_u32_a2(b + 6 + 8 * j);
  u[2] = qd::ld_u32_a2(b + 74 + 4 * j);
  u[3] = b[66 + j] | (((b[106 + j / 2] >> (4 * (j % 2))) & 0xfu) << 8) | (qd::ld_u16(b) << 16);
}

// Its 32 values as int8 (column order, four a word: grid entries with their signs) and d * scale.
__device__ __forceinline__ float iq3s_decode(const uint32_t (&u)[4], const uint32_t* grid, uint32_t (&v)[8]) {
#pragma unroll
  for (int g = 0; g < 8; ++g) {
    const uint32_t qs = ((g < 4 ? u[0] : u[1]) >> (8 * (g & 3))) & 0xff;
    const uint32_t entry = grid[qs | (((u[3] >> g) & 1) << 8)];
    // Sign bit k to byte k, then 0xff in negative bytes: (e ^ 0xff) - 0xff is -e bytewise.
    const uint32_t neg = ((((u[2] >> (4 * g)) & 0xf) * 0x00204081u) & 0x01010101u) * 0xffu;
    v[g] = __vsub4(entry ^ neg, neg);
  }
  return qd::h2f(u[3] >> 16) * static_cast<float>(1 + 2 * ((u[3] >> 8) & 0xf));
}

// A block's tile: its expert, first sorted row, tokens and first weight row.
struct BlockTile {
  uint32_t e = 0, first = 0, ntok = 0, m0 = 0;
};

// Block `tile`'s expert, the one e with tiles[e] <= tile < tiles[e + 1], by one pass of the block over
// the tile starts: a wait or two on memory before the first copies, not a binary search's ~log2(E).
// Into tile_of (shared): the expert, its first sorted row and its tokens; seen after a barrier.
template <uint32_t NT = kThreads>
__device__ __forceinline__ void find_tile(const Int8Args& a, uint32_t tile, uint32_t (&tile_of)[3]) {
  for (uint32_t e = threadIdx.x; e < a.E; e += NT) {
    const uint32_t start = a.tiles[e];
    if (start <= tile && tile < a.tiles[e + 1]) {
      const uint32_t first = a.offsets[e] + (tile - start) * BN;
      tile_of[0] = e;
      tile_of[1] = first;
      tile_of[2] = min(BN, a.offsets[e + 1] - first);
    }
  }
}

// What a thread copies of each k-tile, and the bytes it makes the weight factors from. Weight items
// tid and tid + 256 of 128 rows x 4 chunks (row item / 4; chunk, and the sub-block whose factors
// the thread makes, tid % 4); Q5_K's fifth bits, 128 rows x 2 chunks (row tid / 2, chunk tid % 2);
// token items tid + 256j of 64 tokens x 16 chunks (kCore, the wgmma kernel's layout: token tid % 8 +
// 8 * (tid / 128) + 8 * (NT / 128) * j, chunk tid / 8 % 16, so that 8 lanes fill one core matrix's 128 bytes and
// lanes l, l + 8 read a token's neighbouring chunks; else token tid / 16 + 16j, chunk tid % 16); the
// factors of token tid / 4, block tid % 4. Rows past the matrix and tokens past the tile read row
// rows - 1 and the tile's first token: their products are not stored.
// NT threads (256, or 512 for the wgmma kernel: each of its threads then copies half as many weight
// and token items, and threads past 256 none of the fifth bits or token factors).
template <int T, int NM, bool kCore = false, uint32_t NT = kThreads>
struct TileLoader {
  using K = KQuant<T>;
  using S = Stage<T, kCore ? kCoreXWords : kXWords>;
  static_assert((NT == 256 || (NT == 512 && kCore)), "TileLoader: 256 threads, or 512 in the core layout");
  static constexpr int kWItems = BR * 4 / NT, kXItems = BN * 16 / NT;
  static __device__ __forceinline__ uint32_t x_token(uint32_t j) {
    return kCore ? threadIdx.x % 8 + 8 * (threadIdx.x / 128) + 8 * (NT / 128) * j : threadIdx.x / 16 + 16 * j;
  }
  static __device__ __forceinline__ uint32_t x_chunk() { return kCore ? threadIdx.x / 8 % 16 : threadIdx.x % 16; }
  static constexpr uint32_t RM = BR / NM;  // rows of each matrix in the block
  const uint8_t* wrow[kWItems];
  uint32_t wlr[kWItems];
  const uint8_t* hrow = nullptr;
  size_t xoff[kXItems];
  size_t xfoff;
  uint32_t xlive;      // tokens of the tile's 8-token tiles that hold any: what the products read
  bool w16 = true;     // every matrix 16-byte aligned (blocks of 144 / 176 bytes): 16-byte copies
  uint32_t hdr[kWItems][4];  // the leading words of the weight items' blocks (IQ3_S: their sub-blocks' bytes)

  __device__ TileLoader(const Int8Args& a, const BlockTile& bt) {
    const uint32_t tid = threadIdx.x;
    xlive = (bt.ntok + 7) / 8 * 8;
    const uint8_t* w[NM];
#pragma unroll
    for (int m = 0; m < NM; ++m) {
      w[m] = a.table[m] != nullptr ? a.table[m][bt.e] : a.base[m] + bt.e * a.stride[m];
      w16 = w16 && reinterpret_cast<uintptr_t>(w[m]) % 16 == 0;
    }
    // The matrix of local row lr, without indexing by a variable (local memory).
    auto row = [&](uint32_t lr) {
      return (NM == 1 || lr < RM ? w[0] : w[NM - 1]) +
             static_cast<size_t>(min(bt.m0 + lr % RM, a.rows - 1)) * a.row_bytes;
    };
    if constexpr (K::kHighBits) hrow = row(tid % 256 / 2);
#pragma unroll
    for (int j = 0; j < kWItems; ++j) {
      wlr[j] = (tid + NT * j) / 4;
      wrow[j] = row(wlr[j]);
    }
    auto token_row = [&](uint32_t tok) -> size_t {
      const uint32_t t = tok < bt.ntok ? tok : 0;
      return a.gather != nullptr ? static_cast<size_t>(a.gather[bt.first + t]) : bt.first + t;
    };
#pragma unroll
    for (int j = 0; j < kXItems; ++j) xoff[j] = token_row(x_token(j)) * 2 * a.cols;
    xfoff = token_row(tid % 256 / 4) * (a.cols / 32) + tid % 4;
  }

  // k-tile kt's copies into s, one group.
  __device__ void issue(const Int8Args& a, uint32_t kt, S& s) const {
    const uint32_t tid = threadIdx.x, wch = tid % 4, xch = x_chunk();
    const size_t wb = (kt / 2) * K::kBlockBytes + K::kNibbles + 64 * (kt % 2) + 16 * wch;
#pragma unroll
    for (int j = 0; j < kWItems && !K::kDecoded; ++j) {
      uint32_t* dst = &s.w[wlr[j] * K::kWWords + 4 * wch];
      if (w16) {
        cp_async(dst, wrow[j] + wb, 16);
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) cp_async(dst + i, wrow[j] + wb + 4 * i, 4);
      }
    }
    // Token rows past the live 8-token tiles are never read: not copied.
#pragma unroll
    for (int j = 0; j < kXItems; ++j) {
      const uint32_t tok = x_token(j);
      if (tok < xlive) {
        cp_async(&s.x[kCore ? core_x_word(tok, xch) : tok * kXWords + 4 * xch], a.xq + xoff[j] + 2 * BK * kt + 16 * xch,
                 16);
      }
    }
    if ((NT == 256 || tid < 256) && tid / 4 < xlive) {
      const float2* xf = a.xf + xfoff + kSteps * kt;
      cp_async(&s.xd[tid % 4][tid / 4], &xf->x, 4);
      cp_async(&s.xs[tid % 4][tid / 4], &xf->y, 4);
    }
    if (K::kHighBits && (NT == 256 || tid < 256)) {
      uint32_t* dst = &s.w[(tid / 2) * K::kWWords + 16 + 4 * (tid % 2)];
      const uint8_t* src = hrow + (kt / 2) * K::kBlockBytes + 16 + 16 * (tid % 2);
      if (w16) {
        cp_async(dst, src, 16);
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) cp_async(dst + i, src + 4 * i, 4);
      }
    }
    cp_commit();
  }

  __device__ void load_headers(uint32_t kt) {
    const uint32_t wch = threadIdx.x % 4;
#pragma unroll
    for (int j = 0; j < kWItems; ++j) {
      const uint8_t* p = wrow[j] + (kt / 2) * K::kBlockBytes;
      if constexpr (K::kDecoded) {
        iq3s_load(p, kSteps * (kt % 2) + wch, hdr[j]);
      } else if (w16) {
        const uint4 v = *reinterpret_cast<const uint4*>(p);
        hdr[j][0] = v.x, hdr[j][1] = v.y, hdr[j][2] = v.z, hdr[j][3] = v.w;
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) hdr[j][i] = qd::ld_u32(p + 4 * i);
      }
    }
  }

  // k-tile kt's weight factors (IQ3_S: and values) from the headers loaded, into s.
  __device__ void store_factors(uint32_t kt, S& s, const uint32_t* grid) const {
    const uint32_t wch = threadIdx.x % 4;
#pragma unroll
    for (int j = 0; j < kWItems; ++j) {
      if constexpr (K::kDecoded) {  // and the sub-block's values, words 8 * wch.. of the row
        uint32_t v[8];
        const float d = iq3s_decode(hdr[j], grid, v);
        uint4* dst = reinterpret_cast<uint4*>(&s.w[wlr[j] * K::kWWords + 8 * wch]);
        dst[0] = make_uint4(v[0], v[1], v[2], v[3]);
        dst[1] = make_uint4(v[4], v[5], v[6], v[7]);
        s.wf[wch][wlr[j]] = make_float2(d, 0.0f);
      } else {
        uint32_t sc, m;
        k4_scale_min(hdr[j], kSteps * (kt % 2) + wch, sc, m);
        const float d = qd::h2f(hdr[j][0] & 0xffff), dmin = qd::h2f(hdr[j][0] >> 16);
        // Q4_K's odd sub-blocks (high nibbles) are multiplied unshifted, 16 times their values: their
        // d * scale / 16 (exact) makes the same product.
        const float dsc = d * static_cast<float>(sc) * (!K::kHighBits && wch % 2 == 1 ? 0.0625f : 1.0f);
        s.wf[wch][wlr[j]] = make_float2(dsc, static_cast<float>(m));
        if (wch == 0) s.dmin[wlr[j]] = dmin;
      }
    }
  }
};

// A warp's part of the block's tile: two 16-row tiles (32 rows of the matrix, or 16 of gate and of
// up) x four of the tile's eight 8-token tiles, every other one (n-th: tokens 8 * (2n + wt)..), so
// that a tile of fewer than 64 tokens gives both warps of a row range nearly the same work; the first
// `live` of them hold tokens (the same for all its lanes). C's layout: acc[i][n][k], k = 0, 1 row g,
// tokens 2q, 2q + 1 of the n-th; k = 2, 3 row g + 8.
struct WarpTile {
  uint32_t g, q, wt, lrb[2], live;
  __device__ uint32_t token(uint32_t n) const { return 8 * (2 * n + wt); }
};

template <int NM>
__device__ __forceinline__ WarpTile warp_tile(uint32_t ntok) {
  const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, wr = warp % 4;
  WarpTile t;
  t.g = lane / 4;
  t.q = lane % 4;
  t.wt = warp / 4;
#pragma unroll
  for (int i = 0; i < 2; ++i) t.lrb[i] = NM == 1 ? wr * 32 + 16 * i : BR / 2 * i + wr * 16;
  const uint32_t tiles = (ntok + 7) / 8;  // 8-token tiles holding tokens: the warp has those of its parity
  t.live = tiles > t.wt ? min(4u, (tiles - t.wt + 1) / 2) : 0;
  return t;
}

// The A fragments of a 16-row tile whose rows are kWWords apart from `rows`, 16-byte chunks at word
// offsets `word` (registers 0, 1: rows g, g + 8) and `word` + 4 (2, 3), by ldmatrix: lane l gives row
// l % 8 (+ 8 for odd l / 8) of chunk l / 16.
template <uint32_t kWWords>
__device__ __forceinline__ void load_a(uint32_t (&r)[4], const uint32_t* rows, uint32_t word) {
  const uint32_t lane = threadIdx.x % 32;
  mma::ldmatrix_x4(r, rows + (lane % 8 + 8 * (lane / 8 % 2)) * kWWords + word + 4 * (lane / 16));
}

// The K-quants' minimum terms of a k-tile, sum_j min_j * sum_j(x) over its 4 sub-blocks (the k of one
// tf32 m16n8k4), on tensor cores: the 6-bit mins are exact in tf32, each f32 sum is split into a tf32
// head and the rest (what the rest's own tf32 rounding drops is ~2^-22 of the sum), and dmin (one a
// row in a k-tile) times the result is taken off in f32: one FFMA an output a k-tile, not one a
// sub-block.
template <int NL, class S>
__device__ __forceinline__ void minimum_terms(const S& s, const WarpTile& t, float (&acc)[2][4][4]) {
  const uint32_t g = t.g, q = t.q;
  uint32_t am[2][2];
  float dmin[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      am[i][r] = __float_as_uint(s.wf[q][t.lrb[i] + g + 8 * r].y);
      dmin[i][r] = s.dmin[t.lrb[i] + g + 8 * r];
    }
  }
  const uint32_t zero[4] = {0, 0, 0, 0};
#pragma unroll
  for (int n = 0; n < NL; ++n) {
    const float sx = s.xs[q][t.token(n) + g];
    const uint32_t head = __float_as_uint(sx) & 0xffffe000u;
    const uint32_t rest = __float_as_uint(sx - __uint_as_float(head));
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      uint32_t part[4], m[4];
      mma::mma_tf32_k4(part, am[i], rest, zero);
      mma::mma_tf32_k4(m, am[i], head, part);
#pragma unroll
      for (int k = 0; k < 4; ++k) acc[i][n][k] = fmaf(-dmin[i][k / 2], __uint_as_float(m[k]), acc[i][n][k]);
    }
  }
}

// The warp's outputs of the tile's tokens and the matrix's rows (NM 2: SwiGLU of gate and up).
template <int NM>
__device__ __forceinline__ void store_outputs(const Int8Args& a, const BlockTile& bt, const WarpTile& t,
                                              const float (&acc)[2][4][4]) {
#pragma unroll
  for (int n = 0; n < 4; ++n) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t tok = t.token(n) + 2 * t.q + k % 2;
      if (tok >= bt.ntok) continue;
      float* yt = a.y + static_cast<size_t>(bt.first + tok) * a.ldy;
      if constexpr (NM == 2) {
        const uint32_t row = bt.m0 + t.lrb[0] + t.g + 8 * (k / 2);
        if (row < a.rows) yt[row] = swiglu_value(acc[0][n][k], acc[1][n][k], a.limit);
      } else {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const uint32_t row = bt.m0 + t.lrb[i] + t.g + 8 * (k / 2);
          if (row < a.rows) yt[row] = acc[i][n][k];
        }
      }
    }
  }
}

// The wgmma kernel (gpu/moe_grouped_wgmma.cu): whether it runs here, for type t (qd::kQ4_K, ...) and
// gate with up or one matrix (a device of compute capability 9.0, the kernel's code sm_90a), and its
// launch over the mma.sync kernel's grid and arguments.
bool wgmma_ready(int t, bool up);
void launch_wgmma(int t, bool up, const Int8Args& a, dim3 grid, cudaStream_t stream);

}  // namespace ferry::gpu::grouped_int8
