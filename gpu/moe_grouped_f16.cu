// The grouped expert GEMMs on fp16 tensor cores over exact integer weights for Q4_K and Q5_K
// (gpu/moe_grouped_f16.hpp says what and why).
//
// First a pass quantizes each input row as the decode matvec does (int16 values, a step per 32) and
// writes each value times its step, scaled by a power of two that brings the row's largest |x| into
// [2^11, 2^12), as an fp16 high part (xh) and the rest (xl); per 32 values the f32 sum of x (the
// K-quant minimum terms) under the same power of two, and per row that power's inverse. Within each
// 16 columns the values lie even columns first, then odd: the order in which a lane's weight bytes
// give its fp16 pairs (below).
//
// A block: 8 warps over 128 weight rows (64 each of gate and up, whose SwiGLU is then taken in
// registers) x the 64 sorted rows of a token tile, k-tiles of 128 columns copied by cp.async into
// two buffers. A warp multiplies 32 weight rows x 32 tokens: per 32-column sub-block its A
// fragments are its rows' quant bytes turned into fp16 by a mask and the bits of 1024 (or 1152 for
// IQ3_S's signed bytes) and one HFMA2 with the sub-block's scale (exact: scale * q is a small
// integer), then 2 x 4 tiles of m16n8k16 against the inputs' high and low parts. A 256-column
// block's sums stay in the tensor cores' f32 accumulators; d multiplies them once the block is done,
// and the minimum terms (dmin * min_j * sum_j(x)) are a tf32 product a k-tile.
#include "gpu/moe_grouped_f16.hpp"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "gpu/block_reduce.cuh"
#include "gpu/cuda_check.hpp"
#include "gpu/mma_f16.cuh"
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
static_assert(BN == 64 && BR == 128 && kThreads == 256, "moe_grouped_f16: thread maps assume 64 x 128 tiles, 256 threads");
// A token's k-tile in shared memory: 64 words of high parts, 64 of low parts, padded to 132 words
// apart so that the 8 tokens' 16-byte rows of one ldmatrix matrix hit 32 banks.
constexpr uint32_t kXWords = 132;
constexpr int kRowExp = 12;  // a row's largest |x| is scaled into [2^(kRowExp - 1), 2^kRowExp)

// Per type: a block's bytes, where its 128 bytes of nibbles lie (Q4_K, Q5_K: d, dmin and 12 bytes of
// scales first), and the words of a weight row's k-tile in shared memory: 16 of nibbles (and for
// Q5_K the block's 8 words of fifth bits), padded so that rows 20 / 28 words apart hit 32 banks.
// IQ3_S's values come from a grid with signs, so its k-tile is decoded into 32 words of int8 a row
// (36 apart) instead of copied; it has no minimum terms. kBits: what a value's masked byte is XORed
// with to make the fp16 pair (1024 + the bits; IQ3_S's signed bytes 1152 + the value), kBias that
// number. Factor: a sub-block's scale and offset as half2 pairs (IQ3_S: the scale alone, so that its
// two stages, whose decoded rows take more room, fit twice an SM; its offset is made in the products).
template <int T> struct KQuant;
template <> struct KQuant<qd::kQ4_K> {
  static constexpr uint32_t kBlockBytes = 144, kNibbles = 16, kWWords = 20, kBits = 0x64006400u;
  static constexpr bool kHighBits = false, kDecoded = false;
  static constexpr float kBias = 1024.0f;
  using Factor = uint2;
};
template <> struct KQuant<qd::kQ5_K> {
  static constexpr uint32_t kBlockBytes = 176, kNibbles = 48, kWWords = 28, kBits = 0x64006400u;
  static constexpr bool kHighBits = true, kDecoded = false;  // bit j of byte l of the 32 at 16: sub-block j's column l
  static constexpr float kBias = 1024.0f;
  using Factor = uint2;
};
template <> struct KQuant<qd::kIQ3_S> {
  static constexpr uint32_t kBlockBytes = 110, kNibbles = 0, kWWords = 36, kBits = 0x64806480u;
  static constexpr bool kHighBits = false, kDecoded = true;
  static constexpr float kBias = 1152.0f;
  using Factor = uint32_t;
};

template <int T>
struct Stage {
  // IQ3_S has no minimum terms: their arrays keep 16 bytes.
  static constexpr bool kMin = !KQuant<T>::kDecoded;
  static constexpr uint32_t kMS = kMin ? kSteps : 1, kMR = kMin ? BR : 4, kMT = kMin ? BN + 8 : 4;
  uint32_t w[BR * KQuant<T>::kWWords];
  uint32_t x[BN * kXWords];
  typename KQuant<T>::Factor wf[kSteps][BR];  // per sub-block and weight row: the decode's scale (and offset)
  float dk[BR];         // per weight row: 1 / d (even k-tiles) or d (odd)
  float wm[kMS][kMR];   // K-quants: per sub-block and row its 6-bit min
  float dmin[kMR];      // per row dmin / d
  float xs[kMS][kMT];   // per block and token: the scaled f32 sum (rows 8 banks apart)
};
static_assert(sizeof(Stage<qd::kQ4_K>) % 16 == 0 && sizeof(Stage<qd::kQ5_K>) % 16 == 0 &&
                  sizeof(Stage<qd::kIQ3_S>) % 16 == 0,
              "stages stay 16-byte aligned");

struct F16Args {
  const uint8_t* base[2];
  size_t stride[2];
  const uint8_t* const* table[2];
  uint32_t rows, cols;
  size_t row_bytes;
  const __half* xh;  // the inputs' high parts, cols apart
  const __half* xl;  // and low parts
  const float* xs;   // per 32 values their scaled sum, cols / 32 apart
  const float* xp;   // per input row: what its products are multiplied by (the power of two's inverse)
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

__device__ __forceinline__ void cp_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group 0;" ::: "memory");
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

// Its 32 values as int8 (column order, four a word: grid entries with their signs).
__device__ __forceinline__ void iq3s_decode(const uint32_t (&u)[4], const uint32_t* grid, uint32_t (&v)[8]) {
#pragma unroll
  for (int g = 0; g < 8; ++g) {
    const uint32_t qs = ((g < 4 ? u[0] : u[1]) >> (8 * (g & 3))) & 0xff;
    const uint32_t entry = grid[qs | (((u[3] >> g) & 1) << 8)];
    // Sign bit k to byte k, then 0xff in negative bytes: (e ^ 0xff) - 0xff is -e bytewise.
    const uint32_t neg = ((((u[2] >> (4 * g)) & 0xf) * 0x00204081u) & 0x01010101u) * 0xffu;
    v[g] = __vsub4(entry ^ neg, neg);
  }
}

__device__ __forceinline__ uint32_t half2_of(float v) {
  const __half2 h = __float2half2_rn(v);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// One row's values of a 16-value piece, even columns first: its fp16 high and low parts.
__device__ __forceinline__ void split_piece(const uint32_t (&packed)[8], float step, uint32_t (&hi)[8],
                                            uint32_t (&lo)[8]) {
  float v[16];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    v[k] = static_cast<float>(static_cast<int16_t>(packed[k] & 0xffffu)) * step;  // column 2k
    v[8 + k] = static_cast<float>(static_cast<int32_t>(packed[k]) >> 16) * step;  // column 2k + 1
  }
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const __half2 h = __floats2half2_rn(v[2 * k], v[2 * k + 1]);
    const float2 f = __half22float2(h);
    const __half2 l = __floats2half2_rn(v[2 * k] - f.x, v[2 * k + 1] - f.y);
    hi[k] = *reinterpret_cast<const uint32_t*>(&h);
    lo[k] = *reinterpret_cast<const uint32_t*>(&l);
  }
}

// A block a row: the row's largest |x| first (its power of two), then each thread's 16-value
// pieces as quantize_rows_kernel of the int8 path makes them, written as split_piece's parts.
__global__ void __launch_bounds__(256) quantize_rows_f16_kernel(const float* x, size_t ldx, uint32_t cols, __half* xh,
                                                                __half* xl, float* xs, float* xp) {
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
    uint32_t packed[8], hi[8], lo[8];
    x16_pack(v, a32, packed);
    split_piece(packed, x32_scale(a32) * scale, hi, lo);
    const size_t at = static_cast<size_t>(r) * cols + 16 * p;
    uint4* dh = reinterpret_cast<uint4*>(xh + at);
    uint4* dl = reinterpret_cast<uint4*>(xl + at);
    dh[0] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
    dh[1] = make_uint4(hi[4], hi[5], hi[6], hi[7]);
    dl[0] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
    dl[1] = make_uint4(lo[4], lo[5], lo[6], lo[7]);
    if (p % 2 == 0) xs[static_cast<size_t>(r) * (cols / 32) + p / 2] = sum32 * scale;
  }
}

// A block's tile: its expert, first sorted row, tokens and first weight row.
struct BlockTile {
  uint32_t e = 0, first = 0, ntok = 0, m0 = 0;
};

// What a thread copies of each k-tile, and the bytes it makes the weight factors from. Weight items
// tid and tid + 256 of 128 rows x 4 chunks (row item / 4; chunk, and the sub-block whose factors
// the thread makes, tid % 4); Q5_K's fifth bits, 128 rows x 2 chunks (row tid / 2, chunk tid % 2);
// the inputs of token tid / 4: chunks tid % 4 + 4i of its 16 high and 16 low, and the sum of its
// block tid % 4. Rows past the matrix and tokens past the tile read row rows - 1 and the tile's
// first token: their products are not stored.
template <int T, int NM>
struct TileLoader {
  using K = KQuant<T>;
  static constexpr uint32_t RM = BR / NM;  // rows of each matrix in the block
  const uint8_t* wrow[2];
  uint32_t wlr[2];
  const uint8_t* hrow = nullptr;
  size_t xrow;   // the token's input row
  bool xlive;    // its 8-token tile holds tokens: what the products read
  bool w16 = true;     // every matrix 16-byte aligned (blocks of 144 / 176 bytes): 16-byte copies
  uint32_t dd[2], scm[2][2];  // K-quants: the weight items' blocks' d and dmin, sc | m << 8 of their sub-blocks
  uint32_t iq[2][4];          // IQ3_S: the bytes of the weight items' sub-blocks

  __device__ TileLoader(const F16Args& a, const BlockTile& bt) {
    const uint32_t tid = threadIdx.x;
    const uint8_t* w[NM];
#pragma unroll
    for (int m = 0; m < NM; ++m) {
      w[m] = a.table[m] != nullptr ? a.table[m][bt.e] : a.base[m] + bt.e * a.stride[m];
      w16 = w16 && reinterpret_cast<uintptr_t>(w[m]) % 16 == 0;
    }
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
    const uint32_t tok = tid / 4, t = tok < bt.ntok ? tok : 0;
    xrow = a.gather != nullptr ? static_cast<size_t>(a.gather[bt.first + t]) : bt.first + t;
    xlive = tok < (bt.ntok + 7) / 8 * 8;
  }

  // k-tile kt's copies into s, one group.
  __device__ void issue(const F16Args& a, uint32_t kt, Stage<T>& s) const {
    const uint32_t tid = threadIdx.x, wch = tid % 4;
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
    if (xlive) {
      const size_t at = xrow * a.cols + BK * kt;
      uint32_t* dst = &s.x[(tid / 4) * kXWords];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t c = wch + 4 * i;  // 8 values a chunk
        cp_async(dst + 4 * c, a.xh + at + 8 * c, 16);
        cp_async(dst + 64 + 4 * c, a.xl + at + 8 * c, 16);
      }
      if constexpr (!K::kDecoded) cp_async(&s.xs[wch][tid / 4], a.xs + xrow * (a.cols / 32) + kSteps * kt + wch, 4);
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

  // The headers of k-tile kt's blocks (kt even) into what store_factors reads for kt and kt + 1
  // (IQ3_S: k-tile kt's sub-blocks).
  __device__ void load_headers(uint32_t kt) {
    const uint32_t wch = threadIdx.x % 4;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const uint8_t* p = wrow[j] + (kt / 2) * K::kBlockBytes;
      if constexpr (K::kDecoded) {
        iq3s_load(p, kSteps * (kt % 2) + wch, iq[j]);
      } else {
        uint32_t h[4];
        if (w16) {
          const uint4 v = *reinterpret_cast<const uint4*>(p);
          h[0] = v.x, h[1] = v.y, h[2] = v.z, h[3] = v.w;
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i) h[i] = qd::ld_u32(p + 4 * i);
        }
        dd[j] = h[0];
#pragma unroll
        for (int o = 0; o < 2; ++o) {
          uint32_t sc, m;
          k4_scale_min(h, kSteps * o + wch, sc, m);
          scm[j][o] = sc | m << 8;
        }
      }
    }
  }

  // k-tile kt's weight factors into s. The decode gives a nibble n as the fp16 1024 + n (Q4_K's
  // high nibbles 1024 + 16 n; Q5_K's five bits 1024 + q), so scale * value + offset is the exact
  // integer sc * q.
  __device__ void store_factors(uint32_t kt, Stage<T>& s, const uint32_t* grid) const {
    const uint32_t wch = threadIdx.x % 4;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      float d;
      if constexpr (K::kDecoded) {  // the sub-block's values into words 8 * wch.. of the row
        uint32_t v[8];
        iq3s_decode(iq[j], grid, v);
        uint4* dst = reinterpret_cast<uint4*>(&s.w[wlr[j] * K::kWWords + 8 * wch]);
        dst[0] = make_uint4(v[0], v[1], v[2], v[3]);
        dst[1] = make_uint4(v[4], v[5], v[6], v[7]);
        d = qd::h2f(iq[j][3] >> 16);
        s.wf[wch][wlr[j]] = half2_of(d == 0.0f ? 0.0f : static_cast<float>(1 + 2 * ((iq[j][3] >> 8) & 0xf)));
      } else {
        const uint32_t v = kt % 2 == 0 ? scm[j][0] : scm[j][1], sc = v & 0xff, m = v >> 8;
        d = qd::h2f(dd[j] & 0xffff);
        // A block of d 0 adds nothing: its values decode to 0 and the rows' sums keep their scale.
        const float scale =
            d == 0.0f ? 0.0f : static_cast<float>(sc) * (!K::kHighBits && wch % 2 == 1 ? 0.0625f : 1.0f);
        s.wf[wch][wlr[j]] = make_uint2(half2_of(scale), half2_of(-K::kBias * scale));
        s.wm[wch][wlr[j]] = static_cast<float>(m);
        if (wch == 0) s.dmin[wlr[j]] = qd::h2f(dd[j] >> 16) / (d == 0.0f ? 1.0f : d);
      }
      if (wch == 0) s.dk[wlr[j]] = d == 0.0f ? 1.0f : kt % 2 == 0 ? 1.0f / d : d;
    }
  }
};

// A warp's part of the block's tile: two 16-row tiles (32 rows of the matrix, or 16 of gate and of
// up) x four of the tile's eight 8-token tiles, every other one (n-th: tokens 8 * (2n + wt)..); the
// first `live` of them hold tokens. C's layout: acc[i][n][k], k = 0, 1 row g, tokens 2q, 2q + 1 of
// the n-th; k = 2, 3 row g + 8.
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
  const uint32_t tiles = (ntok + 7) / 8;
  t.live = tiles > t.wt ? min(4u, (tiles - t.wt + 1) / 2) : 0;
  return t;
}

// The words of a 16-row tile whose rows are kWWords apart from `rows`, 16-byte chunks at word
// offsets `word` (registers 0, 1: rows g, g + 8, word q) and `word` + 4 (2, 3), by ldmatrix.
template <uint32_t kWWords>
__device__ __forceinline__ void load_a(uint32_t (&r)[4], const uint32_t* rows, uint32_t word) {
  const uint32_t lane = threadIdx.x % 32;
  mma::ldmatrix_x4(r, rows + (lane % 8 + 8 * (lane / 8 % 2)) * kWWords + word + 4 * (lane / 16));
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
// Bytes 0 and 2 of w (the caller shifts for 1 and 3), masked, XORed with `bits` (KQuant::kBits): fp16
// bias + their value, then * scale + offset (-bias * scale): the exact integer scale * value.
__device__ __forceinline__ uint32_t decode_pair(uint32_t w, uint32_t mask, uint32_t bits, uint32_t scale,
                                                uint32_t offset) {
  const uint32_t v = (w & mask) ^ bits;
  return mma::half2_bits(__hfma2(mma::bits_half2(v), mma::bits_half2(scale), mma::bits_half2(offset)));
}

// The A fragment of a k16 half of a sub-block for a 16-row tile from the words of its values (r[0],
// r[1]: rows g, g + 8, the half's columns 4q..4q + 3), each byte's value masked: registers 0 / 1 are
// bytes 0 and 2 of rows g / g + 8 (logical k 2q, 2q + 1: columns 4q, 4q + 2), 2 / 3 bytes 1 and 3
// (logical k 8 + 2q..: columns 4q + 1, 4q + 3), the order the inputs are written in (even columns,
// then odd); f: rows g and g + 8's scale and offset.
__device__ __forceinline__ void decode_a(const uint32_t (&r)[2], uint32_t mask, uint32_t bits, const uint2 (&f)[2],
                                         uint32_t (&A)[4]) {
#pragma unroll
  for (int row = 0; row < 2; ++row) {
    A[row] = decode_pair(r[row], mask, bits, f[row].x, f[row].y);
    A[2 + row] = decode_pair(r[row] >> 8, mask, bits, f[row].x, f[row].y);
  }
}

// Rows g and g + 8's scale and offset of a sub-block.
template <int T>
__device__ __forceinline__ void factors(const Stage<T>& s, uint32_t step, uint32_t row, uint2 (&f)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if constexpr (KQuant<T>::kDecoded) {
      const uint32_t scale = s.wf[step][row + 8 * r];
      f[r] = make_uint2(scale, mma::half2_bits(__hmul2(mma::bits_half2(scale), __float2half2_rn(-KQuant<T>::kBias))));
    } else {
      f[r] = s.wf[step][row + 8 * r];
    }
  }
}
#endif

// The K-quants' minimum terms of a k-tile, sum_j min_j * sum_j(x) over its 4 sub-blocks (the k of one
// tf32 m16n8k4), on tensor cores: the 6-bit mins are exact in tf32, each f32 sum is split into a tf32
// head and the rest, and dmin times the result is taken off in f32: one FFMA an output a k-tile.
template <int T, int NL>
__device__ __forceinline__ void minimum_terms(const Stage<T>& s, const WarpTile& t, float (&acc)[2][4][4]) {
  const uint32_t g = t.g, q = t.q;
  uint32_t am[2][2];
  float dmin[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      am[i][r] = __float_as_uint(s.wm[q][t.lrb[i] + g + 8 * r]);
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

// Each row's sums divided by d of its 256-column block while the block's products accumulate onto
// them (k = 2, 3: row g + 8): by s.dk, 1 / d before an even k-tile, d after an odd one.
template <int NL>
__device__ __forceinline__ void rescale(const float* dk, const WarpTile& t, float (&acc)[2][4][4]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float f[2] = {dk[t.lrb[i] + t.g], dk[t.lrb[i] + t.g + 8]};
#pragma unroll
    for (int n = 0; n < NL; ++n) {
#pragma unroll
      for (int k = 0; k < 4; ++k) acc[i][n][k] *= f[k / 2];
    }
  }
}

// One k-tile's products of a warp with NL live 8-token tiles (k-tile kt, in s) onto acc, the rows'
// sums over d of the 256-column block (rescale): a block's products accumulate inside the tensor
// cores, and its d costs two multiplications an output, not one a sub-block.
template <int T, int NL>
__device__ __forceinline__ void multiply(const Stage<T>& s, uint32_t kt, const WarpTile& t, float (&acc)[2][4][4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using K = KQuant<T>;
  constexpr uint32_t kWWords = K::kWWords;
  const uint32_t g = t.g, lane = threadIdx.x % 32;
  if (kt % 2 == 0) rescale<NL>(s.dk, t, acc);
  // B: lane l gives token l % 8 of an 8-token tile, the high parts (l < 16) or low, of the k16
  // half's first or second 8 values (odd l / 8): registers 0, 1 the high parts' fragment, 2, 3 the low.
  const uint32_t* xrow = &s.x[(t.token(0) + lane % 8) * kXWords + 64 * (lane / 16) + 4 * (lane / 8 % 2)];
#pragma unroll 1
  for (uint32_t c = 0; c < kSteps / 2; ++c) {  // the sub-blocks of 64 columns share their bytes
    uint32_t raw[2][4], high[2][4];
#pragma unroll
    for (int i = 0; i < 2 && !K::kDecoded; ++i) {
      load_a<kWWords>(raw[i], &s.w[t.lrb[i] * kWWords], 8 * c);
      if constexpr (K::kHighBits) {  // the fifth bits of the k-tile's columns: words 16 + q and 20 + q
        load_a<kWWords>(high[i], &s.w[t.lrb[i] * kWWords], 16);
#pragma unroll
        for (int k = 0; k < 4; ++k) high[i][k] >>= 4 * (kt % 2);
      }
    }
#pragma unroll
    for (uint32_t h = 0; h < 2; ++h) {
      const uint32_t step = 2 * c + h;
#pragma unroll
      for (int i = 0; i < 2 && K::kDecoded; ++i) {  // int8 values in column order: words 8 * step + q and + 4
        load_a<kWWords>(raw[i], &s.w[t.lrb[i] * kWWords], 8 * step);
      }
#pragma unroll
      for (int m = 0; m < 2; ++m) {  // the sub-block's k16 halves
        uint32_t A[2][4];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          uint2 f[2];
          factors<T>(s, step, t.lrb[i] + g, f);
          const uint32_t r[2] = {raw[i][2 * m], raw[i][2 * m + 1]};
          if constexpr (K::kHighBits) {
            uint32_t u[2];
#pragma unroll
            for (int k = 0; k < 2; ++k) {
              u[k] = ((r[k] >> (4 * h)) & 0x0f0f0f0fu) | ((high[i][2 * m + k] << (4 - step)) & 0x10101010u);
            }
            decode_a(u, 0x001f001fu, K::kBits, f, A[i]);
          } else if constexpr (K::kDecoded) {
            decode_a(r, 0x00ff00ffu, K::kBits, f, A[i]);
          } else {  // Q4_K's high nibbles as they lie: 1024 + 16 n (store_factors' scale / 16)
            decode_a(r, h == 0 ? 0x000f000fu : 0x00f000f0u, K::kBits, f, A[i]);
          }
        }
        // Every tile's high-part product, then every tile's low-part one: each product onto an
        // accumulator is issued 2 NL products after the one before it, not right behind it.
        uint32_t b[NL][4];
#pragma unroll
        for (int n = 0; n < NL; ++n) mma::ldmatrix_x4(b[n], xrow + 16 * n * kXWords + 8 * (2 * step + m));
#pragma unroll
        for (int part = 0; part < 2; ++part) {
#pragma unroll
          for (int n = 0; n < NL; ++n) {
#pragma unroll
            for (int i = 0; i < 2; ++i) mma::mma_f16(acc[i][n], A[i], b[n][2 * part], b[n][2 * part + 1]);
          }
        }
      }
    }
  }
  if constexpr (!K::kDecoded) minimum_terms<T, NL>(s, t, acc);
  if (kt % 2 == 1) rescale<NL>(s.dk, t, acc);
#else
  (void)s, (void)kt, (void)t, (void)acc;
  __trap();
#endif
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

// The warp's outputs of the tile's tokens and the matrix's rows (NM 2: SwiGLU of gate and up), each
// token's times its row's xp.
template <int NM>
__device__ __forceinline__ void store_outputs(const F16Args& a, const BlockTile& bt, const WarpTile& t,
                                              const float (&acc)[2][4][4]) {
#pragma unroll
  for (int n = 0; n < 4; ++n) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t tok = t.token(n) + 2 * t.q + k % 2;
      if (tok >= bt.ntok) continue;
      const uint32_t src = a.gather != nullptr ? static_cast<uint32_t>(a.gather[bt.first + tok]) : bt.first + tok;
      const float p = a.xp[src];
      float* yt = a.y + static_cast<size_t>(bt.first + tok) * a.ldy;
      if constexpr (NM == 2) {
        const uint32_t row = bt.m0 + t.lrb[0] + t.g + 8 * (k / 2);
        if (row < a.rows) yt[row] = swiglu_value(acc[0][n][k] * p, acc[1][n][k] * p, a.limit);
      } else {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const uint32_t row = bt.m0 + t.lrb[i] + t.g + 8 * (k / 2);
          if (row < a.rows) yt[row] = acc[i][n][k] * p;
        }
      }
    }
  }
}

template <int T, int NM>
__global__ void __launch_bounds__(kThreads, 2) kquant_f16_kernel(F16Args a) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ uint32_t grid[KQuant<T>::kDecoded ? 512 : 1];
  Stage<T>* st = reinterpret_cast<Stage<T>*>(smem);
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
  // As the int8 kernel: k-tile kt's copies and factors in buffer kt % 2, one barrier a k-tile.
  const uint32_t ktiles = a.cols / BK;
  ld.load_headers(0);
  ld.issue(a, 0, st[0]);
  for (uint32_t kt = 0; kt < ktiles; ++kt) {
    const uint32_t b = kt % 2;
    ld.store_factors(kt, st[b], grid);
    cp_wait_all();
    __syncthreads();
    if (kt + 1 < ktiles) {
      ld.issue(a, kt + 1, st[1 - b]);
      if (KQuant<T>::kDecoded || (kt + 1) % 2 == 0) ld.load_headers(kt + 1);
    }
    multiply_live<T>(st[b], kt, wt, acc);
  }
  store_outputs<NM>(a, bt, wt, acc);
}

int f16_type(model::GgmlType type) {
  switch (type) {
    case model::GgmlType::Q4_K: return qd::kQ4_K;
    case model::GgmlType::Q5_K: return qd::kQ5_K;
    case model::GgmlType::IQ3_S: return qd::kIQ3_S;
    default: return -1;
  }
}

template <int NM>
const void* kernel_of(int t) {
  return t == qd::kQ4_K   ? reinterpret_cast<const void*>(kquant_f16_kernel<qd::kQ4_K, NM>)
         : t == qd::kQ5_K ? reinterpret_cast<const void*>(kquant_f16_kernel<qd::kQ5_K, NM>)
                          : reinterpret_cast<const void*>(kquant_f16_kernel<qd::kIQ3_S, NM>);
}
const void* kernel_of(int t, bool up) { return up ? kernel_of<2>(t) : kernel_of<1>(t); }

bool same_layout(const DevMatrix& a, const DevMatrix& b) {
  return a.type == b.type && a.rows == b.rows && a.cols == b.cols && a.row_bytes == b.row_bytes;
}

// Where the split inputs go: the high parts over split.hi, the low parts over split.lo and past them
// (from a 16-byte boundary) the sums, then the row factors; null where they do not fit.
struct F16Scratch {
  __half* xh = nullptr;
  __half* xl = nullptr;
  float* xs = nullptr;
  float* xp = nullptr;
};
F16Scratch f16_scratch(const SplitScratch& split, uint32_t rows, uint32_t cols) {
  if (split.hi == nullptr || split.lo == nullptr || reinterpret_cast<uintptr_t>(split.hi) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(split.lo) % 16 != 0) {
    return {};
  }
  const size_t values = size_t{rows} * cols;
  if (split.elems < grouped_split_elems(rows, cols)) return {};  // 2 bytes an elem: the sums' 4 per 32, 4 a row
  __half* xl = static_cast<__half*>(split.lo);
  float* xs = reinterpret_cast<float*>(xl + values);
  return {static_cast<__half*>(split.hi), xl, xs, xs + size_t{rows} * (cols / 32)};
}

template <int T, int NM>
void launch(const F16Args& a, dim3 grid, cudaStream_t stream) {
  constexpr size_t smem = 2 * sizeof(Stage<T>);
  FERRY_CUDA(cudaFuncSetAttribute(kquant_f16_kernel<T, NM>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(smem)));
  kquant_f16_kernel<T, NM><<<grid, kThreads, smem, stream>>>(a);
}

template <int NM>
void launch(int t, const F16Args& a, dim3 grid, cudaStream_t stream) {
  if (t == qd::kQ4_K) {
    launch<qd::kQ4_K, NM>(a, grid, stream);
  } else if (t == qd::kQ5_K) {
    launch<qd::kQ5_K, NM>(a, grid, stream);
  } else {
    launch<qd::kIQ3_S, NM>(a, grid, stream);
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
  return code_built_for(kernel_of(t, up != nullptr), 8);
}

void grouped_gemm_f16(const ExpertMatrices& w, const ExpertMatrices* up, const float* x, size_t ldx, uint32_t x_rows,
                      const int32_t* gather, const RouteSort& sort, uint32_t routes, uint32_t E, float limit, float* y,
                      size_t ldy, const SplitScratch& split, cudaStream_t stream) {
  if (routes == 0 || w.m.rows == 0 || x_rows == 0) return;
  if (!grouped_f16_takes(w, up, x, ldx, x_rows, split)) {
    throw CudaError("grouped_gemm_f16: not an f16 call (Q4_K / Q5_K rows of whole blocks, gate and up alike, "
                    "aligned input, a scratch for " + std::to_string(x_rows) + " x " + std::to_string(w.m.cols) +
                    " values and their factors, sm80+ code)");
  }
  if (gather == nullptr && x_rows < routes) {
    throw CudaError("grouped_gemm_f16: " + std::to_string(routes) + " routes read rows of an input of " +
                    std::to_string(x_rows));
  }
  if (w.table == nullptr && w.m.data == nullptr) throw CudaError("grouped_gemm_f16: no expert weights");
  const uint32_t cols = w.m.cols;
  const F16Scratch fs = f16_scratch(split, x_rows, cols);
  quantize_rows_f16_kernel<<<x_rows, 256, 0, stream>>>(x, ldx, cols, fs.xh, fs.xl, fs.xs, fs.xp);
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
  a.gather = gather;
  a.offsets = sort.offsets;
  a.tiles = sort.tiles;
  a.E = E;
  a.y = y;
  a.ldy = ldy;
  a.limit = limit;
  const size_t max_tiles = (size_t{routes} + BN - 1) / BN + std::min(E, routes);
  const uint32_t rm = up != nullptr ? BR / 2 : BR;
  const size_t row_tiles = (size_t{w.m.rows} + rm - 1) / rm;
  if (max_tiles > 65535 || row_tiles > 0x7fffffffu) {
    throw CudaError("grouped_gemm_f16: " + std::to_string(routes) + " routes over " + std::to_string(w.m.rows) +
                    " rows make too large a grid");
  }
  const dim3 grid(static_cast<uint32_t>(row_tiles), static_cast<uint32_t>(max_tiles));
  const int t = f16_type(w.m.type);
  if (t == qd::kIQ3_S) a.iq3s_grid = iq3s_grid_address();
  if (up != nullptr) {
    launch<2>(t, a, grid, stream);
  } else {
    launch<1>(t, a, grid, stream);
  }
  FERRY_CUDA_LAUNCHED();
}

}  // namespace ferry::gpu
