// Decode matrix-vector products of K-quant and IQ weights (Q4_K, Q5_K, Q6_K, IQ4_XS, IQ3_S) with the
// activations quantized to int16.
//
// Decoding every weight to f32 costs ~4 instructions a weight and reading f32 activations 4 bytes a
// weight from L1: both keep the f32 kernel (matvec.cu) far from the memory bandwidth. Here each
// block first quantizes its activations into shared memory (one scale per 32 values, plus the exact
// f32 sum of every 16 values for the K-quant minimum terms), then its warps stream weight rows and
// multiply 2 weights a dp2a instruction with int32 sums. Every type is read in units of 32 weights,
// 8 to a 256-column superblock, in two runs of 16 columns (a and b) that each lie in one 32-value
// block of x. Shared memory holds x in the order the units read it, 80 bytes a unit (64 of values,
// 16 of scales and sums), so that eight lanes reading eight consecutive units touch every bank
// once; and each warp requests the next row's weights before it multiplies the current ones, so
// that its loads are always in flight. int8 activations (llama.cpp's q8_1) would halve that work,
// but their rounding (up to amax/254 a value) flips the top token of small models against the f32
// CPU reference a quarter of the time; int16 rounding (amax/65534) stays at the level of f32
// summation order. MatvecArgs::f32_activations keeps the f32 kernel.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "gpu/cuda_check.hpp"
#include "gpu/matvec_int16.hpp"
#include "gpu/matvec_mma.hpp"
#include "gpu/matvec_part.cuh"
#include "gpu/pdl.cuh"
#include "gpu/pdl.hpp"
#include "gpu/quant_device.cuh"
#include "gpu/swiglu.cuh"
#include "gpu/x_int16.cuh"
#include "model/formats/iq_grids.hpp"

namespace ferry::gpu {
namespace {

constexpr int kWarps = 8;
// Resident blocks per SM the kernels are built for (their launch bounds): one token fits 64
// registers, 2-4 tokens 80, 8 tokens more.
__host__ __device__ constexpr int blocks_per_sm(uint32_t nt) { return nt == 1 ? 4 : nt <= 4 ? 3 : 2; }
constexpr size_t kMaxSmem = 48 * 1024;  // without the opt-in, on every architecture

// Shared memory of one block: the IQ3_S grid where the type needs it, then per token K/32 units of
// 80 bytes (XUnit values, then XScales).
constexpr uint32_t kUnitBytes = 80;
constexpr size_t kGridBytes = sizeof(model::kIq3sGrid);
size_t grid_bytes(model::GgmlType type) { return type == model::GgmlType::IQ3_S ? kGridBytes : 0; }
// IQ3_S and Q6_K, whose 110- and 210-byte blocks allow 2-byte loads only, at one token: a warp's item
// (kChunk units of each of its 32 lanes: whole superblocks) staged in shared memory (int16_block)
// where it is a 16-byte multiple of at most 2 KiB and every item of a row is whole: IQ3_S at 2,048
// columns and multiples of 4,096 (880 / 1,760 bytes), Q6_K at multiples of 2,048 (1,680); 0 otherwise.
constexpr uint32_t kIq3sBlockBytes = 110, kIq3sChunk = 4, kQ6kBlockBytes = 210, kQ6kChunk = 2;
__host__ __device__ constexpr uint32_t stage_item_bytes(uint32_t block_bytes, uint32_t chunk, uint32_t cols) {
  const uint32_t units = cols / 32, item_units = units < chunk * 32 ? units : chunk * 32;
  const uint32_t bytes = item_units / 8 * block_bytes;
  return units >= 32 && units % item_units == 0 && bytes % 16 == 0 && bytes <= 2048 ? bytes : 0;
}
// A stage a warp.
size_t stage_bytes(model::GgmlType type, uint32_t nt, uint32_t cols) {
  if (nt != 1) return 0;
  if (type == model::GgmlType::IQ3_S) return size_t{kWarps} * stage_item_bytes(kIq3sBlockBytes, kIq3sChunk, cols);
  if (type == model::GgmlType::Q6_K) return size_t{kWarps} * stage_item_bytes(kQ6kBlockBytes, kQ6kChunk, cols);
  return 0;
}
size_t smem_bytes(model::GgmlType type, uint32_t nt, uint32_t cols) {
  return grid_bytes(type) + static_cast<size_t>(nt) * (cols / 32) * kUnitBytes + stage_bytes(type, nt, cols);
}

uint32_t padded_tokens(uint32_t tokens) { return tokens <= 1 ? 1 : tokens <= 2 ? 2 : tokens <= 4 ? 4 : 8; }

// Lanes that share a row: 32, or 16 / 8 for rows of fewer than 32 / 16 units (a power of two, for
// the butterfly sum).
__host__ __device__ constexpr uint32_t lanes_per_row(uint32_t units) { return units >= 32 ? 32 : units >= 16 ? 16 : 8; }

// The activations one unit multiplies: int16 values of its runs a (a0, a1) and b (b0, b1).
struct XUnit {
  int4 a0, a1, b0, b1;
};
// The scales of the two runs' 32-value blocks and the f32 sums of the two runs.
struct XScales {
  float d_lo, d_hi, s_lo, s_hi;
};

// What the kernels receive besides MatvecArgs: the device IQ3_S grid (matvec.cu owns it) and the
// IQ4_NL levels as 16 bytes, for byte permutes.
struct Tables {
  const uint32_t* iq3s_grid;
  uint32_t iq4nl[4];
};

__device__ __forceinline__ XUnit load_x_unit(const unsigned char* slot) {
  const int4* p = reinterpret_cast<const int4*>(slot);
  return {p[0], p[1], p[2], p[3]};
}
// Sums: whether the type's products read the sums (the K-quant minimum terms); the others' loads
// take 8 bytes, not 16 (a quarter of a lane's x reads a unit: the x reads, at one token 4.6 times
// an IQ3_S row's bytes, are most of the kernel's shared-memory traffic).
template <bool Sums>
__device__ __forceinline__ XScales load_x_scales(const unsigned char* slot) {
  if constexpr (Sums) {
    const float4 f = *reinterpret_cast<const float4*>(slot + 64);
    return {f.x, f.y, f.z, f.w};
  } else {
    const float2 f = *reinterpret_cast<const float2*>(slot + 64);
    return {f.x, f.y, 0.0f, 0.0f};
  }
}

// 16 columns: int16 pairs of x (two int4) times the 4 signed weight bytes of each of 4 words (byte
// k of word i is column 4i + k).
__device__ __forceinline__ int dot16(const int4& x0, const int4& x1, const int (&w)[4]) {
  int s = __dp2a_lo(x0.x, w[0], 0);
  s = __dp2a_hi(x0.y, w[0], s);
  s = __dp2a_lo(x0.z, w[1], s);
  s = __dp2a_hi(x0.w, w[1], s);
  s = __dp2a_lo(x1.x, w[2], s);
  s = __dp2a_hi(x1.y, w[2], s);
  s = __dp2a_lo(x1.z, w[3], s);
  return __dp2a_hi(x1.w, w[3], s);
}

// A unit's weights as the products use them, made once for all tokens of a launch: the signed
// weight bytes of runs a and b (4 words each) and the float factors of its terms. Each type's dot
// keeps the expression of the unit's product that one token had (same operands, same order), so a
// token's sums have the same bits whatever the launch's token count.
struct Prepared {
  int a[4], b[4];
  float f[4];
};

// Q4_K / Q5_K: unit j = 2c + h of a superblock holds columns 64c + 16h (run a, of sub-block 2c)
// and 32 further on (run b, sub-block 2c + 1); the sub-blocks' scales and minimums follow the
// block's d and dmin. f: d * scale and dmin * min of both sub-blocks.
__device__ __forceinline__ void k4_factors(const uint8_t* blk, uint32_t c, Prepared& p) {
  const uint32_t dd = qd::ld_u32(blk);
  int sc1, m1, sc2, m2;
  qd::k4_scale_min(blk + 4, 2 * c, sc1, m1);
  qd::k4_scale_min(blk + 4, 2 * c + 1, sc2, m2);
  const float d = qd::h2f(dd & 0xffff), dmin = qd::h2f(dd >> 16);
  p.f[0] = d * static_cast<float>(sc1);
  p.f[1] = d * static_cast<float>(sc2);
  p.f[2] = dmin * static_cast<float>(m1);
  p.f[3] = dmin * static_cast<float>(m2);
}
__device__ __forceinline__ float k4_dot(const Prepared& p, const XUnit& x, const XScales& xs) {
  const int s1 = dot16(x.a0, x.a1, p.a), s2 = dot16(x.b0, x.b1, p.b);
  return p.f[0] * xs.d_lo * static_cast<float>(s1) + p.f[1] * xs.d_hi * static_cast<float>(s2) -
         p.f[2] * xs.s_lo - p.f[3] * xs.s_hi;
}
// IQ4_XS / IQ3_S: one factor a run (f[0] for a, f[1] for b) times the pair of scaled sums.
__device__ __forceinline__ float scaled_pair_dot(const Prepared& p, const XUnit& x, const XScales& xs) {
  const int s1 = dot16(x.a0, x.a1, p.a), s2 = dot16(x.b0, x.b1, p.b);
  return p.f[0] * (xs.d_lo * static_cast<float>(s1) + xs.d_hi * static_cast<float>(s2));
}

// Per type: the superblock's bytes, units in flight per lane (fewer where a unit's weights take 8
// registers), which unit's run (a: high 0, b: high 1) holds piece p (columns 16p..) of a superblock,
// the weights a lane requests for a unit (W, load), what they are for the products (prep) and one
// token's product (dot).
template <int T> struct Reader;

template <> struct Reader<qd::kQ4_K> {
  static constexpr uint32_t kBlockBytes = 144, kChunk = 4;
  static constexpr bool kSums = true;
  __device__ static uint32_t unit_of(uint32_t p, uint32_t& high) {
    high = (p >> 1) & 1;
    return 2 * (p >> 2) + (p & 1);
  }
  using W = uint4;
  __device__ static W load(const uint8_t* blk, uint32_t j) {
    return *reinterpret_cast<const uint4*>(blk + 16 + 32 * (j >> 1) + 16 * (j & 1));
  }
  __device__ static Prepared prep(const uint8_t* blk, uint32_t j, const W& w, const uint32_t*, const Tables&) {
    Prepared p;
    const uint32_t q[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      p.a[i] = static_cast<int>(q[i] & 0x0f0f0f0fu);
      p.b[i] = static_cast<int>((q[i] >> 4) & 0x0f0f0f0fu);
    }
    k4_factors(blk, j >> 1, p);
    return p;
  }
  __device__ static float dot(const Prepared& p, const XUnit& x, const XScales& xs) { return k4_dot(p, x, xs); }
};

// Q5_K: Q4_K's nibbles at byte 48, their fifth bits in qh (byte 16): bit 2c of qh[16h + l] for
// run a, bit 2c + 1 for run b.
template <> struct Reader<qd::kQ5_K> {
  static constexpr uint32_t kBlockBytes = 176, kChunk = 2;
  static constexpr bool kSums = true;
  __device__ static uint32_t unit_of(uint32_t p, uint32_t& high) { return Reader<qd::kQ4_K>::unit_of(p, high); }
  struct W {
    uint4 q, h;
  };
  __device__ static W load(const uint8_t* blk, uint32_t j) {
    return {*reinterpret_cast<const uint4*>(blk + 48 + 32 * (j >> 1) + 16 * (j & 1)),
            *reinterpret_cast<const uint4*>(blk + 16 + 16 * (j & 1))};
  }
  __device__ static Prepared prep(const uint8_t* blk, uint32_t j, const W& w, const uint32_t*, const Tables&) {
    const uint32_t c = j >> 1;
    const uint32_t q[4] = {w.q.x, w.q.y, w.q.z, w.q.w}, h[4] = {w.h.x, w.h.y, w.h.z, w.h.w};
    Prepared p;
    k4_factors(blk, c, p);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      p.a[i] = static_cast<int>((q[i] & 0x0f0f0f0fu) | (((h[i] >> (2 * c)) & 0x01010101u) << 4));
      p.b[i] = static_cast<int>(((q[i] >> 4) & 0x0f0f0f0fu) | (((h[i] >> (2 * c + 1)) & 0x01010101u) << 4));
    }
    return p;
  }
  __device__ static float dot(const Prepared& p, const XUnit& x, const XScales& xs) { return k4_dot(p, x, xs); }
};

// Q6_K: unit j = 4n + 2m + h holds columns 128n + 32m + 16h (run a: low nibbles of ql[64n + 32m +
// 16h + l], bits 2m of qh[32n + 16h + l]) and 64 further on (run b: high nibbles, bits 4 + 2m);
// one int8 scale a 16 columns. Blocks are 210 bytes, so only 2-byte loads are aligned.
template <> struct Reader<qd::kQ6_K> {
  static constexpr uint32_t kBlockBytes = kQ6kBlockBytes, kChunk = kQ6kChunk;
  static constexpr bool kSums = false;
  __device__ static uint32_t unit_of(uint32_t p, uint32_t& high) {
    high = (p >> 2) & 1;
    return 4 * (p >> 3) + (p & 3);
  }
  struct W {
    uint32_t l[4], h[4];
  };
  __device__ static W load(const uint8_t* blk, uint32_t j) {
    const uint8_t* ql = blk + 64 * (j >> 2) + 16 * (j & 3);
    const uint8_t* qh = blk + 128 + 32 * (j >> 2) + 16 * (j & 1);
    W w;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      w.l[i] = qd::ld_u32_a2(ql + 4 * i);
      w.h[i] = qd::ld_u32_a2(qh + 4 * i);
    }
    return w;
  }
  // f: d times the scales of runs a and b.
  __device__ static Prepared prep(const uint8_t* blk, uint32_t j, const W& w, const uint32_t*, const Tables&) {
    const uint32_t m = (j >> 1) & 1;
    Prepared p;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      // q - 32 bytewise: 6-bit values, so the wrapped bytes read as signed int8 are exact.
      p.a[i] = static_cast<int>(
          __vsub4((w.l[i] & 0x0f0f0f0fu) | (((w.h[i] >> (2 * m)) & 0x03030303u) << 4), 0x20202020u));
      p.b[i] = static_cast<int>(
          __vsub4(((w.l[i] >> 4) & 0x0f0f0f0fu) | (((w.h[i] >> (4 + 2 * m)) & 0x03030303u) << 4), 0x20202020u));
    }
    // One scale a 16 columns: run a is piece 8n + 2m + h, run b four pieces on.
    const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
    const uint32_t pa = 8 * (j >> 2) + (j & 3);
    const float d = qd::h2f(qd::ld_u16(blk + 208));
    p.f[0] = d * static_cast<float>(sc[pa]);
    p.f[1] = d * static_cast<float>(sc[pa + 4]);
    return p;
  }
  __device__ static float dot(const Prepared& p, const XUnit& x, const XScales& xs) {
    const int s1 = dot16(x.a0, x.a1, p.a), s2 = dot16(x.b0, x.b1, p.b);
    return p.f[0] * xs.d_lo * static_cast<float>(s1) + p.f[1] * xs.d_hi * static_cast<float>(s2);
  }
};

// IQ4_XS: unit j holds columns 32j.. (run a: low nibbles of qs[16j + l]) and 32j + 16.. (run b:
// high nibbles), each nibble an index into the IQ4_NL levels; one 6-bit scale a unit.
template <> struct Reader<qd::kIQ4_XS> {
  static constexpr uint32_t kBlockBytes = 136, kChunk = 4;
  static constexpr bool kSums = false;
  __device__ static uint32_t unit_of(uint32_t p, uint32_t& high) {
    high = p & 1;
    return p >> 1;
  }
  using W = uint4;
  __device__ static W load(const uint8_t* blk, uint32_t j) {
    const uint2 q0 = *reinterpret_cast<const uint2*>(blk + 8 + 16 * j);  // blocks are 8-byte aligned
    const uint2 q1 = *reinterpret_cast<const uint2*>(blk + 16 + 16 * j);
    return {q0.x, q0.y, q1.x, q1.y};
  }
  // The levels of the 4 indices in the low nibbles of idx's bytes: levels 0-7 and 8-15 permuted
  // by the low 3 bits, chosen between by bit 3.
  __device__ static int levels(uint32_t idx, const Tables& t) {
    const uint32_t low3 = idx & 0x07070707u;
    const uint32_t sel = __byte_perm(low3 | (low3 >> 4), 0, 0x0020);
    const uint32_t lo = __byte_perm(t.iq4nl[0], t.iq4nl[1], sel), hi = __byte_perm(t.iq4nl[2], t.iq4nl[3], sel);
    const uint32_t high = ((idx >> 3) & 0x01010101u) * 0xffu;
    return static_cast<int>((lo & ~high) | (hi & high));
  }
  // f[0]: the unit's scale.
  __device__ static Prepared prep(const uint8_t* blk, uint32_t j, const W& w, const uint32_t*, const Tables& t) {
    const uint32_t q[4] = {w.x, w.y, w.z, w.w};
    Prepared p;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      p.a[i] = levels(q[i] & 0x0f0f0f0fu, t);
      p.b[i] = levels((q[i] >> 4) & 0x0f0f0f0fu, t);
    }
    const uint32_t scales_h = qd::ld_u16(blk + 2);
    const int ls = ((blk[4 + j / 2] >> (4 * (j % 2))) & 0xf) | (((scales_h >> (2 * j)) & 3) << 4);
    p.f[0] = qd::h2f(qd::ld_u16(blk)) * static_cast<float>(ls - 32);
    return p;
  }
  __device__ static float dot(const Prepared& p, const XUnit& x, const XScales& xs) {
    return scaled_pair_dot(p, x, xs);
  }
};

// IQ3_S: unit j holds columns 32j.. in 8 groups of 4, group g a grid entry (qs[8j + g] and bit g of
// qh[j]) with 4 sign bits from signs[4j..]; runs a and b are groups 0-3 and 4-7. Blocks are 110
// bytes, so only 2-byte loads are aligned.
template <> struct Reader<qd::kIQ3_S> {
  static constexpr uint32_t kBlockBytes = kIq3sBlockBytes, kChunk = kIq3sChunk;
  static constexpr bool kSums = false;
  __device__ static uint32_t unit_of(uint32_t p, uint32_t& high) { return Reader<qd::kIQ4_XS>::unit_of(p, high); }
  struct W {
    uint32_t qs_lo, qs_hi, signs, qh;
  };
  __device__ static W load(const uint8_t* blk, uint32_t j) {
    return {qd::ld_u32_a2(blk + 2 + 8 * j), qd::ld_u32_a2(blk + 6 + 8 * j), qd::ld_u32_a2(blk + 74 + 4 * j),
            blk[66 + j]};
  }
  // f[0]: the unit's scale.
  __device__ static Prepared prep(const uint8_t* blk, uint32_t j, const W& w, const uint32_t* grid, const Tables&) {
    int v[8];
#pragma unroll
    for (int g = 0; g < 8; ++g) {
      const uint32_t qs = ((g < 4 ? w.qs_lo : w.qs_hi) >> (8 * (g & 3))) & 0xff;
      const uint32_t entry = grid[qs | (((w.qh >> g) & 1) << 8)];
      // Sign bit k to byte k (the four shifted copies do not overlap), then 0xff in negative bytes:
      // (e ^ 0xff) - 0xff is -e bytewise.
      const uint32_t neg = ((((w.signs >> (4 * g)) & 0xf) * 0x00204081u) & 0x01010101u) * 0xffu;
      v[g] = static_cast<int>(__vsub4(entry ^ neg, neg));
    }
    Prepared p;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      p.a[i] = v[i];
      p.b[i] = v[4 + i];
    }
    p.f[0] = qd::h2f(qd::ld_u16(blk)) * static_cast<float>(1 + 2 * ((blk[106 + j / 2] >> (4 * (j % 2))) & 0xf));
    return p;
  }
  __device__ static float dot(const Prepared& p, const XUnit& x, const XScales& xs) {
    return scaled_pair_dot(p, x, xs);
  }
};

// Rows a block step covers: a row per warp, or several where narrow rows share a warp.
__host__ __device__ constexpr uint32_t rows_per_step(uint32_t cols) { return kWarps * (32 / lanes_per_row(cols / 32)); }

// Block `take` of part `part` on weights of type T in rows of `row_bytes`; fixed_weights: whether the
// kernel asked for its weights before its PDL wait (and so waits here).
template <int T, int NT>
__device__ __forceinline__ void int16_block(const MatvecArgs& a, const Tables& tables, uint32_t part,
                                            const MatvecBlockTake& take, bool fixed_weights, size_t row_bytes) {
  using R = Reader<T>;
  constexpr uint32_t kChunk = R::kChunk;
  extern __shared__ __align__(16) unsigned char smem_all[];
  const uint32_t* grid = reinterpret_cast<const uint32_t*>(smem_all);
  unsigned char* smem = smem_all + (T == qd::kIQ3_S ? kGridBytes : 0);
  const uint32_t g = take.g, bx = take.bx, nb = take.nb, ntok = take.ntok;
  const int32_t *tok_x = take.tok_x, *tok_y = take.tok_y;
  const uint32_t K = a.w.cols, units = K / 32;
  const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  // A row's units (32 weights each) are spread over `lpr` lanes; narrow rows share a warp. A warp's
  // work is a list of items: chunks of up to kChunk units per lane, row after row.
  const uint32_t lpr = lanes_per_row(units);
  const uint32_t sub = lane / lpr, sl = lane % lpr, rows_per_warp = 32 / lpr;
  const uint32_t chunks = (units + kChunk * lpr - 1) / (kChunk * lpr);
  const uint32_t first_row = (bx * kWarps + warp) * rows_per_warp;
  const uint32_t stride = nb * kWarps * rows_per_warp;
  const MatvecPartView view = matvec_part_view(a, g, part);
  const uint8_t* wbase = view.w;
  float* y = view.y;
  auto item_row0 = [&](uint32_t it) { return first_row + (it / chunks) * stride; };
  auto load_item = [&](uint32_t it, typename R::W (&q)[kChunk]) {
    const uint32_t row = item_row0(it) + sub;
    if (row >= view.rows) return;
    const uint8_t* wrow = wbase + static_cast<size_t>(row) * row_bytes;
    const uint32_t u0 = sl + (it % chunks) * kChunk * lpr;
#pragma unroll
    for (uint32_t i = 0; i < kChunk; ++i) {
      const uint32_t u = u0 + i * lpr;
      if (u < units) q[i] = R::load(wrow + R::kBlockBytes * (u >> 3), u & 7);
    }
  };

  auto store_row = [&](uint32_t row, float (&acc)[NT]) {
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      float s = acc[t];
      for (uint32_t o = lpr / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      acc[t] = 0.0f;
      if (row < view.rows && sl == 0 && t < static_cast<int>(ntok)) {
        const size_t yt = tok_y != nullptr ? static_cast<size_t>(tok_y[t]) : static_cast<size_t>(t);
        y[static_cast<size_t>(g) * a.y_group_stride + row + yt * view.y_tok_stride] = s;
      }
    }
  };
  // The IQ3_S grid, the wait where the weights were asked for before it, then x: each thread
  // quantizes 16 values (half of a 32-value block; its neighbour holds the other half;
  // gpu/x_int16.cuh) into one half of the slot of the unit whose run they are.
  auto start = [&]() {
    if constexpr (T == qd::kIQ3_S) {
      uint32_t* g_smem = reinterpret_cast<uint32_t*>(smem_all);
      for (uint32_t i = threadIdx.x; i < kGridBytes / 4; i += blockDim.x) g_smem[i] = tables.iq3s_grid[i];
    }
    if (fixed_weights) pdl_wait();
    pdl_launch_dependents();

    const uint32_t pieces = ntok * (K / 16);
    for (uint32_t base = 0; base < pieces; base += blockDim.x) {
      const uint32_t i = base + threadIdx.x;
      const bool valid = i < pieces;
      const uint32_t t = valid ? i / (K / 16) : 0, p = valid ? i % (K / 16) : 0;
      float v[16];
      float amax = 0.0f, sum = 0.0f;
      if (valid) {
        const size_t at = static_cast<size_t>(tok_x != nullptr ? tok_x[t] : t) * a.x_tok_stride + 16 * p;
        const float4* src = reinterpret_cast<const float4*>(view.x + at);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float4 f = src[k];
          v[4 * k] = f.x, v[4 * k + 1] = f.y, v[4 * k + 2] = f.z, v[4 * k + 3] = f.w;
        }
        const float* x_up = matvec_part_x_up(a, g, part);
        if (x_up != nullptr) {
          // The down projection's input, SwiGLU of the gate and up products, made here once a block
          // instead of by a kernel of its own.
          swiglu_values16(v, x_up + at, a.swiglu_limit);
        }
        x16_stats(v, amax, sum);
      }
      amax = x32_amax(amax);
      if (valid) {
        uint32_t packed[8];
        x16_pack(v, amax, packed);
        uint32_t high;
        const uint32_t unit = 8 * (p / 16) + R::unit_of(p % 16, high);
        unsigned char* slot = smem + (static_cast<size_t>(t) * units + unit) * kUnitBytes;
        uint4* dst = reinterpret_cast<uint4*>(slot + 32 * high);
        dst[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
        dst[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
        float* scales = reinterpret_cast<float*>(slot + 64);
        scales[high] = x32_scale(amax);
        scales[2 + high] = sum;
      }
    }
    __syncthreads();
  };

  // IQ3_S and Q6_K at one token (the user's routed gate and up, its head): where stage_item_bytes
  // allows, a warp's lanes load its item as 16-byte pieces in order and stage it in the warp's slice
  // of shared memory, each lane then reading its units' fields there. From global memory the
  // 2-byte loads (9 a unit for IQ3_S, 19 for Q6_K) each span 4 superblocks across the warp: their
  // L1 wavefronts, not the bytes, held these types. The same products in the same order.
  if constexpr (NT == 1 && (T == qd::kIQ3_S || T == qd::kQ6_K)) {
    const uint32_t item_bytes = stage_item_bytes(R::kBlockBytes, kChunk, K);
    if (item_bytes != 0 && (reinterpret_cast<uintptr_t>(wbase) & 15) == 0) {
      constexpr uint32_t kPieces = 4;  // 16 bytes each a lane: items of up to 2 KiB
      const uint32_t pieces = item_bytes / 16;
      uint4* stage = reinterpret_cast<uint4*>(smem + static_cast<size_t>(NT) * units * kUnitBytes + warp * item_bytes);
      uint4 raw[kPieces];
      auto load_raw = [&](uint32_t it) {
        const uint32_t row = item_row0(it);
        if (row >= view.rows) return;
        const uint4* src = reinterpret_cast<const uint4*>(wbase + static_cast<size_t>(row) * row_bytes +
                                                          (it % chunks) * item_bytes);
#pragma unroll
        for (uint32_t i = 0; i < kPieces; ++i) {
          if (lane + 32 * i < pieces) raw[i] = src[lane + 32 * i];
        }
      };
      load_raw(0);
      start();
      float acc[NT] = {0.0f};
      for (uint32_t it = 0; item_row0(it) < view.rows; ++it) {
#pragma unroll
        for (uint32_t i = 0; i < kPieces; ++i) {
          if (lane + 32 * i < pieces) stage[lane + 32 * i] = raw[i];
        }
        __syncwarp();
        load_raw(it + 1);  // the next item in flight during this one's products
        const uint8_t* item = reinterpret_cast<const uint8_t*>(stage);
        const uint32_t u0 = (it % chunks) * kChunk * 32;
#pragma unroll
        for (uint32_t i = 0; i < kChunk; ++i) {
          const uint32_t u = u0 + lane + i * 32;
          if (u >= units) break;
          const uint8_t* blk = item + R::kBlockBytes * ((lane + i * 32) >> 3);
          const Prepared p = R::prep(blk, u & 7, R::load(blk, u & 7), grid, tables);
          const unsigned char* slot = smem + static_cast<size_t>(u) * kUnitBytes;
          acc[0] += R::dot(p, load_x_unit(slot), load_x_scales<R::kSums>(slot));
        }
        __syncwarp();  // every lane has read the stage before the next item overwrites it
        if (it % chunks == chunks - 1) store_row(item_row0(it), acc);
      }
      return;
    }
  }

  // The first weights are requested before the activations are quantized.
  typename R::W q[kChunk];
  load_item(0, q);
  start();
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
  for (uint32_t it = 0; item_row0(it) < view.rows; ++it) {
    typename R::W next[kChunk];
    load_item(it + 1, next);
    const uint32_t row = item_row0(it) + sub;
    if (row < view.rows) {
      const uint8_t* wrow = wbase + static_cast<size_t>(row) * row_bytes;
      const uint32_t u0 = sl + (it % chunks) * kChunk * lpr;
#pragma unroll
      for (uint32_t i = 0; i < kChunk; ++i) {
        const uint32_t u = u0 + i * lpr;
        if (u >= units) break;
        // The unit's weights are made ready once; each token then costs its two dot16 and scaling.
        const Prepared p = R::prep(wrow + R::kBlockBytes * (u >> 3), u & 7, q[i], grid, tables);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          if (t < static_cast<int>(ntok)) {
            const unsigned char* slot = smem + (static_cast<size_t>(t) * units + u) * kUnitBytes;
            acc[t] += R::dot(p, load_x_unit(slot), load_x_scales<R::kSums>(slot));
          }
        }
      }
    }
#pragma unroll
    for (uint32_t i = 0; i < kChunk; ++i) q[i] = next[i];
    if (it % chunks == chunks - 1) store_row(row, acc);
  }
}


// Launched with PDL (gpu/pdl.hpp), the kernel may start before the previous one ends: weights that
// no earlier kernel picks are requested before the wait, the routed experts' (through the router's
// ids, the pool's tables or groups named on the device) only after it, and x and y only after it.
// Groups named on the device (matvec_block_take) only for 2 tokens or more: the 1-token kernel keeps
// its registers. A single part of its own row format (MatvecPart::row_bytes) is read as type TS, by
// the code a launch of TS runs (the same bits).
template <int T, int TS, int NT>
__global__ void __launch_bounds__(kWarps * 32, blocks_per_sm(NT)) int16_kernel(MatvecArgs a, Tables tables) {
  const bool fixed_weights = matvec_fixed_weights(a);
  if (!fixed_weights) pdl_wait();
  MatvecBlockTake take;
  if (!matvec_block_take(a, NT > 1 && a.group_count != nullptr, take)) return;
  if constexpr (TS != T) {
    if (matvec_part_own_format(a, blockIdx.z)) {
      int16_block<TS, NT>(a, tables, blockIdx.z, take, fixed_weights, a.more[blockIdx.z - 1].row_bytes);
      return;
    }
  }
  int16_block<T, NT>(a, tables, blockIdx.z, take, fixed_weights, a.w.row_bytes);
}

bool int16_type(model::GgmlType t) {
  using model::GgmlType;
  return t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q6_K || t == GgmlType::IQ4_XS ||
         t == GgmlType::IQ3_S;
}

// Blocks of a kernel an SM holds at `smem` bytes, asked once per device and size: where shared
// memory rather than the launch bounds limits them (V100's 96 KiB at 2-4 tokens of 4,096 columns),
// a grid of blocks_per_sm() a multiprocessor would run a second, partial wave. A decode graph's
// capture finds them asked already, by the eager step of its shape before it.
template <int T, int TS, int NT>
uint32_t resident_per_sm(size_t smem) {
  static std::mutex mutex;
  static std::map<std::pair<int, size_t>, uint32_t> cache;
  int dev = 0;
  FERRY_CUDA(cudaGetDevice(&dev));
  const std::lock_guard<std::mutex> lock(mutex);
  auto [it, fresh] = cache.try_emplace({dev, smem}, 0);
  if (fresh) {
    int n = 0;
    FERRY_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, int16_kernel<T, TS, NT>, kWarps * 32, smem));
    it->second = static_cast<uint32_t>(std::max(n, 1));
  }
  return it->second;
}

// Shared memory of a launch: the IQ3_S grid where either type needs it.
size_t launch_smem(const MatvecArgs& a, uint32_t nt) {
  return std::max(smem_bytes(a.w.type, nt, a.w.cols), smem_bytes(matvec_second_type(a), nt, a.w.cols));
}

template <int T, int TS, int NT>
void launch_tokens(const MatvecArgs& a, const Tables& tables, cudaStream_t stream) {
  const size_t smem = launch_smem(a, NT);
  const uint32_t rows_per_block = rows_per_step(a.w.cols);
  // Enough blocks to fill the device once; each block quantizes its input once and loops over rows.
  const uint32_t wanted = (matvec_max_rows(a) + rows_per_block - 1) / rows_per_block;
  const uint32_t resident = static_cast<uint32_t>(current_sm_count()) * resident_per_sm<T, TS, NT>(smem);
  dim3 grid;
  if (a.group_count != nullptr) {
    // Groups named on the device share the blocks of one dimension: at least one block a group.
    const uint32_t all = std::max<uint32_t>(1, resident / a.parts);
    grid = dim3(std::max(a.groups, std::min(wanted * a.groups, all)), 1, a.parts);
  } else {
    // A single part's rows go to the blocks of all groups: the grouped parts set the fill.
    const uint32_t fill = std::max<uint32_t>(1, resident / (a.groups * matvec_grouped_parts(a)));
    grid = dim3(std::min(wanted, fill), a.groups, a.parts);
  }
  // One launch, with PDL where gpu/pdl.hpp allows it.
  launch_with_pdl(int16_kernel<T, TS, NT>, grid, dim3(kWarps * 32), smem, stream, a, tables);
}

// The types a launch may mix (MatvecPart::type): those only this kernel reads (Q4_K and Q5_K take the
// tensor-core kernel where it is built, whose launches hold one type; a matrix computed by the other
// kernel in a mixed launch would change its bits), and never Q4_K, which `launch` has no mixed
// instances for (where the tensor-core kernel is not built, the Volta build, Q4_K stays unmixed).
bool mixable(model::GgmlType t) {
  return int16_type(t) && t != model::GgmlType::Q4_K && !matvec_mma_takes(t);
}

template <int T>
void launch(const MatvecArgs& a, const Tables& tables, cudaStream_t stream) {
  switch (padded_tokens(a.tokens)) {
    case 1:
      if constexpr (T != qd::kQ4_K) {
        switch (matvec_second_type(a)) {
          case model::GgmlType::Q5_K: launch_tokens<T, qd::kQ5_K, 1>(a, tables, stream); return;
          case model::GgmlType::Q6_K: launch_tokens<T, qd::kQ6_K, 1>(a, tables, stream); return;
          case model::GgmlType::IQ4_XS: launch_tokens<T, qd::kIQ4_XS, 1>(a, tables, stream); return;
          case model::GgmlType::IQ3_S: launch_tokens<T, qd::kIQ3_S, 1>(a, tables, stream); return;
          default: break;
        }
      }
      launch_tokens<T, T, 1>(a, tables, stream);
      break;
    case 2: launch_tokens<T, T, 2>(a, tables, stream); break;
    case 4: launch_tokens<T, T, 4>(a, tables, stream); break;
    default: launch_tokens<T, T, 8>(a, tables, stream); break;
  }
}

}  // namespace

bool matvec_quantizes_activations(const MatvecArgs& a) {
  bool aligned = reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && reinterpret_cast<uintptr_t>(a.x_up) % 16 == 0 &&
                 a.x_tok_stride % 4 == 0 && a.x_group_stride % 4 == 0;
  for (uint32_t p = 1; p < a.parts && p < kMaxMatvecParts; ++p) {
    aligned = aligned && reinterpret_cast<uintptr_t>(a.more[p - 1].x) % 16 == 0 &&
              reinterpret_cast<uintptr_t>(a.more[p - 1].x_up) % 16 == 0;
  }
  // Parts of their own format: single, at one token, of one mixable type apart from w's.
  const model::GgmlType second = matvec_second_type(a);
  bool formats = true;
  for (uint32_t p = 1; p < a.parts && p < kMaxMatvecParts; ++p) {
    const MatvecPart& m = a.more[p - 1];
    if (!matvec_part_own_format(a, p)) continue;
    formats = formats && m.single && a.tokens == 1 && m.type == second && second != a.w.type && mixable(a.w.type) &&
              mixable(second) && m.row_bytes == model::ggml_bytes(second, a.w.cols).value_or(0);
  }
  return !a.f32_activations && int16_type(a.w.type) && a.w.cols % 256 == 0 && a.tokens >= 1 && aligned && formats &&
         launch_smem(a, padded_tokens(a.tokens)) <= kMaxSmem;
}

void launch_matvec_int16(const MatvecArgs& a, const uint32_t* iq3s_grid, cudaStream_t stream) {
  if (matvec_mma_applies(a)) {
    launch_matvec_mma(a, stream);
  } else {
    launch_matvec_dp2a(a, iq3s_grid, stream);
  }
}

void launch_matvec_dp2a(const MatvecArgs& a, const uint32_t* iq3s_grid, cudaStream_t stream) {
  Tables tables{iq3s_grid, {}};
  std::memcpy(tables.iq4nl, model::kIq4nlValues, sizeof(tables.iq4nl));
  switch (a.w.type) {
    case model::GgmlType::Q4_K: launch<qd::kQ4_K>(a, tables, stream); break;
    case model::GgmlType::Q5_K: launch<qd::kQ5_K>(a, tables, stream); break;
    case model::GgmlType::Q6_K: launch<qd::kQ6_K>(a, tables, stream); break;
    case model::GgmlType::IQ4_XS: launch<qd::kIQ4_XS>(a, tables, stream); break;
    case model::GgmlType::IQ3_S: launch<qd::kIQ3_S>(a, tables, stream); break;
    default: throw CudaError("launch_matvec_dp2a: no int16 kernel for this weight type");
  }
  FERRY_CUDA_LAUNCHED();
}

}  // namespace ferry::gpu
