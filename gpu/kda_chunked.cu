// KDA's recurrence of long prefill segments in the chunked form (gpu/kda_chunked.hpp says what and
// why).
//
// chunk_prep_kernel: a block a (head, chunk, segment), 256 threads, two blocks an SM. All threads load
// the chunk's k, q and f transposed into shared memory (loads only, so none waits on a store); threads
// 0-127 then take a channel c: the decays, G, e^{G} q (written over q), e^{G_last} k e^{-G} (over k)
// and e^{G_last}. Then each thread a 4 x 4 tile of (t, s) pairs: the lower tiles (136) sum N and M
// over the 128 channels (read as float4s), the upper ones (120) write their zeros. Last, each thread
// forms one column of a right-hand side in registers (threads 0-127 W's, beta e^{G} k; 128-255 U's,
// beta v) and solves it by forward substitution over N in shared memory (unrolled). W goes to
// qkv_raw's first C columns, M to the next (64 of each head's 128), e^{G_last} to the last C of the
// chunk's first row, U over v.
//
// chunk_scan_kernel: a block a (16 state columns, head, segment), 4 warps (four blocks an SM: the 512
// blocks of 64 heads in one wave), the state's 128 x 16 slice in f32 accumulators (warp w rows
// 32w..32w+31), and as fp16 hi/lo halves transposed in shared memory (the products' B operand). Per chunk: delta = U - W S (warp w tokens 16w..16w+15), its halves to
// shared memory; o = (e^G q) S + M delta; S = e^{G_last} S + Kr^T delta. A operands come from global
// memory as float2 pairs (each element feeds one warp), split in registers.
#include <cuda_fp16.h>

#include <algorithm>

#include "gpu/cuda_check.hpp"
#include "gpu/half_split.cuh"
#include "gpu/kda_chunked.hpp"
#include "gpu/mma_f16.cuh"
#include "gpu/pdl.hpp"

namespace ferry::gpu {
namespace {

constexpr uint32_t kChunk = 64;             // tokens a chunk
constexpr uint32_t kDK = 128;               // head dim (k and v)
constexpr uint32_t kPrepThreads = 256;      // kDK channels + kDK columns of v
constexpr uint32_t kTLd = kChunk + 4;       // floats a row of the transposed k, q and G (16-byte rows)
constexpr size_t kPrepSmem = 3 * size_t{kDK} * kTLd * sizeof(float);
constexpr uint32_t kCols = 16;              // state columns a scan block: two n8 tiles
constexpr uint32_t kScanThreads = 128;      // 4 warps: 4 m16 tiles of tokens, 8 of state rows
static_assert(kPrepThreads == 2 * kDK && kChunk % 16 == 0 && (kChunk / 4) * (kChunk / 4) == kPrepThreads,
              "a prep thread per channel and column, and per 4 x 4 tile of (t, s)");

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
constexpr uint32_t kSLd = kDK / 2 + 4;      // 32-bit words a row of S^T's halves (banks 4g + q)
constexpr uint32_t kDLd = kChunk / 2 + 4;   // words a row of delta^T's halves
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ bool chunked_segment(const KdaArgs& a, uint32_t s) {
  return static_cast<uint32_t>(a.seg.len[s]) >= kKdaChunkedMinRows;
}

// 2^x for x <= 0 (ex2.approx, relative error ~2^-22; results below 2^-126 flush to 0, far below what
// the sums keep).
__device__ __forceinline__ float exp2_nonpositive(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Lower-triangular tile index i (row-major over ti >= si) as (ti, si).
__device__ __forceinline__ void lower_tile(uint32_t i, uint32_t& ti, uint32_t& si) {
  ti = 0;
  while ((ti + 1) * (ti + 2) / 2 <= i) ++ti;
  si = i - ti * (ti + 1) / 2;
}

// An A fragment's pair (row, col), (row, col + 1) of a row-major f32 matrix as fp16 hi / lo words;
// rows at or past `rows` are zero.
__device__ __forceinline__ void pair_rowmajor(const float* m, size_t ld, uint32_t row, uint32_t col, uint32_t rows,
                                              uint32_t& hi, uint32_t& lo) {
  float2 v = make_float2(0.0f, 0.0f);
  if (row < rows) v = *reinterpret_cast<const float2*>(m + row * ld + col);
  mma::split_pair(v.x, v.y, hi, lo);
}

// The A fragment (rows m0.., k k0..) of a row-major matrix, rows past `rows` zero.
__device__ __forceinline__ void frag_a(const float* m, size_t ld, uint32_t m0, uint32_t k0, uint32_t rows,
                                       uint32_t lane, uint32_t (&hi)[4], uint32_t (&lo)[4]) {
  const uint32_t g = lane / 4, c = k0 + 2 * (lane % 4);
  pair_rowmajor(m, ld, m0 + g, c, rows, hi[0], lo[0]);
  pair_rowmajor(m, ld, m0 + g + 8, c, rows, hi[1], lo[1]);
  pair_rowmajor(m, ld, m0 + g, c + 8, rows, hi[2], lo[2]);
  pair_rowmajor(m, ld, m0 + g + 8, c + 8, rows, hi[3], lo[3]);
}

// The A fragment (rows m0.., k k0..) of the transpose of `m` (row-major [k][m], rows of k past `ks`
// zero): A[i][kk] = m[kk][i].
__device__ __forceinline__ void frag_a_trans(const float* m, size_t ld, uint32_t m0, uint32_t k0, uint32_t ks,
                                             uint32_t lane, uint32_t (&hi)[4], uint32_t (&lo)[4]) {
  const uint32_t g = lane / 4, kk = k0 + 2 * (lane % 4);
  auto at = [&](uint32_t k, uint32_t i) { return k < ks ? m[k * ld + i] : 0.0f; };
  mma::split_pair(at(kk, m0 + g), at(kk + 1, m0 + g), hi[0], lo[0]);
  mma::split_pair(at(kk, m0 + g + 8), at(kk + 1, m0 + g + 8), hi[1], lo[1]);
  mma::split_pair(at(kk + 8, m0 + g), at(kk + 9, m0 + g), hi[2], lo[2]);
  mma::split_pair(at(kk + 8, m0 + g + 8), at(kk + 9, m0 + g + 8), hi[3], lo[3]);
}

// c (hi hi) and x (hi lo + lo hi, 2^12 too large) += A * B, B's words for column n0 + g at k k0 from
// a transposed halves matrix of `ld` words a row.
__device__ __forceinline__ void mma3(float (&c)[4], float (&x)[4], const uint32_t (&ah)[4], const uint32_t (&al)[4],
                                     const uint32_t* bhi, const uint32_t* blo, uint32_t ld, uint32_t n0, uint32_t k0,
                                     uint32_t lane) {
  const uint32_t at = (n0 + lane / 4) * ld + k0 / 2 + lane % 4;
  const uint32_t bh0 = bhi[at], bh1 = bhi[at + 4], bl0 = blo[at], bl1 = blo[at + 4];
  mma::mma_f16(c, ah, bh0, bh1);
  mma::mma_f16(x, ah, bl0, bl1);
  mma::mma_f16(x, al, bh0, bh1);
}

__device__ __forceinline__ float sum3(float c, float x) { return c + x * (1.0f / kHalfLoScale); }

// Element (row, col) of a transposed halves matrix ([col][row], `ld` words a row).
__device__ __forceinline__ void put_split(uint32_t* hi, uint32_t* lo, uint32_t ld, uint32_t row, uint32_t col,
                                          float v) {
  split_half(v, reinterpret_cast<__half*>(hi)[col * 2 * ld + row], reinterpret_cast<__half*>(lo)[col * 2 * ld + row]);
}
#endif

__global__ void __launch_bounds__(kPrepThreads, 2) chunk_prep_kernel(KdaArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ __align__(16) float smem[];
  float* kT = smem;            // [c][t]
  float* qT = kT + kDK * kTLd;
  float* gT = qT + kDK * kTLd;  // f, then G log2(e)
  float* nm = qT;               // N [t][s], once the tiles have read qT
  __shared__ float sbeta[kChunk];
  const uint32_t h = blockIdx.x, c0 = blockIdx.y * kChunk, s = blockIdx.z, tid = threadIdx.x;
  if (!chunked_segment(a, s)) return;
  const uint32_t seg_len = static_cast<uint32_t>(a.seg.len[s]);
  if (c0 >= seg_len) return;
  const uint32_t L = min(kChunk, seg_len - c0);
  const size_t C = size_t{a.heads} * kDK, C3 = 3 * C;
  const size_t r0 = static_cast<size_t>(a.seg.first_row[s]) + c0;
  float* qkv = a.qkv + r0 * C3 + h * kDK;      // row t at t C3: q, then k at C, v at 2C
  float* raw = a.qkv_raw + r0 * C3 + h * kDK;  // W, then M at C, e^{G_last} at 2C (row 0)
  if (tid < kChunk) sbeta[tid] = tid < L ? 1.0f / (1.0f + expf(-a.beta[(r0 + tid) * a.heads + h])) : 0.0f;
  // k, q and f of the chunk, transposed, by every thread (loads only: none waits on a store); zeros
  // past L.
  {
    const uint32_t c = tid % kDK;
#pragma unroll 8
    for (uint32_t t = tid / kDK; t < kChunk; t += kPrepThreads / kDK) {
      const bool in = t < L;
      kT[c * kTLd + t] = in ? qkv[t * C3 + C + c] : 0.0f;
      qT[c * kTLd + t] = in ? qkv[t * C3 + c] : 0.0f;
      gT[c * kTLd + t] = in ? a.f[(r0 + t) * C + h * kDK + c] : 0.0f;
    }
  }
  __syncthreads();
  if (tid < kDK) {  // channel c: G, e^{G} q over q, e^{G_last - G} k over k, e^{G_last}
    const uint32_t c = tid;
    const float rate = -a.a[h], dt_bias = a.dt_bias[h * kDK + c];
    float G = 0.0f;
    for (uint32_t t = 0; t < kChunk; ++t) {
      if (t < L) {
        G += a.lower_bound / (1.0f + expf(-rate * (gT[c * kTLd + t] + dt_bias)));
        qkv[t * C3 + c] = expf(G) * qT[c * kTLd + t];
      }
      gT[c * kTLd + t] = G * kLog2e;  // past L: G_last, with k = q = 0
    }
    const float g_last = G * kLog2e;
    for (uint32_t t = 0; t < L; ++t) qkv[t * C3 + C + c] = exp2f(g_last - gT[c * kTLd + t]) * kT[c * kTLd + t];
    raw[2 * C + c] = exp2f(g_last);
  }
  __syncthreads();

  uint32_t ti, si;
  const bool lower = tid < kPrepThreads / 2 + kChunk / 8;  // 136 lower tiles of 16 x 16
  if (lower) {
    lower_tile(tid, ti, si);
  } else {
    lower_tile(tid - (kPrepThreads / 2 + kChunk / 8), si, ti);  // the 120 upper ones: (si - 1, ti) of 15 x 15
    ++si;
  }
  float n[4][4] = {}, m[4][4] = {};
  if (lower) {
    for (uint32_t c = 0; c < kDK; ++c) {
      const float4 kt = *reinterpret_cast<const float4*>(kT + c * kTLd + 4 * ti);
      const float4 qt = *reinterpret_cast<const float4*>(qT + c * kTLd + 4 * ti);
      const float4 gt = *reinterpret_cast<const float4*>(gT + c * kTLd + 4 * ti);
      const float4 ks = *reinterpret_cast<const float4*>(kT + c * kTLd + 4 * si);
      const float4 gs = *reinterpret_cast<const float4*>(gT + c * kTLd + 4 * si);
      const float kt_[4] = {kt.x, kt.y, kt.z, kt.w}, qt_[4] = {qt.x, qt.y, qt.z, qt.w};
      const float gt_[4] = {gt.x, gt.y, gt.z, gt.w}, ks_[4] = {ks.x, ks.y, ks.z, ks.w};
      const float gs_[4] = {gs.x, gs.y, gs.z, gs.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          // s > t only on diagonal tiles, discarded below; the clamp keeps them finite.
          const float ke = exp2_nonpositive(fminf(gt_[i] - gs_[j], 0.0f)) * ks_[j];
          n[i][j] += kt_[i] * ke;
          m[i][j] += qt_[i] * ke;
        }
      }
    }
  }
  __syncthreads();  // every tile has read qT: N goes over it
#pragma unroll
  for (uint32_t i = 0; i < 4; ++i) {
    const uint32_t t = 4 * ti + i;
#pragma unroll
    for (uint32_t j = 0; j < 4; ++j) {
      const uint32_t u = 4 * si + j;
      nm[t * kChunk + u] = lower && u < t && t < L ? sbeta[t] * n[i][j] : 0.0f;
      if (t < L) raw[t * C3 + C + u] = lower && u <= t ? m[i][j] : 0.0f;
    }
  }
  __syncthreads();
  // This thread's column of W's right-hand side beta e^{G} k (channel tid) or U's beta v (column tid
  // - 128), formed only now so that the tiles above hold no column in registers; then its forward
  // substitution, the sum over earlier rows in four partial sums.
  float x[kChunk];
  if (tid < kDK) {
#pragma unroll
    for (uint32_t t = 0; t < kChunk; ++t) x[t] = sbeta[t] * exp2f(gT[tid * kTLd + t]) * kT[tid * kTLd + t];
  } else {
#pragma unroll
    for (uint32_t t = 0; t < kChunk; ++t) x[t] = t < L ? sbeta[t] * qkv[t * C3 + 2 * C + (tid - kDK)] : 0.0f;
  }
#pragma unroll
  for (uint32_t t = 1; t < kChunk; ++t) {
    const float* row = nm + t * kChunk;
    float p[4] = {};
#pragma unroll
    for (uint32_t u = 0; u < t; u += 4) {  // N is zero from column t on
      const float4 n4 = *reinterpret_cast<const float4*>(row + u);
      p[0] += n4.x * x[u];
      p[1] += n4.y * x[u + 1];
      p[2] += n4.z * x[u + 2];
      p[3] += n4.w * x[u + 3];
    }
    x[t] -= (p[0] + p[1]) + (p[2] + p[3]);
  }
  float* dst = tid < kDK ? raw + tid : qkv + 2 * C + (tid - kDK);
#pragma unroll
  for (uint32_t t = 0; t < kChunk; ++t) {
    if (t < L) dst[t * C3] = x[t];
  }
#else
  (void)a;
  __trap();  // hosts launch this kernel only on sm80+ code (kda_chunked)
#endif
}

__global__ void __launch_bounds__(kScanThreads, 4) chunk_scan_kernel(KdaArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  __shared__ uint32_t s_hi[kCols * kSLd], s_lo[kCols * kSLd];  // S^T [j][c] as halves
  __shared__ uint32_t d_hi[kCols * kDLd], d_lo[kCols * kDLd];  // delta^T [j][t]
  const uint32_t j0 = blockIdx.x * kCols, h = blockIdx.y, s = blockIdx.z;
  if (!chunked_segment(a, s)) return;
  const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const uint32_t len = static_cast<uint32_t>(a.seg.len[s]);
  const size_t C = size_t{a.heads} * kDK, C3 = 3 * C;
  const size_t first = static_cast<size_t>(a.seg.first_row[s]);
  float* state = a.state + (static_cast<size_t>(a.seg.slot[s]) * a.heads + h) * kDK * kDK + j0;
  // st[mt][nt][i]: row 32 warp + 16 mt + g (+ 8 for i >= 2), column 8 nt + 2 q (+ 1 for odd i).
  float st[2][2][4];
  auto row_of = [&](uint32_t mt, uint32_t i) { return 32 * warp + 16 * mt + g + (i >= 2 ? 8 : 0); };
  auto col_of = [&](uint32_t nt, uint32_t i) { return 8 * nt + 2 * q + (i & 1); };
#pragma unroll
  for (uint32_t mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (uint32_t nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (uint32_t i = 0; i < 4; ++i) st[mt][nt][i] = state[row_of(mt, i) * kDK + col_of(nt, i)];
    }
  }
  auto put_state = [&]() {
#pragma unroll
    for (uint32_t mt = 0; mt < 2; ++mt) {
#pragma unroll
      for (uint32_t nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (uint32_t i = 0; i < 4; ++i) put_split(s_hi, s_lo, kSLd, row_of(mt, i), col_of(nt, i), st[mt][nt][i]);
      }
    }
  };
  put_state();
  __syncthreads();
  const uint32_t m0 = 16 * warp;  // the warp's tokens in the first two products
  for (uint32_t t0 = 0; t0 < len; t0 += kChunk) {
    const uint32_t L = min(kChunk, len - t0);
    const float* qa = a.qkv + (first + t0) * C3 + h * kDK;  // e^{G} q; Kr at + C, U at + 2C
    const float* kr = qa + C;
    const float* u = qa + 2 * C + j0;
    const float* w = a.qkv_raw + (first + t0) * C3 + h * kDK;  // W; M at + C, e^{G_last} at + 2C
    const float* mm = w + C;
    const float* g_last = w + 2 * C;
    uint32_t ah[4], al[4];

    // delta = U - W S
    float c1[2][4] = {}, x1[2][4] = {};
#pragma unroll
    for (uint32_t k0 = 0; k0 < kDK; k0 += 16) {
      frag_a(w, C3, m0, k0, L, lane, ah, al);
#pragma unroll
      for (uint32_t nt = 0; nt < 2; ++nt) mma3(c1[nt], x1[nt], ah, al, s_hi, s_lo, kSLd, 8 * nt, k0, lane);
    }
#pragma unroll
    for (uint32_t nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (uint32_t i = 0; i < 4; ++i) {
        const uint32_t t = m0 + g + (i >= 2 ? 8 : 0), j = col_of(nt, i);
        const float uv = t < L ? u[t * C3 + j] : 0.0f;
        put_split(d_hi, d_lo, kDLd, t, j, uv - sum3(c1[nt][i], x1[nt][i]));
      }
    }
    __syncthreads();

    // o = (e^{G} q) S + M delta
    float c2[2][4] = {}, x2[2][4] = {};
#pragma unroll
    for (uint32_t k0 = 0; k0 < kDK; k0 += 16) {
      frag_a(qa, C3, m0, k0, L, lane, ah, al);
#pragma unroll
      for (uint32_t nt = 0; nt < 2; ++nt) mma3(c2[nt], x2[nt], ah, al, s_hi, s_lo, kSLd, 8 * nt, k0, lane);
    }
#pragma unroll
    for (uint32_t k0 = 0; k0 < kChunk; k0 += 16) {
      frag_a(mm, C3, m0, k0, L, lane, ah, al);
#pragma unroll
      for (uint32_t nt = 0; nt < 2; ++nt) mma3(c2[nt], x2[nt], ah, al, d_hi, d_lo, kDLd, 8 * nt, k0, lane);
    }
#pragma unroll
    for (uint32_t nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (uint32_t i = 0; i < 4; ++i) {
        const uint32_t t = m0 + g + (i >= 2 ? 8 : 0);
        if (t < L) a.out[(first + t0 + t) * C + h * kDK + j0 + col_of(nt, i)] = sum3(c2[nt][i], x2[nt][i]);
      }
    }

    // S = e^{G_last} S + Kr^T delta, the warp's rows
#pragma unroll
    for (uint32_t mt = 0; mt < 2; ++mt) {
      float c3[2][4] = {}, x3[2][4] = {};
      const uint32_t r0 = 32 * warp + 16 * mt;
#pragma unroll
      for (uint32_t k0 = 0; k0 < kChunk; k0 += 16) {
        frag_a_trans(kr, C3, r0, k0, L, lane, ah, al);
#pragma unroll
        for (uint32_t nt = 0; nt < 2; ++nt) mma3(c3[nt], x3[nt], ah, al, d_hi, d_lo, kDLd, 8 * nt, k0, lane);
      }
      const float e0 = g_last[r0 + g], e1 = g_last[r0 + g + 8];
#pragma unroll
      for (uint32_t nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (uint32_t i = 0; i < 4; ++i) {
          st[mt][nt][i] = (i >= 2 ? e1 : e0) * st[mt][nt][i] + sum3(c3[nt][i], x3[nt][i]);
        }
      }
    }
    __syncthreads();  // every warp has read this chunk's S and delta halves
    put_state();
    __syncthreads();
  }
#pragma unroll
  for (uint32_t mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (uint32_t nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (uint32_t i = 0; i < 4; ++i) state[row_of(mt, i) * kDK + col_of(nt, i)] = st[mt][nt][i];
    }
  }
#else
  (void)a;
  __trap();  // hosts launch this kernel only on sm80+ code (kda_chunked)
#endif
}

}  // namespace

bool kda_chunked(const KdaArgs& a, uint32_t max_seg_rows, cudaStream_t stream) {
  if (a.segments == 0 || max_seg_rows < kKdaChunkedMinRows || a.head_dim != kDK || a.qkv_raw == nullptr) return false;
  if (!code_built_for(reinterpret_cast<const void*>(chunk_prep_kernel), 8) ||
      !code_built_for(reinterpret_cast<const void*>(chunk_scan_kernel), 8)) {
    return false;
  }
  FERRY_CUDA(cudaFuncSetAttribute(chunk_prep_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(kPrepSmem)));
  const uint32_t chunks = (max_seg_rows + kChunk - 1) / kChunk;
  chunk_prep_kernel<<<dim3(a.heads, chunks, a.segments), kPrepThreads, kPrepSmem, stream>>>(a);
  FERRY_CUDA_LAUNCHED();
  // A head's column blocks next to each other: they read the same chunk's W, q, k and M from L2.
  chunk_scan_kernel<<<dim3(kDK / kCols, a.heads, a.segments), kScanThreads, 0, stream>>>(a);
  FERRY_CUDA_LAUNCHED();
  return true;
}

}  // namespace ferry::gpu
