// The grouped expert GEMMs on int8 tensor cores for Q4_K, Q5_K and IQ3_S weights
// (gpu/moe_grouped_int8.hpp says what and why).
//
// First a pass quantizes the input rows (each once, not once per expert tile that reads it) into
// the split scratch: per row, for each k-tile of 128 columns, 128 high bytes (s8) then 128 low bytes
// (u8) of its int16 values, in column order; and per 32-value block its step and f32 sum.
//
// A block: 8 warps over 128 weight rows (64 each of gate and up, whose SwiGLU is then taken in
// registers) x the 64 sorted rows of a token tile, k-tiles of 128 columns (half a block: 64 bytes
// of nibbles a row, and Q5_K's 32 bytes of fifth bits). Per k-tile the weight rows' nibble bytes
// and the bytes and block factors of the tokens the products read (those of the tile's 8-token tiles
// that hold any) are copied in by cp.async into one of two buffers while
// the tensor cores work on the other, and each weight row's sub-block factors (d * scale; for
// K-quants the min and dmin) are made from its block's 16 leading bytes (IQ3_S: its sub-blocks are decoded to int8 there,
// from the bytes loaded before the products). A warp multiplies 32 weight rows x 32 tokens: per
// 32-column sub-block (one k32 step) 2 x 4 tiles of m16n8k32, each twice (the high and the low
// bytes). The nibbles of a sub-block are one half of 32 consecutive bytes, so each register of A is
// four bytes of the row masked (low or high nibbles; Q5_K ORs in bit j of the fifth-bit bytes of
// the same columns): no decode pass and no permutation. Fragments are read by ldmatrix (one
// instruction for a 16-row A tile, or for an 8-token tile's high and low B bytes), and a warp's
// products of a k-tile are one branch-free stretch of code for its count of 8-token tiles that hold
// tokens, so that the scheduler overlaps loads, MMAs and the f32 terms across tiles and steps. Both
// int32 sums are turned into f32 without
// a conversion instruction (a quarter-rate one on these devices): the MMAs accumulate onto the bits
// of 1.5 * 2^31 and 1.5 * 2^23, so the words read as floats are those constants plus 256 * high and
// low sum, exactly, and two adds give their sum.
#include "gpu/moe_grouped_int8.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "gpu/cuda_check.hpp"
#include "gpu/mma_int8.cuh"
#include "gpu/pdl.hpp"
#include "gpu/quant_device.cuh"
#include "gpu/swiglu.cuh"
#include "gpu/x_int16.cuh"
#include "model/formats/ggml_type.hpp"

namespace ferry::gpu {
namespace {

constexpr uint32_t BN = kGroupedTileTokens;  // sorted rows of a block: the sort's token tiles
constexpr uint32_t BR = 128;                 // weight rows of a block (NM matrices of BR / NM rows)
constexpr uint32_t BK = 128;                 // columns of a k-tile
constexpr uint32_t kSteps = BK / 32;         // k32 steps (sub-blocks) of a k-tile
constexpr uint32_t kThreads = 256;
// The tile loaders' and warp tiles' thread maps are written for these sizes.
static_assert(BN == 64 && BR == 128 && kThreads == 256, "moe_grouped_int8: thread maps assume 64 x 128 tiles, 256 threads");
// A token's k-tile in shared memory: 32 words of high bytes, 32 of low, padded to 68 words apart so
// that the 8 tokens x 4 words of a fragment hit 32 banks.
constexpr uint32_t kXWords = 68;

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

template <int T>
struct Stage {
  uint32_t w[BR * KQuant<T>::kWWords];
  uint32_t x[BN * kXWords];
  float2 wf[kSteps][BR];  // per sub-block and weight row: d * scale, and (K-quants) the 6-bit min
  float dmin[BR];         // K-quants: per weight row, its block's dmin
  float xd[kSteps][BN];   // per block and token: the int16 step
  float xs[kSteps][BN + 8];  // and the f32 sum (rows 8 banks apart: minimum_terms reads 4 of them at once)
};
static_assert(sizeof(Stage<qd::kQ4_K>) % 16 == 0 && sizeof(Stage<qd::kQ5_K>) % 16 == 0 &&
                  sizeof(Stage<qd::kIQ3_S>) % 16 == 0,
              "stages stay 16-byte aligned");

// The constants the int32 sums accumulate onto (as float bits) and the sum of their values.
constexpr int32_t kHiBits = 0x4F400000;  // 1.5 * 2^31: one unit of the bits is 256
constexpr int32_t kLoBits = 0x4B400000;  // 1.5 * 2^23: one unit is 1
constexpr float kMagic = 3221225472.0f + 12582912.0f;

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

// One thread's 16 values of row r, columns 16p..: their int16 bytes into the row's k-tile, and (the
// even lane of the pair) the block's step and sum.
__global__ void __launch_bounds__(256) quantize_rows_kernel(const float* x, size_t ldx, uint32_t rows, uint32_t cols,
                                                            uint8_t* xq, float2* xf) {
  const uint32_t per_row = cols / 16;
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool valid = i < static_cast<size_t>(rows) * per_row;
  const uint32_t r = valid ? static_cast<uint32_t>(i / per_row) : 0, p = valid ? static_cast<uint32_t>(i % per_row) : 0;
  float v[16];
  float amax = 0.0f, sum = 0.0f;
  if (valid) {
    const float4* src = reinterpret_cast<const float4*>(x + static_cast<size_t>(r) * ldx + 16 * p);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float4 f = src[k];
      v[4 * k] = f.x, v[4 * k + 1] = f.y, v[4 * k + 2] = f.z, v[4 * k + 3] = f.w;
    }
    x16_stats(v, amax, sum);
  }
  amax = x32_amax(amax);  // every lane: the pair (p even, p + 1) is lanes i, i ^ 1 of one row
  const float sum32 = sum + __shfl_xor_sync(0xffffffffu, sum, 1);
  if (!valid) return;
  uint32_t packed[8];
  x16_pack(v, amax, packed);
  uint32_t hi[4], lo[4];
  x16_bytes(packed, hi, lo);
  const uint32_t c = 16 * p;
  uint8_t* dst = xq + static_cast<size_t>(r) * 2 * cols + 2 * (c / BK) * BK + c % BK;
  *reinterpret_cast<uint4*>(dst) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
  *reinterpret_cast<uint4*>(dst + BK) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
  if (p % 2 == 0) xf[static_cast<size_t>(r) * (cols / 32) + p / 2] = make_float2(x32_scale(amax), sum32);
}

// A block's tile: its expert, first sorted row, tokens and first weight row.
struct BlockTile {
  uint32_t e = 0, first = 0, ntok = 0, m0 = 0;
};

// What a thread copies of each k-tile, and the bytes it makes the weight factors from. Weight items
// tid and tid + 256 of 128 rows x 4 chunks (row item / 4; chunk, and the sub-block whose factors
// the thread makes, tid % 4); Q5_K's fifth bits, 128 rows x 2 chunks (row tid / 2, chunk tid % 2);
// token items tid + 256j of 64 tokens x 16 chunks; the factors of token tid / 4, block tid % 4.
// Rows past the matrix and tokens past the tile read row rows - 1 and the tile's first token: their
// products are not stored.
template <int T, int NM>
struct TileLoader {
  using K = KQuant<T>;
  static constexpr uint32_t RM = BR / NM;  // rows of each matrix in the block
  const uint8_t* wrow[2];
  uint32_t wlr[2];
  const uint8_t* hrow = nullptr;
  size_t xoff[4];
  size_t xfoff;
  uint32_t xlive;      // tokens of the tile's 8-token tiles that hold any: what the products read
  bool w16 = true;     // every matrix 16-byte aligned (blocks of 144 / 176 bytes): 16-byte copies
  uint32_t hdr[2][4];  // the leading words of the weight items' blocks (IQ3_S: their sub-blocks' bytes)

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
    if constexpr (K::kHighBits) hrow = row(tid / 2);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      wlr[j] = (tid + kThreads * j) / 4;
      wrow[j] = row(wlr[j]);
    }
    auto token_row = [&](uint32_t tok) -> size_t {
      const uint32_t t = tok < bt.ntok ? tok : 0;
      return a.gather != nullptr ? static_cast<size_t>(a.gather[bt.first + t]) : bt.first + t;
    };
#pragma unroll
    for (int j = 0; j < 4; ++j) xoff[j] = token_row(tid / 16 + 16 * j) * 2 * a.cols;
    xfoff = token_row(tid / 4) * (a.cols / 32) + tid % 4;
  }

  // k-tile kt's copies into s, one group.
  __device__ void issue(const Int8Args& a, uint32_t kt, Stage<T>& s) const {
    const uint32_t tid = threadIdx.x, wch = tid % 4, xch = tid % 16;
    const size_t wb = (kt / 2) * K::kBlockBytes + K::kNibbles + 64 * (kt % 2) + 16 * wch;
#pragma unroll
    for (int j = 0; j < 2 && !K::kDecoded; ++j) {
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
    for (int j = 0; j < 4; ++j) {
      const uint32_t tok = tid / 16 + 16 * j;
      if (tok < xlive) cp_async(&s.x[tok * kXWords + 4 * xch], a.xq + xoff[j] + 2 * BK * kt + 16 * xch, 16);
    }
    if (tid / 4 < xlive) {
      const float2* xf = a.xf + xfoff + kSteps * kt;
      cp_async(&s.xd[tid % 4][tid / 4], &xf->x, 4);
      cp_async(&s.xs[tid % 4][tid / 4], &xf->y, 4);
    }
    if constexpr (K::kHighBits) {
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
    for (int j = 0; j < 2; ++j) {
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
  __device__ void store_factors(uint32_t kt, Stage<T>& s, const uint32_t* grid) const {
    const uint32_t wch = threadIdx.x % 4;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
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
template <int T, int NL>
__device__ __forceinline__ void minimum_terms(const Stage<T>& s, const WarpTile& t, float (&acc)[2][4][4]) {
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

// One k-tile's products of a warp with NL live 8-token tiles (k-tile kt, in s) into acc: no branch
// inside, so the fragment loads of the next tiles and steps are scheduled under the products.
// One sub-block's f32 terms of a 16-row x 8-token tile: the exact int32 sum of its high- and low-byte
// products (the high one's magic offset removed) times the row's d * scale and the token's step.
__device__ __forceinline__ void add_terms(float (&acc)[4], const mma::FragC& ch, const mma::FragC& cl,
                                          const float (&dw)[2], float2 dx) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float sum = (__int_as_float(ch.r[k]) - kMagic) + __int_as_float(cl.r[k]);
    acc[k] = fmaf(dw[k / 2] * (k % 2 == 0 ? dx.x : dx.y), sum, acc[k]);
  }
}

template <int T, int NL>
__device__ __forceinline__ void multiply(const Stage<T>& s, uint32_t kt, const WarpTile& t, float (&acc)[2][4][4]) {
  using K = KQuant<T>;
  constexpr int LAG = K::kLag;
  constexpr uint32_t kWWords = K::kWWords;
  const uint32_t g = t.g, q = t.q, lane = threadIdx.x % 32;
  const mma::FragC kHiC{{kHiBits, kHiBits, kHiBits, kHiBits}}, kLoC{{kLoBits, kLoBits, kLoBits, kLoBits}};
  // B: lane l gives token l % 8 of an 8-token tile, at the step's high-byte words (+ 4 for odd l / 8)
  // and its low-byte words (+ 32 for l / 16 = 1): registers 0, 1 the high bytes' fragment, 2, 3 the low.
  const uint32_t* xrow = &s.x[(t.token(0) + lane % 8) * kXWords + 4 * (lane / 8 % 2) + 32 * (lane / 16)];
  uint32_t high[2][4];
  if constexpr (K::kHighBits) {  // the fifth bits of the k-tile's columns: words 16 + q and 20 + q
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      load_a<kWWords>(high[i], &s.w[t.lrb[i] * kWWords], 16);
      // Sub-block step's bit to bit `step` of each byte (an odd k-tile's sub-blocks are bits 4..7;
      // what the shift brings in from the next byte lands above bit 3, where no step reads).
#pragma unroll
      for (int k = 0; k < 4; ++k) high[i][k] >>= 4 * (kt % 2);
    }
  }
#pragma unroll
  for (uint32_t c = 0; c < kSteps / 2; ++c) {  // the sub-blocks of 64 columns share their bytes
    uint32_t raw[2][4];
#pragma unroll
    for (int i = 0; i < 2 && !K::kDecoded; ++i) load_a<kWWords>(raw[i], &s.w[t.lrb[i] * kWWords], 8 * c);
#pragma unroll
    for (uint32_t h = 0; h < 2; ++h) {
      const uint32_t step = 2 * c + h;
      mma::FragA A[2];
      float dw[2][2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        if constexpr (K::kDecoded) {  // int8 values in column order: words 8 * step + q and + 4
          load_a<kWWords>(A[i].r, &s.w[t.lrb[i] * kWWords], 8 * step);
        } else {
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            if constexpr (K::kHighBits) {
              A[i].r[k] = ((raw[i][k] >> (4 * h)) & 0x0f0f0f0fu) | ((high[i][k] << (4 - step)) & 0x10101010u);
            } else {  // Q4_K's high nibbles as they lie: 16 times their value (store_factors' 1/16)
              A[i].r[k] = raw[i][k] & (h == 0 ? 0x0f0f0f0fu : 0xf0f0f0f0u);
            }
          }
        }
        dw[i][0] = s.wf[step][t.lrb[i] + g].x;
        dw[i][1] = s.wf[step][t.lrb[i] + g + 8].x;
      }
#pragma unroll
      for (int n = 0; n < NL && LAG == 0; ++n) {  // no lag: each tile's terms right after its MMAs
        uint32_t b[4];
        mma::ldmatrix_x4(b, xrow + 16 * n * kXWords + 8 * step);
        const mma::FragB bh{{b[0], b[1]}}, bl{{b[2], b[3]}};
        const float2 dx = *reinterpret_cast<const float2*>(&s.xd[step][t.token(n) + 2 * q]);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          mma::FragC ch, cl;
          mma::mma_k32<K::kDecoded, true>(ch, A[i], bh, kHiC);  // IQ3_S's values are signed, the nibbles not
          mma::mma_k32<K::kDecoded, false>(cl, A[i], bl, kLoC);
          add_terms(acc[i][n], ch, cl, dw[i], dx);
        }
      }
      // Tile n's MMAs are issued before the f32 terms of tile n - LAG, so that more of them are in
      // flight before their sums are read (the same operations on each output, in the same order).
      mma::FragC ch[LAG + 1][2], cl[LAG + 1][2];
      float2 dx[LAG + 1];
#pragma unroll
      for (int n = 0; n < NL + LAG && LAG > 0; ++n) {
        if (n < NL) {
          uint32_t b[4];
          mma::ldmatrix_x4(b, xrow + 16 * n * kXWords + 8 * step);
          const mma::FragB bh{{b[0], b[1]}}, bl{{b[2], b[3]}};
          dx[n % (LAG + 1)] = *reinterpret_cast<const float2*>(&s.xd[step][t.token(n) + 2 * q]);
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            // IQ3_S's values are signed, the nibbles not
            mma::mma_k32<K::kDecoded, true>(ch[n % (LAG + 1)][i], A[i], bh, kHiC);
            mma::mma_k32<K::kDecoded, false>(cl[n % (LAG + 1)][i], A[i], bl, kLoC);
          }
        }
        if (n >= LAG) {
          const int m = n - LAG, c = m % (LAG + 1);
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            add_terms(acc[i][m], ch[c][i], cl[c][i], dw[i], dx[c]);
          }
        }
      }
    }
  }
  if constexpr (!K::kDecoded) minimum_terms<T, NL>(s, t, acc);
}

// multiply for the warp's live tiles (warp-uniform; a warp without tokens has no products).
template <int T>
__device__ __forceinline__ void multiply_live(const Stage<T>& s, uint32_t kt, const WarpTile& t,
                                              float (&acc)[2][4][4]) {
  switch (t.live) {
    case 4: multiply<T, 4>(s, kt, t, acc); break;
    case 3: multiply<T, 3>(s, kt, t, acc); break;
    case 2: multiply<T, 2>(s, kt, t, acc); break;
    case 1: multiply<T, 1>(s, kt, t, acc); break;
    default: break;
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

template <int T, int NM>
__global__ void __launch_bounds__(kThreads, 2) kquant_int8_kernel(Int8Args a) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ uint32_t grid[KQuant<T>::kDecoded ? 512 : 1];
  Stage<T>* st = reinterpret_cast<Stage<T>*>(smem);
  __shared__ uint32_t tile_of[3];  // the block's expert, its first sorted row and its tokens
  const uint32_t tile = blockIdx.y;
  if (tile >= a.tiles[a.E]) return;  // the grid is sized for the most tiles the routes can make
  // The tile's expert, the one e with tiles[e] <= tile < tiles[e + 1], by one pass of the block over
  // the tile starts: a wait or two on memory before the first copies, not a binary search's ~log2(E).
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
  bt.m0 = blockIdx.x * (BR / NM);
  TileLoader<T, NM> ld(a, bt);
  const WarpTile wt = warp_tile<NM>(bt.ntok);
  float acc[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int n = 0; n < 4; ++n) {
#pragma unroll
      for (int k = 0; k < 4; ++k) acc[i][n][k] = 0.0f;
    }
  }

  // k-tile kt's copies and factors are in buffer kt % 2. One barrier a k-tile: after it, kt's copies
  // (waited for) and factors (stored before it) are seen by every warp, and every warp is done with
  // k-tile kt - 1's buffer, into which kt + 1's copies are then issued (and, where kt + 1 starts a
  // K-quant block, its header loaded; the block's two k-tiles share it) before kt's products; kt +
  // 1's factors are stored at the top of the next iteration.
  const uint32_t ktiles = a.cols / BK;
  ld.load_headers(0);
  ld.issue(a, 0, st[0]);
  for (uint32_t kt = 0; kt < ktiles; ++kt) {
    const uint32_t b = kt % 2;
    ld.store_factors(kt, st[b], grid);
    cp_wait<0>();
    __syncthreads();
    if (kt + 1 < ktiles) {
      ld.issue(a, kt + 1, st[1 - b]);
      if (KQuant<T>::kDecoded || (kt + 1) % 2 == 0) ld.load_headers(kt + 1);
    }
    multiply_live<T>(st[b], kt, wt, acc);
  }
  store_outputs<NM>(a, bt, wt, acc);
}

// The kernel's type id for weights of `type`, or -1 where it has none.
int int8_type(model::GgmlType type) {
  switch (type) {
    case model::GgmlType::Q4_K: return qd::kQ4_K;
    case model::GgmlType::Q5_K: return qd::kQ5_K;
    case model::GgmlType::IQ3_S: return qd::kIQ3_S;
    default: return -1;
  }
}

template <int NM>
const void* kernel_of(int t) {
  return t == qd::kQ4_K   ? reinterpret_cast<const void*>(kquant_int8_kernel<qd::kQ4_K, NM>)
         : t == qd::kQ5_K ? reinterpret_cast<const void*>(kquant_int8_kernel<qd::kQ5_K, NM>)
                          : reinterpret_cast<const void*>(kquant_int8_kernel<qd::kIQ3_S, NM>);
}
const void* kernel_of(int t, bool up) { return up ? kernel_of<2>(t) : kernel_of<1>(t); }

bool same_layout(const DevMatrix& a, const DevMatrix& b) {
  return a.type == b.type && a.rows == b.rows && a.cols == b.cols && a.row_bytes == b.row_bytes;
}

// Where the quantized rows go in the split scratch: the bytes in hi, the block factors in lo from
// its first 16-byte boundary; null where they do not fit.
struct QuantScratch {
  uint8_t* q = nullptr;
  float2* f = nullptr;
};
QuantScratch quant_scratch(const SplitScratch& split, uint32_t rows, uint32_t cols) {
  if (split.hi == nullptr || split.lo == nullptr || reinterpret_cast<uintptr_t>(split.hi) % 16 != 0) return {};
  const size_t part = split.elems * 2;  // bytes of each part
  const uintptr_t lo = reinterpret_cast<uintptr_t>(split.lo), lo16 = (lo + 15) / 16 * 16;
  const size_t need_q = size_t{rows} * cols * 2, need_f = size_t{rows} * (cols / 32) * sizeof(float2);
  if (need_q > part || lo16 - lo + need_f > part) return {};
  return {static_cast<uint8_t*>(split.hi), reinterpret_cast<float2*>(lo16)};
}

}  // namespace

bool grouped_int8_takes(const ExpertMatrices& w, const ExpertMatrices* up, const float* x, size_t ldx,
                        uint32_t x_rows, const SplitScratch& split) {
  const int t = int8_type(w.m.type);
  if (t < 0 || w.m.cols == 0 || w.m.cols % 256 != 0) return false;
  const uint32_t block = t == qd::kQ4_K   ? KQuant<qd::kQ4_K>::kBlockBytes
                         : t == qd::kQ5_K ? KQuant<qd::kQ5_K>::kBlockBytes
                                          : KQuant<qd::kIQ3_S>::kBlockBytes;
  if (w.m.row_bytes != size_t{w.m.cols} / 256 * block) return false;
  if (up != nullptr && !same_layout(w.m, up->m)) return false;
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0 || ldx % 4 != 0 || ldx < w.m.cols) return false;
  if (quant_scratch(split, x_rows, w.m.cols).q == nullptr) return false;
  return code_built_for(kernel_of(t, up != nullptr), 8);
}

namespace {

template <int T, int NM>
void launch(const Int8Args& a, dim3 grid, cudaStream_t stream) {
  constexpr size_t smem = 2 * sizeof(Stage<T>);
  FERRY_CUDA(cudaFuncSetAttribute(kquant_int8_kernel<T, NM>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(smem)));
  kquant_int8_kernel<T, NM><<<grid, kThreads, smem, stream>>>(a);
}

template <int NM>
void launch(int t, const Int8Args& a, dim3 grid, cudaStream_t stream) {
  if (t == qd::kQ4_K) {
    launch<qd::kQ4_K, NM>(a, grid, stream);
  } else if (t == qd::kQ5_K) {
    launch<qd::kQ5_K, NM>(a, grid, stream);
  } else {
    launch<qd::kIQ3_S, NM>(a, grid, stream);
  }
}

}  // namespace

void grouped_gemm_int8(const ExpertMatrices& w, const ExpertMatrices* up, const float* x, size_t ldx, uint32_t x_rows,
                       const int32_t* gather, const RouteSort& sort, uint32_t routes, uint32_t E, float limit, float* y,
                       size_t ldy, const SplitScratch& split, cudaStream_t stream) {
  if (routes == 0 || w.m.rows == 0 || x_rows == 0) return;
  if (!grouped_int8_takes(w, up, x, ldx, x_rows, split)) {
    throw CudaError("grouped_gemm_int8: not an int8 call (Q4_K / Q5_K / IQ3_S rows of whole blocks, gate and up "
                    "alike, aligned input, a scratch for " + std::to_string(x_rows) + " x " +
                    std::to_string(w.m.cols) + " values, sm80+ code)");
  }
  if (gather == nullptr && x_rows < routes) {
    throw CudaError("grouped_gemm_int8: " + std::to_string(routes) + " routes read rows of an input of " +
                    std::to_string(x_rows));
  }
  if (w.table == nullptr && w.m.data == nullptr) throw CudaError("grouped_gemm_int8: no expert weights");
  const uint32_t cols = w.m.cols;
  const QuantScratch qs = quant_scratch(split, x_rows, cols);
  const size_t pieces = size_t{x_rows} * (cols / 16);
  if ((pieces + 255) / 256 > 0x7fffffffu) throw CudaError("grouped_gemm_int8: too many input rows");
  quantize_rows_kernel<<<static_cast<unsigned>((pieces + 255) / 256), 256, 0, stream>>>(x, ldx, x_rows, cols, qs.q,
                                                                                       qs.f);
  FERRY_CUDA_LAUNCHED();

  Int8Args a{};
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
  a.xq = qs.q;
  a.xf = qs.f;
  a.gather = gather;
  a.offsets = sort.offsets;
  a.tiles = sort.tiles;
  a.E = E;
  a.y = y;
  a.ldy = ldy;
  a.limit = limit;
  // Each expert with c rows makes ceil(c / BN) tiles: at most routes / BN + one per used expert.
  const size_t max_tiles = (size_t{routes} + BN - 1) / BN + std::min(E, routes);
  const uint32_t rm = up != nullptr ? BR / 2 : BR;
  const size_t row_tiles = (size_t{w.m.rows} + rm - 1) / rm;
  if (max_tiles > 65535 || row_tiles > 0x7fffffffu) {
    throw CudaError("grouped_gemm_int8: " + std::to_string(routes) + " routes over " + std::to_string(w.m.rows) +
                    " rows make too large a grid");
  }
  const dim3 grid(static_cast<uint32_t>(row_tiles), static_cast<uint32_t>(max_tiles));
  const int t = int8_type(w.m.type);
  if (t == qd::kIQ3_S) a.iq3s_grid = iq3s_grid_address();
  if (up != nullptr) {
    launch<2>(t, a, grid, stream);
  } else {
    launch<1>(t, a, grid, stream);
  }
  FERRY_CUDA_LAUNCHED();
}

}  // namespace ferry::gpu
