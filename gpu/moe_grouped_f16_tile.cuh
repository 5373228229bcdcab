#pragma once
// The fp16 wgmma grouped kernel's (gpu/moe_grouped_f16.cu) tile shapes, per-type traits, shared-memory
// stage and tile loader: what a block copies of each k-tile and the weight factors it makes from the
// blocks' headers. Included by that file alone.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "gpu/mma_f16.cuh"
#include "gpu/moe_grouped.hpp"
#include "gpu/quant_device.cuh"

namespace ferry::gpu::grouped_f16 {
constexpr uint32_t BN = kGroupedTileTokens;  // sorted rows of a block: the sort's token tiles
constexpr uint32_t BK = 128;                 // columns of a k-tile
constexpr uint32_t kSteps = BK / 32;         // k32 steps (sub-blocks) of a k-tile
static_assert(BN == 64, "moe_grouped_f16: thread maps assume token tiles of 64");

// A block's shape: WG warpgroups, each over 64 weight rows (BR in all: NM matrices of BR / NM rows) x
// the tile's tokens; Stages buffers of k-tiles; Lag 1: an even k-tile's products still run while
// the next k-tile starts (its copies then go two k-tiles ahead of the products, not one).
// Cvt: the inputs come as the int16 values and steps (2 bytes a value through L2, not 4), and the loader
// makes their high and low parts on their way into shared memory (4 warpgroups only).
template <int WG, int Stages, int Lag, bool Cvt = false>
struct Cfg {
  static constexpr uint32_t kWG = WG, BR = 64 * WG, kThreads = 128 * WG;
  static constexpr int kStages = Stages, kLag = Lag;
  static constexpr bool kCvt = Cvt;
  static_assert((WG == 2 || WG == 4) && Stages >= 2 + Lag && (Lag == 0 || Lag == 1) && (!Cvt || WG == 4),
                "moe_grouped_f16: shapes");
};
// The tokens' k-tile in shared memory as wgmma's B operand takes it (K-major core matrices of 8 tokens
// x 16 bytes, 128 contiguous bytes each): per 8-token tile 32 core matrices, chunk c < 16 the high
// parts of values 8c..8c + 7, chunk 16 + c their low parts; an 8-token tile's k-tile is 4 KiB.
constexpr uint32_t kXChunks = 2 * BK / 8;
constexpr uint32_t kXTileWords = kXChunks * 32;
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

// The minimum terms are taken once a 256-column block, after its odd k-tile: that k-tile's stage holds
// the mins of the block's 8 sub-blocks and the tokens' 8 sums.
constexpr uint32_t kBlockSubs = 8;
template <int T, uint32_t BR>
struct alignas(128) Stage {
  // IQ3_S has no minimum terms: their arrays keep 16 bytes.
  static constexpr bool kMin = !KQuant<T>::kDecoded;
  static constexpr uint32_t kMS = kMin ? kBlockSubs : 1, kMR = kMin ? BR : 4, kMT = kMin ? BN + 8 : 4;
  uint32_t x[BN / 8 * kXTileWords];  // first: the descriptors' start addresses
  uint32_t w[BR * KQuant<T>::kWWords];
  typename KQuant<T>::Factor wf[kSteps][BR];  // per sub-block and weight row: the decode's scale (and offset)
  float dk[BR];         // per weight row: 1 / d (even k-tiles) or d (odd)
  uint8_t wm[kMS][kMR];  // K-quants, odd k-tiles: per sub-block of the block and row its 6-bit min
  float dmin[kMR];      // per row dmin / d
  float xs[kMS][kMT];   // odd k-tiles: per sub-block of the block and token the scaled f32 sum (rows 8 banks apart)
};

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
  const uint32_t* xq;  // Cvt: the int16 values (two a word, in xh's order), cols apart
  const float* xstep;  // Cvt: per 32 values their step times the row's power of two, cols / 32 apart
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

// Two int16 values (a word's halves) times their step as fp16 high and low parts (two a word each): the
// product and the difference rounded apart (no fused multiply-add), so that the quantize pass and the
// loader's conversion give the same bits.
__device__ __forceinline__ void split_pair(uint32_t w, float step, uint32_t& hi, uint32_t& lo) {
  const float v0 = __fmul_rn(static_cast<float>(static_cast<int16_t>(w & 0xffffu)), step);
  const float v1 = __fmul_rn(static_cast<float>(static_cast<int32_t>(w) >> 16), step);
  const __half2 h = __floats2half2_rn(v0, v1);
  const float2 f = __half22float2(h);
  const __half2 l = __floats2half2_rn(__fsub_rn(v0, f.x), __fsub_rn(v1, f.y));
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = *reinterpret_cast<const uint32_t*>(&l);
}

__device__ __forceinline__ uint32_t half2_of(float v) {
  const __half2 h = __float2half2_rn(v);
  return *reinterpret_cast<const uint32_t*>(&h);
}
// A block's tile: its expert, first sorted row, tokens and first weight row.
struct BlockTile {
  uint32_t e = 0, first = 0, ntok = 0, m0 = 0;
};

// What a thread copies of each k-tile, and the bytes it makes the weight factors from. Weight items
// tid and tid + kThreads of BR rows x 4 chunks (row item / 4; chunk, and the sub-block whose factors
// the thread makes, tid % 4); Q5_K's fifth bits, BR rows x 2 chunks (row tid / 2, chunk tid % 2);
// the inputs of token tid % 256 / 4: chunks tid % 4 + 4i of its 16 high and (with 256 threads, or
// threads 256.. of 512) its 16 low (a warp's 8 tokens are one 8-token tile: its lanes write 4 whole
// core matrices at once), and (odd k-tiles) the sums of its block's sub-blocks tid % 4 and tid % 4 +
// 4 (with 512 threads one of them). Rows past the matrix and tokens past the tile read row rows - 1
// and the tile's first token: their products are not stored.
template <int T, int NM, class C>
struct TileLoader {
  using K = KQuant<T>;
  static constexpr uint32_t BR = C::BR, kThreads = C::kThreads;
  static constexpr uint32_t RM = BR / NM;  // rows of each matrix in the block
  const uint8_t* wrow[2];
  uint32_t wlr[2];
  const uint8_t* hrow = nullptr;
  size_t xrow;   // the token's input row
  bool xlive;    // its 8-token tile holds tokens: what the products read
  // Cvt: the thread's two chunks of 8 values (warp w: 8-token tile w % 8, chunks 4 (w / 8 + 2i) + lane /
  // 8 of token lane % 8; its lanes then write 4 whole core matrices at once), in registers from load_x
  // to store_x, and their steps.
  size_t crow;
  bool clive;
  uint4 cv[2];
  float cs[2];
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
    const uint32_t tok = tid % 256 / 4, t = tok < bt.ntok ? tok : 0;
    xrow = a.gather != nullptr ? static_cast<size_t>(a.gather[bt.first + t]) : bt.first + t;
    xlive = tok < (bt.ntok + 7) / 8 * 8;
    if constexpr (C::kCvt) {
      const uint32_t ctok = 8 * (tid / 32 % 8) + tid % 8, u = ctok < bt.ntok ? ctok : 0;
      crow = a.gather != nullptr ? static_cast<size_t>(a.gather[bt.first + u]) : bt.first + u;
      clive = ctok < (bt.ntok + 7) / 8 * 8;
    }
  }

  // Cvt: k-tile kt's values of the thread's chunks and their steps, into registers.
  __device__ void load_x(const F16Args& a, uint32_t kt) {
    if (!clive) return;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint32_t c = 4 * (threadIdx.x / 256 + 2 * i) + threadIdx.x % 32 / 8;  // 8 values a chunk
      cv[i] = *reinterpret_cast<const uint4*>(a.xq + (crow * a.cols + BK * kt + 8 * c) / 2);
      cs[i] = a.xstep[crow * (a.cols / 32) + kSteps * kt + c / 4];
    }
  }

  // Cvt: their high and low parts (split_pair, as the quantize pass makes them) into s.
  __device__ void store_x(Stage<T, BR>& s) const {
    if (!clive) return;
    const uint32_t tid = threadIdx.x;
    uint32_t* dst = &s.x[(tid / 32 % 8) * kXTileWords + 4 * (tid % 8)];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint32_t c = 4 * (tid / 256 + 2 * i) + tid % 32 / 8;
      const uint32_t w[4] = {cv[i].x, cv[i].y, cv[i].z, cv[i].w};
      uint32_t hi[4], lo[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) split_pair(w[k], cs[i], hi[k], lo[k]);
      *reinterpret_cast<uint4*>(dst + 32 * c) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
      *reinterpret_cast<uint4*>(dst + 32 * (16 + c)) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
    }
  }

  // k-tile kt's copies into s, one group.
  __device__ void issue(const F16Args& a, uint32_t kt, Stage<T, BR>& s) const {
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
      constexpr uint32_t kParts = kThreads == 256 ? 2 : 1;  // the high parts, the low ones
      const uint32_t part0 = kThreads == 256 ? 0 : tid / 256, tok = tid % 256 / 4;
      const size_t at = xrow * a.cols + BK * kt;
      uint32_t* dst = &s.x[(tok / 8) * kXTileWords + 4 * (tok % 8)];
#pragma unroll
      for (uint32_t p = part0; p < part0 + kParts && !C::kCvt; ++p) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const uint32_t c = wch + 4 * i;  // 8 values a chunk
          cp_async(dst + 32 * (16 * p + c), (p == 0 ? a.xh : a.xl) + at + 8 * c, 16);
        }
      }
      if constexpr (!K::kDecoded) {
        if (kt % 2 == 1) {
          const float* xs = a.xs + xrow * (a.cols / 32) + kBlockSubs * (kt / 2);
#pragma unroll
          for (uint32_t p = part0; p < part0 + kParts; ++p) cp_async(&s.xs[wch + 4 * p][tok], xs + wch + 4 * p, 4);
        }
      }
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
  __device__ void store_factors(uint32_t kt, Stage<T, BR>& s, const uint32_t* grid) const {
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
        const uint32_t v = kt % 2 == 0 ? scm[j][0] : scm[j][1], sc = v & 0xff;
        d = qd::h2f(dd[j] & 0xffff);
        // A block of d 0 adds nothing: its values decode to 0 and the rows' sums keep their scale.
        const float scale =
            d == 0.0f ? 0.0f : static_cast<float>(sc) * (!K::kHighBits && wch % 2 == 1 ? 0.0625f : 1.0f);
        s.wf[wch][wlr[j]] = make_uint2(half2_of(scale), half2_of(-K::kBias * scale));
        if (kt % 2 == 1) {  // the block's minimum terms, taken after this k-tile
          s.wm[wch][wlr[j]] = static_cast<uint8_t>(scm[j][0] >> 8);
          s.wm[wch + 4][wlr[j]] = static_cast<uint8_t>(scm[j][1] >> 8);
          if (wch == 0) s.dmin[wlr[j]] = qd::h2f(dd[j] >> 16) / (d == 0.0f ? 1.0f : d);
        }
      }
      if (wch == 0) s.dk[wlr[j]] = d == 0.0f ? 1.0f : kt % 2 == 0 ? 1.0f / d : d;
    }
  }
};
}  // namespace ferry::gpu::grouped_f16
