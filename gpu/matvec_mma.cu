// The int16-activation decode matvec (gpu/matvec_int16.cu) on int8 tensor cores (issue 15).
//
// The dp2a kernel spends its time unpacking weights and issuing 2 MACs an instruction, not waiting on
// memory (the output head streams at ~60% of the copy bandwidth). Here one mma.sync m16n8k32
// (gpu/mma_int8.cuh) multiplies a 16-row x 32-column tile of weights, their quantized bytes as they
// lie (A), by the launch's tokens (B: up to 8 columns, unused ones zero); each int16 activation is
// hi (s8) * 256 + lo (u8), two exact MMAs, so the int32 sum of a 32-weight sub-block is the dp2a
// kernel's, and only the f32 order of the scale terms differs; Q4_K's and Q5_K's minimum terms (a
// superblock's 8 minimums times the f32 sums of x) are one more MMA over tf32, the sums split into
// two tf32 parts (~22 bits). The activations are quantized as the dp2a kernel does (one scale a 32
// values, amax / 32767) into shared memory in B's fragment order.
//
// Work: a warp's step is 16 rows x one 256-column superblock, its loads (8-byte pieces: a lane holds
// rows g and g + 8 of an MMA tile, at the same columns) requested one step ahead. The warps of a
// block share a tile's superblocks (8 warps on rows of 8 or more superblocks, fewer tiles a block
// otherwise) and add their partial sums through shared memory in a fixed order; a token's result
// is the same whatever the launch's token count.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <tuple>
#include <utility>

#include "gpu/cuda_check.hpp"
#include "gpu/matvec_mma.hpp"
#include "gpu/matvec_part.cuh"
#include "gpu/mma_int8.cuh"
#include "gpu/pdl.cuh"
#include "gpu/pdl.hpp"
#include "gpu/quant_device.cuh"
#include "gpu/swiglu.cuh"
#include "gpu/x_int16.cuh"
#include "model/formats/iq_grids.hpp"

namespace ferry::gpu {
namespace {

constexpr uint32_t kWarps = 8, kThreads = kWarps * 32;
// Dynamic shared memory the kernels are allowed (the opt-in above 48 KiB, sm80+): what the largest
// call that takes the int16 path needs here (8 tokens of 2,304 IQ3_S columns: ~54 KiB) fits.
constexpr size_t kMaxSmem = 64 * 1024;

// Shared memory of a block for `tokens` tokens of `units` 32-column units:
//   B: per token (tok_stride bytes, 64 more than the values so that two tokens' fragment loads of one
//      quarter-warp fall in different banks), per unit, per lane q 16 bytes: the hi bytes of the
//      lane's 8 columns of the unit (b[0]'s four, then b[1]'s), then their lo bytes;
//   steps: per token (units + 1: the pad again), per unit, amax / 32767;
//   sums (for the K-quant minimum terms, a tf32 MMA's B): per token (an odd number of 64 bytes: the
//      pad again), per superblock, per lane q 16 bytes: the sums of the 32 x of units q and q + 4 as
//      tf32 hi parts, then the lo parts (the remainders, tf32);
//   partial sums: two buffers (steps alternate) x warps x tokens x 16 rows;
//   the IQ3_S grid where the type reads it.
struct Layout {
  uint32_t units, tokens, grid_bytes;
  __host__ __device__ uint32_t tok_stride() const { return units * 64 + 64; }
  __host__ __device__ uint32_t step_stride() const { return units + 1; }
  __host__ __device__ uint32_t sum_stride() const { return (units / 8 | 1) * 64; }
  __host__ __device__ uint32_t steps_at() const { return tokens * tok_stride(); }
  __host__ __device__ uint32_t sums_at() const { return steps_at() + (tokens * step_stride() * 4 + 15) / 16 * 16; }
  __host__ __device__ uint32_t partials_at() const { return sums_at() + tokens * sum_stride(); }
  __host__ __device__ uint32_t grid_at() const { return partials_at() + 2 * kWarps * tokens * 16 * 4; }
  __host__ __device__ uint32_t bytes() const { return grid_at() + grid_bytes; }
};

// Warps sharing a tile's items: a power of two up to 8, at most the items of a row.
__host__ __device__ constexpr uint32_t warps_per_tile(uint32_t items) {
  return items >= 8 ? 8 : items >= 4 ? 4 : items >= 2 ? 2 : 1;
}

// What a product reads besides the weights: the quantized x in shared memory, the lane's place in
// the MMA fragments (g = lane / 4, q = lane % 4), the group's token count, the IQ3_S grid (shared
// memory) and the IQ4_NL levels as 16 bytes for byte permutes.
struct Ctx {
  const unsigned char* xb;
  const float* steps;
  const unsigned char* sums;
  const uint32_t* grid;
  Layout lay;
  uint32_t g, q, ntok;
  uint32_t iq4nl[4];
};
struct Tables {
  const uint32_t* iq3s_grid;
  uint32_t iq4nl[4];
};

// Token g's B fragments of unit `unit`. Columns past the group's tokens read its last token: their
// sums are never stored, and each column's sums are its own, so no register is zeroed for them.
__device__ __forceinline__ void load_b(const Ctx& c, uint32_t unit, mma::FragB& hi, mma::FragB& lo) {
  const uint4 v = *reinterpret_cast<const uint4*>(c.xb + min(c.g, c.ntok - 1) * c.lay.tok_stride() + unit * 64 +
                                                  c.q * 16);
  hi = {{v.x, v.y}};
  lo = {{v.z, v.w}};
}
// d = a * b with a zero C operand (RZ in the instruction: no registers zeroed for it), the
// signedness of mma::mma_k32.
template <bool SignedA, bool SignedB>
__device__ __forceinline__ void mma_k32_zero_c(mma::FragC& d, const mma::FragA& a, const mma::FragB& b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define FERRY_MMA_K32_ZERO_C(AT, BT)                                                                  \
  asm("mma.sync.aligned.m16n8k32.row.col.s32." AT "." BT ".s32 "                                    \
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};"                         \
      : "=r"(d.r[0]), "=r"(d.r[1]), "=r"(d.r[2]), "=r"(d.r[3])                                      \
      : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]), "r"(b.r[1]), "r"(0))
  if constexpr (SignedA && SignedB) {
    FERRY_MMA_K32_ZERO_C("s8", "s8");
  } else if constexpr (SignedA) {
    FERRY_MMA_K32_ZERO_C("s8", "u8");
  } else if constexpr (SignedB) {
    FERRY_MMA_K32_ZERO_C("u8", "s8");
  } else {
    FERRY_MMA_K32_ZERO_C("u8", "u8");
  }
#undef FERRY_MMA_K32_ZERO_C
#else
  (void)d;
  (void)a;
  (void)b;
  __trap();
#endif
}
// The int32 sums of A's rows (g, g + 8) with the lane's tokens (2q, 2q + 1): s[2r + t], hi * 256 + lo.
template <bool SignedA>
__device__ __forceinline__ void sums(const mma::FragA& A, const mma::FragB& hi, const mma::FragB& lo, int (&s)[4]) {
  mma::FragC ch, cl;
  mma_k32_zero_c<SignedA, true>(ch, A, hi);
  mma_k32_zero_c<SignedA, false>(cl, A, lo);
#pragma unroll
  for (int i = 0; i < 4; ++i) s[i] = ch.r[i] * 256 + cl.r[i];
}
// Token t's step of unit `unit` (past the group's tokens its last token's, as load_b).
__device__ __forceinline__ float x_step(const Ctx& c, uint32_t t, uint32_t unit) {
  return c.steps[min(t, c.ntok - 1) * c.lay.step_stride() + unit];
}

// d = a * b + c over tf32 (m16n8k8, f32 sums): a[0] / a[1] rows g / g + 8 and a[2] / a[3] the same
// rows at a second k, b[0] / b[1] column g at those two k; d as mma_k32's C.
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint4& b_pair, bool lo) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t b0 = lo ? b_pair.z : b_pair.x, b1 = lo ? b_pair.w : b_pair.y;
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  (void)d;
  (void)a;
  (void)b_pair;
  (void)lo;
  __trap();
#endif
}
// Asks for `bytes` from p into L2 (sm90's bulk prefetch; a hint, nothing waits for it). p and bytes
// are rounded out to 16 bytes: the rows of a matrix, whose allocation extends to that.
__device__ __forceinline__ void prefetch_l2(const uint8_t* p, size_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const size_t from = __cvta_generic_to_global(p) & ~size_t{15};
  const size_t to = (__cvta_generic_to_global(p + bytes) + 15) & ~size_t{15};
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(from), "r"(static_cast<uint32_t>(to - from))
               : "memory");
#else
  (void)p;
  (void)bytes;
#endif
}

// x rounded to tf32 (nearest, ties away), as an f32.
__device__ __forceinline__ float tf32_round(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return __uint_as_float(r);
#else
  __trap();
  return x;
#endif
}

// Per type: a superblock's bytes and the items it is read in (one, or Q6_K's two halves), which
// columns lane q multiplies (kNatural: 4q..4q+3 and 16+4q..16+4q+3 of a unit, MMA k order; else
// 8q..8q+7), what a lane loads of an item for rows g and g + 8 (Regs, load) and its products
// for the lane's C fragment added to acc (product). A's registers: a[0] / a[2] row g, the lane's
// first / second four columns; a[1] / a[3] row g + 8.
template <int T> struct MmaReader;

// Q4_K and Q5_K: d, dmin, 12 bytes of 6-bit scales and minimums (k4_scale_min's rule), sub-block j's
// 32 columns from chunk j / 2 (low nibbles for even j, high for odd); per sub-block sum(q x) *
// scale * x's step in f32; the minimum terms sum(minimum * sum(x)) over the 8 sub-blocks as one tf32
// MMA (the minimums are small integers, the sums split into two tf32 parts: ~22 bits of each); d
// and dmin once a superblock.
struct K4Scales {
  float d[2], dmin[2];
  uint32_t sc[2][2], mn[2][2];  // byte j of [r][0] / [r][1]: sub-block j / 4 + j of row r
  __device__ explicit K4Scales(const uint4 (&head)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint4 h = head[r];
      d[r] = qd::h2f(h.x & 0xffff);
      dmin[r] = qd::h2f(h.x >> 16);
      sc[r][0] = h.y & 0x3f3f3f3fu;
      mn[r][0] = h.z & 0x3f3f3f3fu;
      sc[r][1] = (h.w & 0x0f0f0f0fu) | ((h.y >> 2) & 0x30303030u);
      mn[r][1] = ((h.w >> 4) & 0x0f0f0f0fu) | ((h.z >> 2) & 0x30303030u);
    }
  }
};
// a_of(j, A) fills sub-block j's A fragment.
template <class AOf>
__device__ __forceinline__ void k4_product(const K4Scales& k, uint32_t sb, const Ctx& c, AOf a_of, float (&acc)[4]) {
  float sd[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    mma::FragA A;
    a_of(j, A);
    const uint32_t unit = 8 * sb + j;
    mma::FragB hi, lo;
    load_b(c, unit, hi, lo);
    int s[4];
    sums<false>(A, hi, lo, s);
    const float x0 = x_step(c, 2 * c.q, unit), x1 = x_step(c, 2 * c.q + 1, unit);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int scale = static_cast<int>((k.sc[r][j >> 2] >> (8 * (j & 3))) & 0xff);
      // |s| * scale < 31 * 32767 * 32 * 63: no int32 overflow.
      sd[2 * r] += static_cast<float>(s[2 * r] * scale) * x0;
      sd[2 * r + 1] += static_cast<float>(s[2 * r + 1] * scale) * x1;
    }
  }
  // A: the minimums of sub-blocks q (a[0], a[1]) and q + 4 (a[2], a[3]); B: token g's sums of them.
  const uint32_t am[4] = {__float_as_uint(qd::byte_f(k.mn[0][0], c.q)), __float_as_uint(qd::byte_f(k.mn[1][0], c.q)),
                          __float_as_uint(qd::byte_f(k.mn[0][1], c.q)), __float_as_uint(qd::byte_f(k.mn[1][1], c.q))};
  const uint4 bm = *reinterpret_cast<const uint4*>(c.sums + min(c.g, c.ntok - 1) * c.lay.sum_stride() + sb * 64 +
                                                   c.q * 16);
  float sm[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  mma_tf32(sm, am, bm, false);
  mma_tf32(sm, am, bm, true);
#pragma unroll
  for (int i = 0; i < 4; ++i) acc[i] += k.d[i >> 1] * sd[i] - k.dmin[i >> 1] * sm[i];
}

template <> struct MmaReader<qd::kQ4_K> {
  static constexpr uint32_t kBlockBytes = 144, kItems = 1;
  static constexpr bool kNatural = false;
  struct Regs {
    uint4 head[2];   // bytes 0..15 of rows g, g + 8
    uint2 qs[2][4];  // bytes 8q..8q+7 of each chunk
  };
  __device__ static void load(const uint8_t* blk, uint32_t, uint32_t r, uint32_t q, Regs& w) {
    w.head[r] = *reinterpret_cast<const uint4*>(blk);
#pragma unroll
    for (int c = 0; c < 4; ++c) w.qs[r][c] = *reinterpret_cast<const uint2*>(blk + 16 + 32 * c + 8 * q);
  }
  __device__ static void product(const Regs& w, uint32_t sb, uint32_t, const Ctx& c, float (&acc)[4]) {
    k4_product(K4Scales(w.head), sb, c,
               [&](int j, mma::FragA& A) {
                 const int ch = j >> 1, shift = 4 * (j & 1);
                 A.r[0] = (w.qs[0][ch].x >> shift) & 0x0f0f0f0fu;
                 A.r[1] = (w.qs[1][ch].x >> shift) & 0x0f0f0f0fu;
                 A.r[2] = (w.qs[0][ch].y >> shift) & 0x0f0f0f0fu;
                 A.r[3] = (w.qs[1][ch].y >> shift) & 0x0f0f0f0fu;
               },
               acc);
  }
};

// Q5_K: Q4_K's nibbles at byte 48, their fifth bits in qh (byte 16): bit j of qh[l] for column l of
// sub-block j.
template <> struct MmaReader<qd::kQ5_K> {
  static constexpr uint32_t kBlockBytes = 176, kItems = 1;
  static constexpr bool kNatural = false;
  struct Regs {
    uint4 head[2];
    uint2 qh[2];     // qh bytes 8q..8q+7
    uint2 qs[2][4];
  };
  __device__ static void load(const uint8_t* blk, uint32_t, uint32_t r, uint32_t q, Regs& w) {
    w.head[r] = *reinterpret_cast<const uint4*>(blk);
    w.qh[r] = *reinterpret_cast<const uint2*>(blk + 16 + 8 * q);
#pragma unroll
    for (int c = 0; c < 4; ++c) w.qs[r][c] = *reinterpret_cast<const uint2*>(blk + 48 + 32 * c + 8 * q);
  }
  __device__ static void product(const Regs& w, uint32_t sb, uint32_t, const Ctx& c, float (&acc)[4]) {
    k4_product(K4Scales(w.head), sb, c,
               [&](int j, mma::FragA& A) {
                 const int ch = j >> 1, shift = 4 * (j & 1);
                 auto v = [&](uint32_t q4, uint32_t h) { return ((q4 >> shift) & 0x0f0f0f0fu) | (((h >> j) & 0x01010101u) << 4); };
                 A.r[0] = v(w.qs[0][ch].x, w.qh[0].x);
                 A.r[1] = v(w.qs[1][ch].x, w.qh[1].x);
                 A.r[2] = v(w.qs[0][ch].y, w.qh[0].y);
                 A.r[3] = v(w.qs[1][ch].y, w.qh[1].y);
               },
               acc);
  }
};

// Q6_K, read in halves n (columns 128n..): unit 4n + m's columns l = 0..31 are the low (m < 2) or
// high nibbles of ql[64n + 32 (m & 1) + l] with bits 2m, 2m + 1 of qh[32n + l] above them, minus 32;
// one int8 scale a 16 columns (sc[8n + 2m + l / 16]), d last. Natural columns: the lane's first four
// are in the unit's first 16, its second four in the second, so each half's sum is an MMA over A
// with the other half's registers zero. Blocks are 210 bytes: 2-byte loads.
template <> struct MmaReader<qd::kQ6_K> {
  static constexpr uint32_t kBlockBytes = 210, kItems = 2;
  static constexpr bool kNatural = true;
  struct Regs {
    uint32_t ql[2][4];  // ql[64n + 16i + 4q..] for i = 0..3
    uint32_t qh[2][2];  // qh[32n + 16i + 4q..] for i = 0, 1
    uint32_t sc[2][2];  // sc[8n..8n + 7]
    uint32_t d[2];
  };
  __device__ static void load(const uint8_t* blk, uint32_t n, uint32_t r, uint32_t q, Regs& w) {
#pragma unroll
    for (int i = 0; i < 4; ++i) w.ql[r][i] = qd::ld_u32_a2(blk + 64 * n + 16 * i + 4 * q);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      w.qh[r][i] = qd::ld_u32_a2(blk + 128 + 32 * n + 16 * i + 4 * q);
      w.sc[r][i] = qd::ld_u32_a2(blk + 192 + 8 * n + 4 * i);
    }
    w.d[r] = qd::ld_u16(blk + 208);
  }
  __device__ static void product(const Regs& w, uint32_t sb, uint32_t n, const Ctx& c, float (&acc)[4]) {
    float sd[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      // v[r][h]: row r's four values in half h of unit m (q - 32 bytewise: 6-bit q, so the wrapped
      // bytes read as int8 are exact).
      uint32_t v[2][2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t raw = w.ql[r][2 * (m & 1) + h];
          const uint32_t nib = (m >> 1) ? (raw >> 4) & 0x0f0f0f0fu : raw & 0x0f0f0f0fu;
          v[r][h] = __vsub4(nib | (((w.qh[r][h] >> (2 * m)) & 0x03030303u) << 4), 0x20202020u);
        }
      }
      const uint32_t unit = 8 * sb + 4 * n + m;
      mma::FragB hi, lo;
      load_b(c, unit, hi, lo);
      const mma::FragA a0{{v[0][0], v[1][0], 0u, 0u}}, a1{{0u, 0u, v[0][1], v[1][1]}};
      int s0[4], s1[4];
      sums<true>(a0, hi, lo, s0);
      sums<true>(a1, hi, lo, s1);
      const float x0 = x_step(c, 2 * c.q, unit), x1 = x_step(c, 2 * c.q + 1, unit);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        // Scales 2m and 2m + 1 of the half: bytes 2 (m & 1) and 2 (m & 1) + 1 of word m / 2.
        const uint32_t word = w.sc[r][m >> 1];
        const float f0 = static_cast<float>(static_cast<int8_t>((word >> (16 * (m & 1))) & 0xff));
        const float f1 = static_cast<float>(static_cast<int8_t>((word >> (16 * (m & 1) + 8)) & 0xff));
        // |s| < 32 * 32767 * 16 < 2^24: exact in f32.
        sd[2 * r] += (static_cast<float>(s0[2 * r]) * f0 + static_cast<float>(s1[2 * r]) * f1) * x0;
        sd[2 * r + 1] += (static_cast<float>(s0[2 * r + 1]) * f0 + static_cast<float>(s1[2 * r + 1]) * f1) * x1;
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i] += qd::h2f(w.d[i >> 1]) * sd[i];
  }
};

// The IQ4_NL levels of the 4 indices in the low nibbles of idx's bytes: levels 0-7 and 8-15 permuted
// by the low 3 bits, chosen between by bit 3.
__device__ __forceinline__ uint32_t iq4nl_levels(uint32_t idx, const uint32_t (&t)[4]) {
  const uint32_t low3 = idx & 0x07070707u;
  const uint32_t sel = __byte_perm(low3 | (low3 >> 4), 0, 0x0020);
  const uint32_t lo = __byte_perm(t[0], t[1], sel), hi = __byte_perm(t[2], t[3], sel);
  const uint32_t high = ((idx >> 3) & 0x01010101u) * 0xffu;
  return (lo & ~high) | (hi & high);
}

// IQ4_XS: d, scales_h (u16), scales_l (4 bytes), then sub-block j's columns l < 16 in the low
// nibbles of qs[16j + l], l >= 16 in the high nibbles of qs[16j + l - 16]: with natural columns a
// lane's four bytes give both of its fours. One 6-bit scale (minus 32) a sub-block.
template <> struct MmaReader<qd::kIQ4_XS> {
  static constexpr uint32_t kBlockBytes = 136, kItems = 1;
  static constexpr bool kNatural = true;
  struct Regs {
    uint2 head[2];       // d | scales_h << 16, scales_l
    uint32_t qs[2][8];   // qs[16j + 4q..]
  };
  __device__ static void load(const uint8_t* blk, uint32_t, uint32_t r, uint32_t q, Regs& w) {
    w.head[r] = *reinterpret_cast<const uint2*>(blk);
#pragma unroll
    for (int j = 0; j < 8; ++j) w.qs[r][j] = *reinterpret_cast<const uint32_t*>(blk + 8 + 16 * j + 4 * q);
  }
  __device__ static void product(const Regs& w, uint32_t sb, uint32_t, const Ctx& c, float (&acc)[4]) {
    float sd[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      mma::FragA A;
      A.r[0] = iq4nl_levels(w.qs[0][j] & 0x0f0f0f0fu, c.iq4nl);
      A.r[1] = iq4nl_levels(w.qs[1][j] & 0x0f0f0f0fu, c.iq4nl);
      A.r[2] = iq4nl_levels((w.qs[0][j] >> 4) & 0x0f0f0f0fu, c.iq4nl);
      A.r[3] = iq4nl_levels((w.qs[1][j] >> 4) & 0x0f0f0f0fu, c.iq4nl);
      const uint32_t unit = 8 * sb + j;
      mma::FragB hi, lo;
      load_b(c, unit, hi, lo);
      int s[4];
      sums<true>(A, hi, lo, s);
      const float x0 = x_step(c, 2 * c.q, unit), x1 = x_step(c, 2 * c.q + 1, unit);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const uint32_t scales_h = w.head[r].x >> 16, scales_l = w.head[r].y;
        const int ls = static_cast<int>(((scales_l >> (4 * j)) & 0xf) | (((scales_h >> (2 * j)) & 3) << 4)) - 32;
        const float f = static_cast<float>(ls);
        sd[2 * r] += static_cast<float>(s[2 * r]) * f * x0;
        sd[2 * r + 1] += static_cast<float>(s[2 * r + 1]) * f * x1;
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i] += qd::h2f(w.head[i >> 1].x & 0xffff) * sd[i];
  }
};

// IQ3_S: d, qs (64 bytes), qh (8), signs (32), scales (4). Sub-block j's columns in 8 groups of 4,
// group k a grid entry (qs[8j + k] and bit k of qh[j]) with the 4 sign bits 4k.. of signs[4j..];
// a lane's eight columns are groups 2q, 2q + 1. One scale 1 + 2 * nibble a sub-block. Blocks are
// 110 bytes: 2-byte loads.
template <> struct MmaReader<qd::kIQ3_S> {
  static constexpr uint32_t kBlockBytes = 110, kItems = 1;
  static constexpr bool kNatural = false;
  struct Regs {
    uint32_t qs[2][4];     // qs[8j + 2q], qs[8j + 2q + 1] in bytes 2 (j & 1), + 1 of word j / 2
    uint32_t qh[2][2];     // qh[0..7]
    uint32_t signs[2][2];  // signs[4j + q] in byte j & 3 of word j / 4
    uint32_t head[2];      // d | scales[0..1] << 16
    uint32_t scales[2];    // scales[2..3]
  };
  __device__ static void load(const uint8_t* blk, uint32_t, uint32_t r, uint32_t q, Regs& w) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      w.qs[r][i] = qd::ld_u16(blk + 2 + 16 * i + 2 * q) | (qd::ld_u16(blk + 10 + 16 * i + 2 * q) << 16);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      w.qh[r][i] = qd::ld_u32_a2(blk + 66 + 4 * i);
      const uint8_t* sg = blk + 74 + 16 * i + q;
      w.signs[r][i] = sg[0] | (sg[4] << 8) | (sg[8] << 16) | (static_cast<uint32_t>(sg[12]) << 24);
    }
    w.head[r] = qd::ld_u16(blk) | (qd::ld_u16(blk + 106) << 16);
    w.scales[r] = qd::ld_u16(blk + 108);
  }
  __device__ static void product(const Regs& w, uint32_t sb, uint32_t, const Ctx& c, float (&acc)[4]) {
    float sd[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      // v[r][e]: row r's group 2q + e.
      uint32_t v[2][2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const uint32_t qs2 = (w.qs[r][j >> 1] >> (16 * (j & 1))) & 0xffff;
        const uint32_t qh = (w.qh[r][j >> 2] >> (8 * (j & 3) + 2 * c.q)) & 3;
        const uint32_t sg = (w.signs[r][j >> 2] >> (8 * (j & 3))) & 0xff;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const uint32_t entry = c.grid[((qs2 >> (8 * e)) & 0xff) | (((qh >> e) & 1) << 8)];
          // Sign bit k to byte k, then 0xff in negative bytes: (x ^ 0xff) - 0xff is -x bytewise.
          const uint32_t neg = ((((sg >> (4 * e)) & 0xf) * 0x00204081u) & 0x01010101u) * 0xffu;
          v[r][e] = __vsub4(entry ^ neg, neg);
        }
      }
      const mma::FragA A{{v[0][0], v[1][0], v[0][1], v[1][1]}};
      const uint32_t unit = 8 * sb + j;
      mma::FragB hi, lo;
      load_b(c, unit, hi, lo);
      int s[4];
      sums<true>(A, hi, lo, s);
      const float x0 = x_step(c, 2 * c.q, unit), x1 = x_step(c, 2 * c.q + 1, unit);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const uint32_t nibbles = j < 4 ? w.head[r] >> 16 : w.scales[r];
        const float f = static_cast<float>(1 + 2 * ((nibbles >> (4 * (j & 3))) & 0xf));
        sd[2 * r] += static_cast<float>(s[2 * r]) * f * x0;
        sd[2 * r + 1] += static_cast<float>(s[2 * r + 1]) * f * x1;
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i] += qd::h2f(w.head[i >> 1] & 0xffff) * sd[i];
  }
};

// Token t's 16 values at columns 16p.. (SwiGLU of gate and up where x_up is set), as the dp2a kernel
// reads them.
__device__ __forceinline__ void read_x16(const MatvecArgs& a, const MatvecPartView& view, uint32_t g, size_t at,
                                         float (&v)[16]) {
  const float4* src = reinterpret_cast<const float4*>(view.x + at);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float4 f = src[k];
    v[4 * k] = f.x, v[4 * k + 1] = f.y, v[4 * k + 2] = f.z, v[4 * k + 3] = f.w;
  }
  if (a.x_up == nullptr) return;
  const float4* up =
      reinterpret_cast<const float4*>(a.x_up + static_cast<size_t>(g / a.x_group_div) * a.x_group_stride + at);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float4 u = up[k];
    v[4 * k] = swiglu_value(v[4 * k], u.x, a.swiglu_limit);
    v[4 * k + 1] = swiglu_value(v[4 * k + 1], u.y, a.swiglu_limit);
    v[4 * k + 2] = swiglu_value(v[4 * k + 2], u.z, a.swiglu_limit);
    v[4 * k + 3] = swiglu_value(v[4 * k + 3], u.w, a.swiglu_limit);
  }
}

// Quantizes the group's tokens into the B layout: a thread 16 values (half of a 32-value unit, its
// neighbour the other half), rounded as the dp2a kernel rounds them (gpu/x_int16.cuh), each int16 as
// its hi and lo bytes.
template <bool kNatural>
__device__ void quantize_x(const MatvecArgs& a, const MatvecPartView& view, uint32_t g, const int32_t* tok_x,
                           uint32_t ntok, const Layout& lay, unsigned char* smem) {
  const uint32_t K = a.w.cols, pieces = ntok * (K / 16);
  float* steps = reinterpret_cast<float*>(smem + lay.steps_at());
  for (uint32_t base = 0; base < pieces; base += kThreads) {
    const uint32_t i = base + threadIdx.x;
    const bool valid = i < pieces;
    const uint32_t t = valid ? i / (K / 16) : 0, p = valid ? i % (K / 16) : 0;
    float v[16] = {};
    if (valid) read_x16(a, view, g, static_cast<size_t>(tok_x != nullptr ? tok_x[t] : t) * a.x_tok_stride + 16 * p, v);
    float amax, sum;
    x16_stats(v, amax, sum);
    amax = x32_amax(amax);
    const float other_sum = __shfl_xor_sync(0xffffffffu, sum, 1);
    if (!valid) continue;
    uint32_t packed[8];
    x16_pack(v, amax, packed);
    // hi[k], lo[k]: the high / low bytes of columns 16 half + 4k..4k+3 (packed: two int16 a word).
    uint32_t hi[4], lo[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      hi[k] = __byte_perm(packed[2 * k], packed[2 * k + 1], 0x7531);
      lo[k] = __byte_perm(packed[2 * k], packed[2 * k + 1], 0x6420);
    }
    const uint32_t unit = p / 2, half = p % 2;
    unsigned char* slots = smem + t * lay.tok_stride() + unit * 64;
    if constexpr (kNatural) {
      // Columns 16 half + 4k.. are lane k's b[half].
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        uint32_t* slot = reinterpret_cast<uint32_t*>(slots + 16 * k);
        slot[half] = hi[k];
        slot[2 + half] = lo[k];
      }
    } else {
      // Columns 16 half + 0..7 are lane 2 half's, 8..15 lane 2 half + 1's.
      uint4* dst = reinterpret_cast<uint4*>(slots + half * 32);
      dst[0] = make_uint4(hi[0], hi[1], lo[0], lo[1]);
      dst[1] = make_uint4(hi[2], hi[3], lo[2], lo[3]);
    }
    if (half == 0) {
      steps[t * lay.step_stride() + unit] = x32_scale(amax);
      const float total = sum + other_sum, hi_part = tf32_round(total);
      const uint32_t j = unit % 8;
      float* slot = reinterpret_cast<float*>(smem + lay.sums_at() + t * lay.sum_stride() + unit / 8 * 64 + (j % 4) * 16);
      slot[j / 4] = hi_part;
      slot[2 + j / 4] = tf32_round(total - hi_part);
    }
  }
}

constexpr uint32_t kGridBytes = sizeof(uint32_t) * 512;
__host__ __device__ constexpr uint32_t grid_bytes(int type) { return type == qd::kIQ3_S ? kGridBytes : 0; }

template <int T>
__global__ void __launch_bounds__(kThreads, 2) mma_kernel(MatvecArgs a, Tables tables) {
  using R = MmaReader<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  // Groups, tokens named on the device and PDL as in the dp2a kernel (gpu/matvec_int16.cu): the
  // weights no earlier kernel picks are requested before the wait, x and y touched only after it.
  const bool fixed_weights = a.w_group_index == nullptr && a.w_group_ptrs == nullptr && a.group_count == nullptr &&
                             (a.parts < 2 || a.more[0].group_ptrs == nullptr) &&
                             (a.parts < 3 || a.more[1].group_ptrs == nullptr);
  if (!fixed_weights) pdl_wait();
  uint32_t g = blockIdx.y, bx = blockIdx.x, nb = gridDim.x, ntok = a.tokens;
  const int32_t *tok_x = nullptr, *tok_y = nullptr;
  if (a.group_count != nullptr) {
    const uint32_t groups = min(static_cast<uint32_t>(max(*a.group_count, 0)), a.groups);
    if (groups == 0) return;
    g = blockIdx.x % groups;
    bx = blockIdx.x / groups;
    nb = gridDim.x / groups + (g < gridDim.x % groups ? 1 : 0);
    ntok = min(static_cast<uint32_t>(max(a.tok_count[g], 0)), a.tokens);
    if (ntok == 0) return;
    tok_x = a.tok_x + static_cast<size_t>(g) * a.tokens;
    tok_y = a.tok_y + static_cast<size_t>(g) * a.tokens;
  }
  if (a.skip_negative_index && a.w_group_index[g] < 0) return;
  const uint32_t items = a.w.cols / 256 * R::kItems;
  const Layout lay{a.w.cols / 32, a.tokens, grid_bytes(T)};
  const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, lg = lane >> 2, lq = lane & 3;
  // Warp `warp` takes items slice, slice + wpt, ... of tile `in_step` of each block step.
  const uint32_t wpt = warps_per_tile(items), tiles_per_step = kWarps / wpt;
  const uint32_t in_step = warp / wpt, slice = warp % wpt;
  const uint32_t mine = (items - slice + wpt - 1) / wpt;
  const MatvecPartView view = matvec_part_view(a, g);
  const uint32_t tiles = (view.rows + 15) / 16;
  auto tile_of = [&](uint32_t step, uint32_t at) { return (bx + step * nb) * tiles_per_step + at; };
  if (view.rows == 0) return;
  // The lane's rows g and g + 8 of the warp's tile in a step. Rows past the matrix (the last tile's,
  // the step after a block's last) read its last row instead: their sums are not stored, and the
  // loads need no predicate or zeroing.
  struct Rows {
    const uint8_t* p[2];
  };
  auto rows_of = [&](uint32_t step) {
    const uint32_t row0 = tile_of(step, in_step) * 16 + lg;
    Rows r;
#pragma unroll
    for (uint32_t i = 0; i < 2; ++i) r.p[i] = view.w + static_cast<size_t>(min(row0 + 8 * i, view.rows - 1)) * a.w.row_bytes;
    return r;
  };
  auto load = [&](const Rows& rows, uint32_t j, typename R::Regs& w) {
    const uint32_t item = slice + j * wpt;
    const uint32_t col_bytes = item / R::kItems * R::kBlockBytes;
#pragma unroll
    for (uint32_t r = 0; r < 2; ++r) R::load(rows.p[r] + col_bytes, item % R::kItems, r, lq, w);
  };

  // The rows of a block step lie together: one thread asks for the next step's into L2 while the
  // current one runs (weights that no earlier kernel picks only: a routed expert's call is one step
  // a block, and its pointers may be mapped host memory), so that the warps' own loads, one
  // superblock ahead, find them there.
  auto prefetch_step = [&](uint32_t step) {
    const uint32_t row0 = tile_of(step, 0) * 16;
    if (!fixed_weights || threadIdx.x != 0 || row0 >= view.rows) return;
    const uint32_t n = min(tiles_per_step * 16, view.rows - row0);
    prefetch_l2(view.w + static_cast<size_t>(row0) * a.w.row_bytes, static_cast<size_t>(n) * a.w.row_bytes);
  };
  prefetch_step(0);
  prefetch_step(1);
  Rows rows = rows_of(0);
  typename R::Regs cur;
  load(rows, 0, cur);
  uint32_t* grid = reinterpret_cast<uint32_t*>(smem + lay.grid_at());
  if constexpr (T == qd::kIQ3_S) {
    for (uint32_t i = threadIdx.x; i < kGridBytes / 4; i += kThreads) grid[i] = tables.iq3s_grid[i];
  }
  if (fixed_weights) pdl_wait();
  pdl_launch_dependents();
  quantize_x<R::kNatural>(a, view, g, tok_x, ntok, lay, smem);
  __syncthreads();

  const Ctx ctx{smem,
                reinterpret_cast<const float*>(smem + lay.steps_at()),
                smem + lay.sums_at(),
                grid,
                lay,
                lg,
                lq,
                ntok,
                {tables.iq4nl[0], tables.iq4nl[1], tables.iq4nl[2], tables.iq4nl[3]}};
  float* partials = reinterpret_cast<float*>(smem + lay.partials_at());
  auto store = [&](uint32_t row, uint32_t t, float v) {
    const size_t yt = tok_y != nullptr ? static_cast<size_t>(tok_y[t]) : static_cast<size_t>(t);
    view.y[static_cast<size_t>(g) * a.y_group_stride + row + yt * view.y_tok_stride] = v;
  };
  for (uint32_t step = 0; tile_of(step, 0) < tiles; ++step) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const Rows after = rows_of(step + 1);
    for (uint32_t j = 0; j < mine; ++j) {
      typename R::Regs next;
      if (j + 1 < mine) {
        load(rows, j + 1, next);
      } else {
        load(after, 0, next);
      }
      const uint32_t item = slice + j * wpt;
      R::product(cur, item / R::kItems, item % R::kItems, ctx, acc);
      cur = next;
    }
    rows = after;
    prefetch_step(step + 2);
    // acc[2r + t]: row lg + 8r, token 2 lq + t of the tile.
    if (wpt == 1) {
#pragma unroll
      for (uint32_t i = 0; i < 4; ++i) {
        const uint32_t row = tile_of(step, in_step) * 16 + lg + 8 * (i >> 1), t = 2 * lq + (i & 1);
        if (row < view.rows && t < ntok) store(row, t, acc[i]);
      }
      continue;
    }
    float* buf = partials + (step & 1) * kWarps * a.tokens * 16;
#pragma unroll
    for (uint32_t i = 0; i < 4; ++i) {
      const uint32_t t = 2 * lq + (i & 1);
      if (t < ntok) buf[(warp * a.tokens + t) * 16 + lg + 8 * (i >> 1)] = acc[i];
    }
    // One barrier a step: a buffer is written again two steps on, after every thread has passed the
    // next step's barrier and so finished reading it.
    __syncthreads();
    for (uint32_t idx = threadIdx.x; idx < tiles_per_step * ntok * 16; idx += kThreads) {
      const uint32_t at = idx / (ntok * 16), t = idx / 16 % ntok, rl = idx % 16;
      const uint32_t row = tile_of(step, at) * 16 + rl;
      float sum = 0.0f;
      for (uint32_t w = 0; w < wpt; ++w) sum += buf[((at * wpt + w) * a.tokens + t) * 16 + rl];
      if (row < view.rows) store(row, t, sum);
    }
  }
}

using Kernel = void (*)(MatvecArgs, Tables);
Kernel kernel_for(model::GgmlType type) {
  switch (type) {
    case model::GgmlType::Q4_K: return mma_kernel<qd::kQ4_K>;
    case model::GgmlType::Q5_K: return mma_kernel<qd::kQ5_K>;
    case model::GgmlType::Q6_K: return mma_kernel<qd::kQ6_K>;
    case model::GgmlType::IQ4_XS: return mma_kernel<qd::kIQ4_XS>;
    case model::GgmlType::IQ3_S: return mma_kernel<qd::kIQ3_S>;
    default: return nullptr;
  }
}
uint32_t items_per_superblock(model::GgmlType type) { return type == model::GgmlType::Q6_K ? 2 : 1; }
Layout layout_of(const MatvecArgs& a) {
  return {a.w.cols / 32, a.tokens, a.w.type == model::GgmlType::IQ3_S ? kGridBytes : 0};
}

// The shared-memory opt-in, once a kernel and device; then the blocks an SM holds at `smem` bytes
// (asked once a device, kernel and size: a decode graph's capture finds them asked by its eager step).
uint32_t resident_per_sm(Kernel kernel, size_t smem) {
  static std::mutex mutex;
  static std::set<std::pair<int, const void*>> opted;
  static std::map<std::tuple<int, const void*, size_t>, uint32_t> cache;
  int dev = 0;
  FERRY_CUDA(cudaGetDevice(&dev));
  const std::lock_guard<std::mutex> lock(mutex);
  const void* k = reinterpret_cast<const void*>(kernel);
  if (opted.insert({dev, k}).second) {
    FERRY_CUDA(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kMaxSmem)));
  }
  auto [it, fresh] = cache.try_emplace({dev, k, smem}, 0);
  if (fresh) {
    int n = 0;
    FERRY_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, smem));
    it->second = static_cast<uint32_t>(std::max(n, 1));
  }
  return it->second;
}

}  // namespace

bool matvec_mma_applies(const MatvecArgs& a) {
  if (!matvec_quantizes_activations(a)) return false;
  const Kernel kernel = kernel_for(a.w.type);
  return kernel != nullptr && code_built_for(reinterpret_cast<const void*>(kernel), 8) &&
         layout_of(a).bytes() <= kMaxSmem;
}

void launch_matvec_mma(const MatvecArgs& a, const uint32_t* iq3s_grid, cudaStream_t stream) {
  if (!matvec_mma_applies(a)) throw CudaError("launch_matvec_mma: no tensor-core kernel for this call");
  if (a.w.type == model::GgmlType::IQ3_S && iq3s_grid == nullptr) {
    throw CudaError("launch_matvec_mma: IQ3_S weights need the device grid");
  }
  Tables tables{iq3s_grid, {}};
  std::memcpy(tables.iq4nl, model::kIq4nlValues, sizeof(tables.iq4nl));
  const Kernel kernel = kernel_for(a.w.type);
  const size_t smem = layout_of(a).bytes();
  const uint32_t items = a.w.cols / 256 * items_per_superblock(a.w.type);
  const uint32_t rows_per_block = 16 * (kWarps / warps_per_tile(items));
  // Enough blocks to fill the device once; each block quantizes its input once and loops over tiles.
  const uint32_t wanted = (matvec_max_rows(a) + rows_per_block - 1) / rows_per_block;
  const uint32_t resident = static_cast<uint32_t>(current_sm_count()) * resident_per_sm(kernel, smem);
  dim3 grid;
  if (a.group_count != nullptr) {
    const uint32_t all = std::max<uint32_t>(1, resident / a.parts);
    grid = dim3(std::max(a.groups, std::min(wanted * a.groups, all)), 1, a.parts);
  } else {
    const uint32_t fill = std::max<uint32_t>(1, resident / (a.groups * a.parts));
    grid = dim3(std::min(wanted, fill), a.groups, a.parts);
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr{};
  pdl_configure(cfg, attr, reinterpret_cast<const void*>(kernel));
  FERRY_CUDA(cudaLaunchKernelEx(&cfg, kernel, a, tables));
  FERRY_CUDA_LAUNCHED();
}

}  // namespace ferry::gpu
