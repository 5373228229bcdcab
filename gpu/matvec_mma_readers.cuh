#pragma once
// What the tensor-core decode matvec (gpu/matvec_mma.cu) reads and multiplies: its shared-memory
// layout of the quantized x, each lane's places in it, and the per-type readers of a superblock (the
// general one over up to 8 tokens, K4Reader, and Q4_K's one-token products, K4One). Included by that
// file only.
#include <cuda_runtime.h>

#include <cstdint>

#include "gpu/mma_int8.cuh"
#include "gpu/quant_device.cuh"

namespace ferry::gpu::matvec_mma_detail {

constexpr uint32_t kWarps = 8, kThreads = kWarps * 32;
// Dynamic shared memory the kernel is allowed (the opt-in above 48 KiB, sm80+): what the largest
// call that takes the int16 path needs here (8 tokens of 2,304 columns: ~52 KiB) fits.
constexpr size_t kMaxSmem = 64 * 1024;

// Shared memory of a block for `tokens` tokens of `units` 32-column units:
//   B: per token (tok_stride bytes, 64 more than the values so that two tokens' fragment loads of one
//      quarter-warp fall in different banks), per unit, per lane q 16 bytes: the hi bytes of the
//      lane's 8 columns of the unit (b[0]'s four, then b[1]'s), then their lo bytes; the one-token
//      products (OneToken) take units of 80 bytes (their 8 lanes' loads of a step fall in different
//      banks), lo bytes as s8 (lo - 128), and 144 zero bytes after them;
//   steps: per token (units + 1: the pad again), per unit, amax / 32767;
//   sums (for the K-quant minimum terms, a tf32 MMA's B): per token (an odd number of 64 bytes: the
//      pad again), per superblock, per lane q 16 bytes: the sums of the 32 x of units q and q + 4 as
//      tf32 hi parts, then the lo parts (the remainders, tf32);
//   partial sums: two halves (a block's runs of steps alternate) x ring() steps x warps x tokens x 16
//      rows, so that the warps of a block meet at a barrier once every ring() steps, not every step.
struct Layout {
  uint32_t units, tokens;
  bool one = false;
  __host__ __device__ uint32_t unit_bytes() const { return one ? 80 : 64; }
  __host__ __device__ uint32_t zero_at() const { return units * unit_bytes(); }
  __host__ __device__ uint32_t tok_stride() const { return zero_at() + (one ? 144 : 64); }
  __host__ __device__ uint32_t step_stride() const { return units + 1; }
  __host__ __device__ uint32_t sum_stride() const { return (units / 8 | 1) * 64; }
  __host__ __device__ uint32_t steps_at() const { return tokens * tok_stride(); }
  __host__ __device__ uint32_t sums_at() const { return steps_at() + (tokens * step_stride() * 4 + 15) / 16 * 16; }
  __host__ __device__ uint32_t partials_at() const { return sums_at() + tokens * sum_stride(); }
  __host__ __device__ uint32_t step_floats() const { return kWarps * tokens * 16; }
  __host__ __device__ uint32_t bytes_at(uint32_t ring) const { return partials_at() + 2 * ring * step_floats() * 4; }
  // Steps between barriers: 8 / tokens (8 KiB of partial sums), fewer where that would not fit, so
  // that the ring never moves a call off this kernel (the 8-token case has 1, as before).
  __host__ __device__ uint32_t ring() const {
    uint32_t r = tokens < 8 ? 8 / tokens : 1;
    while (r > 1 && bytes_at(r) > kMaxSmem) r /= 2;
    return r;
  }
  __host__ __device__ uint32_t bytes() const { return bytes_at(ring()); }
};

// Warps sharing a tile's superblocks: a power of two up to 8, at most the superblocks of a row.
__host__ __device__ constexpr uint32_t warps_per_tile(uint32_t superblocks) {
  return superblocks >= 8 ? 8 : superblocks >= 4 ? 4 : superblocks >= 2 ? 2 : 1;
}

// What a lane's products read of the quantized x in shared memory (Layout), its places worked out
// once a block: token g's B fragments and sums (lane q's 16 bytes of unit / superblock 0), tokens
// 2q's and 2q + 1's steps, for g = lane / 4 and q = lane % 4 (the MMA fragments'). Columns past the
// group's tokens read its last token: their sums are never stored, and each column's sums are its
// own, so no register is zeroed for them.
struct LaneX {
  const unsigned char* xb;
  const unsigned char* sums;
  const float* step0;
  const float* step1;
  __device__ LaneX(const unsigned char* smem, const Layout& lay, uint32_t g, uint32_t q, uint32_t ntok) {
    const float* steps = reinterpret_cast<const float*>(smem + lay.steps_at());
    xb = smem + min(g, ntok - 1) * lay.tok_stride() + q * 16;
    sums = smem + lay.sums_at() + min(g, ntok - 1) * lay.sum_stride() + q * 16;
    step0 = steps + min(2 * q, ntok - 1) * lay.step_stride();
    step1 = steps + min(2 * q + 1, ntok - 1) * lay.step_stride();
  }
};
__device__ __forceinline__ void load_b(const LaneX& c, uint32_t unit, mma::FragB& hi, mma::FragB& lo) {
  const uint4 v = *reinterpret_cast<const uint4*>(c.xb + unit * 64);
  hi = {{v.x, v.y}};
  lo = {{v.z, v.w}};
}
__device__ __forceinline__ float x_step(const LaneX& c, uint32_t t, uint32_t unit) {
  return (t & 1 ? c.step1 : c.step0)[unit];
}
__device__ __forceinline__ uint4 load_sums(const LaneX& c, uint32_t sb) {
  return *reinterpret_cast<const uint4*>(c.sums + sb * 64);
}
// The int32 sums of A's rows (g, g + 8) with the lane's tokens (2q, 2q + 1): s[2r + t], hi * 256 + lo.
template <bool SignedA>
__device__ __forceinline__ void sums(const mma::FragA& A, const mma::FragB& hi, const mma::FragB& lo, int (&s)[4]) {
  mma::FragC ch, cl;
  mma::mma_k32_zero_c<SignedA, true>(ch, A, hi);
  mma::mma_k32_zero_c<SignedA, false>(cl, A, lo);
#pragma unroll
  for (int i = 0; i < 4; ++i) s[i] = ch.r[i] * 256 + cl.r[i];
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

// Per type: a superblock's bytes, what a lane loads of one for rows g and g + 8 (Regs, load) and its
// products for the lane's C fragment added to acc (product). A lane multiplies columns 8q..8q+7 of
// each 32-column unit; A's registers: a[0] / a[2] row g, the lane's first / second four columns;
// a[1] / a[3] row g + 8.
template <int T> struct MmaReader;

// Q4_K: d, dmin, 12 bytes of 6-bit scales and minimums (k4_scale_min's rule), sub-block j's
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
// a_of(j, A) fills sub-block j's A fragment (q: the lane's).
template <class AOf>
__device__ __forceinline__ void k4_product(const K4Scales& k, uint32_t sb, const LaneX& c, uint32_t q, AOf a_of,
                                           float (&acc)[4]) {
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
    const float x0 = x_step(c, 2 * q, unit), x1 = x_step(c, 2 * q + 1, unit);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int scale = static_cast<int>((k.sc[r][j >> 2] >> (8 * (j & 3))) & 0xff);
      // |s| * scale < 31 * 32767 * 32 * 63: no int32 overflow.
      sd[2 * r] += static_cast<float>(s[2 * r] * scale) * x0;
      sd[2 * r + 1] += static_cast<float>(s[2 * r + 1] * scale) * x1;
    }
  }
  // A: the minimums of sub-blocks q (a[0], a[1]) and q + 4 (a[2], a[3]); B: token g's sums of them.
  const uint32_t am[4] = {__float_as_uint(qd::byte_f(k.mn[0][0], q)), __float_as_uint(qd::byte_f(k.mn[1][0], q)),
                          __float_as_uint(qd::byte_f(k.mn[0][1], q)), __float_as_uint(qd::byte_f(k.mn[1][1], q))};
  const uint4 bm = load_sums(c, sb);
  float sm[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  mma_tf32(sm, am, bm, false);
  mma_tf32(sm, am, bm, true);
#pragma unroll
  for (int i = 0; i < 4; ++i) acc[i] += k.d[i >> 1] * sd[i] - k.dmin[i >> 1] * sm[i];
}

// Q4_K, and Q5_K (Five: the fifth bits between the head and the nibbles, bit j of qh's bytes for
// sub-block j, so bytes 8q..8q+7 of qh for the lane's columns of every sub-block).
template <bool Five> struct K4Reader {
  static constexpr uint32_t kBlockBytes = Five ? 176 : 144, kQs = Five ? 48 : 16;
  using Lane = LaneX;
  // The lane's part of rows g and g + 8 of a superblock: word q of each head (d, dmin and the 12
  // bytes of scales and minimums; the quad's four lanes hold a row's four), bytes 8q..8q+7 of qh
  // (Q5_K) and of each chunk of quantized weights.
  struct Regs {
    uint32_t head[2];
    uint2 qh[2];
    uint2 qs[2][4];
  };
  __device__ static void load_head(const uint8_t* blk, uint32_t r, uint32_t q, Regs& w) {
    w.head[r] = *reinterpret_cast<const uint32_t*>(blk + 4 * q);
    if (Five) w.qh[r] = *reinterpret_cast<const uint2*>(blk + 16 + 8 * q);
  }
  __device__ static void load_chunk(const uint8_t* blk, uint32_t r, uint32_t q, int c, Regs& w) {
    w.qs[r][c] = *reinterpret_cast<const uint2*>(blk + kQs + 32 * c + 8 * q);
  }
  __device__ static void load(const uint8_t* blk, uint32_t r, uint32_t q, Regs& w) {
    load_head(blk, r, q, w);
#pragma unroll
    for (int c = 0; c < 4; ++c) load_chunk(blk, r, q, c, w);
  }
  // The product of w, each piece of it then loaded again from the next superblock (next: its rows g
  // and g + 8) once used, so that the next superblock's loads are in flight during this one's
  // products in the registers of one; a row's head from the quad's lanes by shuffles; qh (used by
  // every sub-block) copied first, so that its next one is asked for with the head.
  __device__ static void product_reload(Regs& w, uint32_t sb, const LaneX& c, uint32_t q,
                                        const uint8_t* const (&next)[2], float (&acc)[4]) {
    uint4 head[2];
    const uint32_t quad = (threadIdx.x & 31) & ~3u;
#pragma unroll
    for (uint32_t r = 0; r < 2; ++r) {
      head[r] = make_uint4(__shfl_sync(0xffffffffu, w.head[r], quad), __shfl_sync(0xffffffffu, w.head[r], quad + 1),
                           __shfl_sync(0xffffffffu, w.head[r], quad + 2), __shfl_sync(0xffffffffu, w.head[r], quad + 3));
    }
    const K4Scales k(head);
    uint32_t h[4] = {0, 0, 0, 0};
    if (Five) h[0] = w.qh[0].x, h[1] = w.qh[1].x, h[2] = w.qh[0].y, h[3] = w.qh[1].y;
#pragma unroll
    for (uint32_t r = 0; r < 2; ++r) load_head(next[r], r, q, w);
    k4_product(k, sb, c, q,
               [&](int j, mma::FragA& A) {
                 const int ch = j >> 1, shift = 4 * (j & 1);
                 const uint32_t v[4] = {w.qs[0][ch].x, w.qs[1][ch].x, w.qs[0][ch].y, w.qs[1][ch].y};
#pragma unroll
                 for (int i = 0; i < 4; ++i) {
                   A.r[i] = (v[i] >> shift) & 0x0f0f0f0fu;
                   if (Five) A.r[i] |= ((h[i] >> j) & 0x01010101u) << 4;
                 }
                 if (j & 1) {
#pragma unroll
                   for (uint32_t r = 0; r < 2; ++r) load_chunk(next[r], r, q, ch, w);
                 }
               },
               acc);
  }
};
template <> struct MmaReader<qd::kQ4_K> : K4Reader<false> {};
template <> struct MmaReader<qd::kQ5_K> : K4Reader<true> {};

// One token (decode's call), Q4_K: the K4Reader's products leave 7 of each lane's 8 outputs unused
// (B's 8 columns are copies of the token), so here B's columns are 4 sub-blocks' hi and lo bytes
// instead. Lane q holds chunk c = 3 - q of rows g and g + 8 (sub-blocks 2c and 2c + 1: the low and
// the high nibbles), so A's k-quads q and 4 + q are that chunk's; B's column 2q + h is nonzero only
// at those k-quads: unit 2c + s's hi (h = 0) or lo (h = 1) bytes, where lane (g', q') has g' / 2 ==
// q', and zero on the other lanes. Eight MMAs a superblock (column octets m = 0..3 of the units of
// the low nibbles, s = 0, and of the high ones, s = 1, these taken as 16 q: exact, shifted back) give
// each lane the int32 sums of its two sub-blocks; lo is s8 (lo - 128, one B type for both halves), so
// 128 times the weights' sums (one more MMA each over a B of ones) are added back. The same integers
// as K4Reader's, and the f32 terms in its order: sub-blocks 0..7 of a row added in turn, from lane 3
// (chunk 0) down to lane 0 by shuffles, where the tile's outputs are (acc[0], acc[2]): the same bits.
struct LaneOne {
  const unsigned char* xb;  // this lane's B bytes of unit 2c of superblock 0, or the zero bytes
  uint32_t xb_stride;       // a superblock's units (8 x 80 bytes), 0 on the lanes of zero columns
  uint32_t ones;            // B of the weights' sums: 1 in each byte on the lanes of nonzero columns
  const float* steps;       // units 2c, 2c + 1 of superblock 0
  const unsigned char* sums;
  __device__ LaneOne(const unsigned char* smem, const Layout& lay, uint32_t g, uint32_t q, uint32_t) {
    const bool live = g / 2 == q;
    const uint32_t c = 3 - q;
    xb = smem + (live ? 2 * c * lay.unit_bytes() + (g & 1) * 8 : lay.zero_at());
    xb_stride = live ? 8 * lay.unit_bytes() : 0;
    ones = live ? 0x01010101u : 0u;
    steps = reinterpret_cast<const float*>(smem + lay.steps_at()) + 2 * c;
    sums = smem + lay.sums_at() + q * 16;
  }
};

struct K4One {
  static constexpr uint32_t kBlockBytes = 144;
  using Lane = LaneOne;
  // Word q of rows g and g + 8's heads (as K4Reader's) and chunk 3 - q of each, 8 bytes a column octet.
  struct Regs {
    uint32_t head[2];
    uint2 qs[2][4];
  };
  __device__ static void load_head(const uint8_t* blk, uint32_t r, uint32_t q, Regs& w) {
    w.head[r] = *reinterpret_cast<const uint32_t*>(blk + 4 * q);
  }
  __device__ static void load_octet(const uint8_t* blk, uint32_t r, uint32_t q, int m, Regs& w) {
    w.qs[r][m] = *reinterpret_cast<const uint2*>(blk + 16 + 32 * (3 - q) + 8 * m);
  }
  __device__ static void load(const uint8_t* blk, uint32_t r, uint32_t q, Regs& w) {
    load_head(blk, r, q, w);
#pragma unroll
    for (int m = 0; m < 4; ++m) load_octet(blk, r, q, m, w);
  }
  __device__ static void product_reload(Regs& w, uint32_t sb, const LaneOne& c, uint32_t q,
                                        const uint8_t* const (&next)[2], float (&acc)[4]) {
    uint4 head[2];
    const uint32_t quad = (threadIdx.x & 31) & ~3u;
#pragma unroll
    for (uint32_t r = 0; r < 2; ++r) {
      head[r] = make_uint4(__shfl_sync(0xffffffffu, w.head[r], quad), __shfl_sync(0xffffffffu, w.head[r], quad + 1),
                           __shfl_sync(0xffffffffu, w.head[r], quad + 2), __shfl_sync(0xffffffffu, w.head[r], quad + 3));
    }
    const K4Scales k(head);
#pragma unroll
    for (uint32_t r = 0; r < 2; ++r) load_head(next[r], r, q, w);
    const unsigned char* xb = c.xb + sb * c.xb_stride;
    const mma::FragB ones = {{c.ones, c.ones}};
    mma::FragC cs[2], cq[2];  // per nibble half s: the x sums (hi, lo columns), the weights' sums
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const uint2 v0 = w.qs[0][m], v1 = w.qs[1][m];
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        const uint32_t mask = s ? 0xf0f0f0f0u : 0x0f0f0f0fu;
        const mma::FragA A = {{v0.x & mask, v1.x & mask, v0.y & mask, v1.y & mask}};
        const uint2 b = *reinterpret_cast<const uint2*>(xb + s * 80 + m * 16);
        const mma::FragB B = {{b.x, b.y}};
        if (m == 0) {
          mma::mma_k32_zero_c<false, true>(cs[s], A, B);
          mma::mma_k32_zero_c<false, true>(cq[s], A, ones);
        } else {
          mma::mma_k32<false, true>(cs[s], A, B, cs[s]);
          mma::mma_k32<false, true>(cq[s], A, ones, cq[s]);
        }
      }
#pragma unroll
      for (uint32_t r = 0; r < 2; ++r) load_octet(next[r], r, q, m, w);
    }
    // Sub-blocks 2c + s of rows g (r = 0) and g + 8: their scales, the f32 terms in K4Reader's order.
    const uint32_t cc = 3 - q;
    const float2 xs = *reinterpret_cast<const float2*>(c.steps + 8 * sb);
    float sd[2];
#pragma unroll
    for (uint32_t r = 0; r < 2; ++r) {
      const uint32_t word = cc >> 1 ? k.sc[r][1] : k.sc[r][0];
      float f[2];
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        int sum = cs[s].r[2 * r] * 256 + cs[s].r[2 * r + 1] + cq[s].r[2 * r] * 128;
        if (s) sum >>= 4;
        const int scale = static_cast<int>((word >> (8 * (2 * (cc & 1) + s))) & 0xff);
        f[s] = static_cast<float>(sum * scale);
      }
      float t = 0.0f;
#pragma unroll
      for (int hop = 0; hop < 4; ++hop) {
        if (hop > 0) t = __shfl_down_sync(0xffffffffu, t, 1, 4);
        t = __fmaf_rn(f[0], xs.x, t);
        t = __fmaf_rn(f[1], xs.y, t);
      }
      sd[r] = t;
    }
    const uint32_t am[4] = {__float_as_uint(qd::byte_f(k.mn[0][0], q)), __float_as_uint(qd::byte_f(k.mn[1][0], q)),
                            __float_as_uint(qd::byte_f(k.mn[0][1], q)), __float_as_uint(qd::byte_f(k.mn[1][1], q))};
    const uint4 bm = *reinterpret_cast<const uint4*>(c.sums + sb * 64);
    float sm[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    mma_tf32(sm, am, bm, false);
    mma_tf32(sm, am, bm, true);
#pragma unroll
    for (uint32_t r = 0; r < 2; ++r) acc[2 * r] += k.d[r] * sd[r] - k.dmin[r] * sm[2 * r];
  }
};

}  // namespace ferry::gpu::matvec_mma_detail
