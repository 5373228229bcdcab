// KDA (Kimi delta attention) on the device: the short causal convolution with its per-slot state,
// the q/k L2 norms, the gated delta-rule recurrence and the gated RMSNorm of its output.
//
// The recurrence runs token by token for decode and short prefill segments (a head's 128x128 state in
// the registers of 4 blocks of 128 threads, recurrent_kernel says how): it is the exact recurrent form,
// so those prefill rows and decode agree to the bit, and a 2048-token chunk costs ~260K multiply-adds
// per thread. Long prefill segments take the chunked form first (gpu/kda_chunked.hpp); this kernel
// then leaves them (KdaArgs::skip_chunked).
#include <cooperative_groups.h>

#include <algorithm>

#include "gpu/block_reduce.cuh"
#include "gpu/cuda_check.hpp"
#include "gpu/half_split.cuh"
#include "gpu/kda_chunked.hpp"
#include "gpu/kda_fusion.hpp"
#include "gpu/kernels.hpp"
#include "gpu/pdl.cuh"
#include "gpu/pdl.hpp"

namespace ferry::gpu {
namespace {

constexpr int kMaxConv = 8;

// The short convolution of channel c at row r, then SiLU: the row's earlier inputs from this step's
// rows of its segment, or from the slot's state before the segment's first row.
__device__ __forceinline__ float conv_silu(const KdaArgs& a, uint32_t r, uint32_t c, uint32_t C3, uint32_t K) {
  const int pos = a.row.pos[r];
  const int start = a.row.pos[a.row.seg_first_row[r]];
  const size_t slot = static_cast<size_t>(a.row.slot[r]);
  const float* w = a.conv_w + static_cast<size_t>(c) * K;
  const float* st = a.conv_state + (slot * C3 + c) * (K - 1);
  float acc = 0.0f;
  for (uint32_t j = 0; j < K; ++j) {
    const int p = pos - static_cast<int>(K - 1) + static_cast<int>(j);
    const float in = p >= start ? a.qkv_raw[(static_cast<size_t>(r) - (pos - p)) * C3 + c]
                                : st[static_cast<int>(K - 1) - (start - p)];
    acc += w[j] * in;
  }
  return acc / (1.0f + expf(-acc));
}

// Segment s's conv state of channel c after its rows: the last K - 1 inputs, from this step's rows or
// the state before them.
__device__ __forceinline__ void conv_state_update(const KdaArgs& a, uint32_t s, uint32_t c, uint32_t C3, uint32_t K) {
  const int start = a.seg.start[s], end = start + a.seg.len[s];
  const size_t first = static_cast<size_t>(a.seg.first_row[s]);
  float* st = a.conv_state + (static_cast<size_t>(a.seg.slot[s]) * C3 + c) * (K - 1);
  float next[kMaxConv];
  for (uint32_t j = 0; j + 1 < K; ++j) {
    const int p = end - static_cast<int>(K - 1) + static_cast<int>(j);
    next[j] = p >= start ? a.qkv_raw[(first + (p - start)) * C3 + c] : st[static_cast<int>(K - 1) - (start - p)];
  }
  for (uint32_t j = 0; j + 1 < K; ++j) st[j] = next[j];
}

// One warp's head of q or k in place: x / sqrt(sum x^2 + 1e-6), and q times head_dim^-0.5.
__device__ __forceinline__ void qk_norm_head(float* x, uint32_t lane, uint32_t head_dim, bool is_q) {
  float ss = 0.0f;
  for (uint32_t i = lane; i < head_dim; i += 32) ss += x[i] * x[i];
  ss = warp_sum(ss);
  float scale = 1.0f / sqrtf(ss + 1e-6f);
  const float qs = rsqrtf(static_cast<float>(head_dim));
  for (uint32_t i = lane; i < head_dim; i += 32) x[i] = is_q ? (x[i] * scale) * qs : x[i] * scale;
}

// Prefill rows: a warp per (group of kConvRowsPerWarp rows, head of q, k or v); each lane takes channels
// lane, lane + 32, ... of the head. Every raw row a group's taps read (its rows and the K - 1 before them) is
// loaded into registers before any arithmetic, each once (where each row's tap loads came in its turn, K
// loads a value behind the stores of the rows before, ~4x the bandwidth bound), the conv weights once a
// group; the rows' positions come from one load a lane, shared by shuffles. Then per row conv_silu's sum
// over the same values in the same order (the slot's state where a tap lies before the segment), the
// SiLU, for q and k the head's L2 norm, and one store: conv_decode_kernel's bits.
constexpr uint32_t kConvRowsPerWarp = 8, kConvLaneChannels = 4;  // head dims up to 128

// Up to 4 taps, 6 blocks of 128 threads an SM (80 registers, 72 bytes of spills) where 96 registers allow 5: the
// issue slots limit the kernel (ncu), so more warps hide more (gpu/PERF.md, h94); more taps keep their registers.
template <uint32_t K>
__global__ void __launch_bounds__(128, K <= 4 ? 6 : 1) conv_rows_kernel(KdaArgs a) {
  constexpr uint32_t kTaps = kConvRowsPerWarp + K - 1, R = kConvRowsPerWarp, L = kConvLaneChannels;
  const uint32_t lane = threadIdx.x & 31;
  const uint32_t item = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const uint32_t C3 = 3 * a.heads * a.head_dim;
  const uint32_t groups = (a.rows + R - 1) / R;
  if (item >= groups * 3 * a.heads) return;
  const uint32_t hk = item % (3 * a.heads);  // q heads, k heads, v heads
  const uint32_t r0 = item / (3 * a.heads) * R;
  const uint32_t rn = min(a.rows - r0, R);
  const bool is_q = hk < a.heads, is_qk = hk < 2 * a.heads;
  const uint32_t c0 = hk * a.head_dim;
  int my_pos = 0, my_start = 0;
  if (lane < rn) {
    my_pos = a.row.pos[r0 + lane];
    my_start = a.row.pos[a.row.seg_first_row[r0 + lane]];
  }
  float w[L][K], raw[kTaps][L];
#pragma unroll
  for (uint32_t k = 0; k < L; ++k) {
    const uint32_t e = lane + 32 * k;
#pragma unroll
    for (uint32_t j = 0; j < K; ++j) w[k][j] = e < a.head_dim ? __ldg(a.conv_w + (c0 + e) * K + j) : 0.0f;
  }
  // raw[t] is row r0 - (K - 1) + t: row r's tap j is raw[r - r0 + j].
#pragma unroll
  for (uint32_t t = 0; t < kTaps; ++t) {
    const int rr = static_cast<int>(r0 + t) - static_cast<int>(K - 1);
    const bool have = rr >= 0 && t < rn + K - 1;
    const float* src = a.qkv_raw + static_cast<size_t>(have ? rr : 0) * C3 + c0;
#pragma unroll
    for (uint32_t k = 0; k < L; ++k) {
      const uint32_t e = lane + 32 * k;
      raw[t][k] = have && e < a.head_dim ? __ldg(src + e) : 0.0f;
    }
  }
#pragma unroll
  for (uint32_t i = 0; i < R; ++i) {
    if (i >= rn) break;
    const uint32_t r = r0 + i;
    const int pos = __shfl_sync(0xffffffffu, my_pos, i), start = __shfl_sync(0xffffffffu, my_start, i);
    float v[L];
    // The same for the whole warp: whether a tap of this row lies before its segment (in the slot's state).
    // Apart, the other rows' taps are not predicated state loads (which would be half of the issued work).
    if (pos - start >= static_cast<int>(K - 1)) {
#pragma unroll
      for (uint32_t k = 0; k < L; ++k) {
        float acc = 0.0f;
#pragma unroll
        for (uint32_t j = 0; j < K; ++j) acc += w[k][j] * raw[i + j][k];
        v[k] = acc / (1.0f + expf(-acc));
      }
    } else {
#pragma unroll
      for (uint32_t k = 0; k < L; ++k) {
        const uint32_t c = c0 + lane + 32 * k;
        float acc = 0.0f;
#pragma unroll
        for (uint32_t j = 0; j < K; ++j) {
          const int p = pos - static_cast<int>(K - 1) + static_cast<int>(j);
          float in = raw[i + j][k];
          if (p < start && lane + 32 * k < a.head_dim) {
            const float* st = a.conv_state + (static_cast<size_t>(a.row.slot[r]) * C3 + c) * (K - 1);
            in = st[static_cast<int>(K - 1) - (start - p)];
          }
          acc += w[k][j] * in;
        }
        v[k] = acc / (1.0f + expf(-acc));
      }
    }
    float* out = a.qkv + static_cast<size_t>(r) * C3 + c0;
    if (is_qk) {
      float ss = 0.0f;
#pragma unroll
      for (uint32_t k = 0; k < L; ++k) {
        if (lane + 32 * k < a.head_dim) ss += v[k] * v[k];
      }
      ss = warp_sum(ss);
      const float scale = 1.0f / sqrtf(ss + 1e-6f);
      const float qs = rsqrtf(static_cast<float>(a.head_dim));
#pragma unroll
      for (uint32_t k = 0; k < L; ++k) v[k] = is_q ? (v[k] * scale) * qs : v[k] * scale;
    }
#pragma unroll
    for (uint32_t k = 0; k < L; ++k) {
      if (lane + 32 * k < a.head_dim) out[lane + 32 * k] = v[k];
    }
  }
}

__global__ void conv_state_kernel(KdaArgs a) {
  const uint32_t C3 = 3 * a.heads * a.head_dim;
  const uint32_t K = a.kernel;
  const size_t total = static_cast<size_t>(a.segments) * C3;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint32_t s = static_cast<uint32_t>(i / C3), c = static_cast<uint32_t>(i % C3);
    conv_state_update(a, s, c, C3, K);
  }
}

// Decode rows (kda_conv): conv_rows_kernel and conv_state_kernel as one launch, one warp a (segment,
// head of q, k or v) over its segment's rows, the state replaced after the segment's rows read it:
// the same operations on the same values in the same order, so the two launches' bits.
__global__ void conv_decode_kernel(KdaArgs a) {
  pdl_launch_dependents();  // the next matvec may request its weights now (gpu/pdl.hpp)
  pdl_wait();               // q, k and v are the product's ahead
  const uint32_t lane = threadIdx.x & 31;
  const size_t item = (blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x) >> 5;
  const uint32_t C = a.heads * a.head_dim, C3 = 3 * C;
  const uint32_t K = a.kernel;
  if (item >= static_cast<size_t>(a.segments) * 3 * a.heads) return;
  const uint32_t s = static_cast<uint32_t>(item / (3 * a.heads));
  const uint32_t hk = static_cast<uint32_t>(item % (3 * a.heads));  // q heads, k heads, v heads
  const uint32_t first_row = static_cast<uint32_t>(a.seg.first_row[s]);
  for (uint32_t r = first_row; r < first_row + static_cast<uint32_t>(a.seg.len[s]); ++r) {
    for (uint32_t e = lane; e < a.head_dim; e += 32) {
      const uint32_t c = hk * a.head_dim + e;
      a.qkv[static_cast<size_t>(r) * C3 + c] = conv_silu(a, r, c, C3, K);
    }
    if (hk < 2 * a.heads) {
      qk_norm_head(a.qkv + static_cast<size_t>(r) * C3 + static_cast<size_t>(hk) * a.head_dim, lane, a.head_dim,
                   hk < a.heads);
    }
  }
  for (uint32_t e = lane; e < a.head_dim; e += 32) conv_state_update(a, s, hk * a.head_dim + e, C3, K);
}

// Column j of a head's state evolves on its own (decay by row, then the delta rule through k, v_j).
// A block owns a slice of CB columns of one head; each column's DK rows are split over P lanes of
// RP rows each, held in registers (P = 4 at DK = 128: a head spreads over 4 blocks of 128 threads,
// and each thread's two dot products are chains of 32, not 128), the P partial sums added by
// shuffles (the same sums in every lane, so all of them take the same delta). A block has DK
// threads, one per element of a token's k, q and decay, and loads the inputs of the tokens kAhead
// ahead while it multiplies the current one (a token's loop may be shorter than a load from HBM:
// a chunk's inputs do not stay in L2), and computes the next token's decay and beta before
// the barrier that ends the current one, so neither lies on the path from token to token. A lane
// reads its group's k, q and decay as float4s into registers (k once for both products): 3 * RP / 4
// shared loads a token, which would otherwise be as many as its multiply-adds.
template <int DK>
struct RecurrentShape {
  static constexpr int RP = DK < 32 ? DK : 32;  // state rows a thread holds
  static constexpr int P = DK / RP;             // lanes a column
  static constexpr int CB = DK / P;             // columns a block (blockDim.x = CB * P = DK)
  // A lane group's stride in shared memory: 4 banks apart (the P groups' float4 reads do not
  // conflict), and 16-byte aligned.
  static constexpr int LD = P > 1 ? RP + 4 : RP;
};

// N floats (a multiple of 4) from 16-byte aligned shared memory into registers.
template <int N>
__device__ __forceinline__ void load_row(const float* src, float* dst) {
#pragma unroll
  for (int i = 0; i < N / 4; ++i) {
    const float4 v = reinterpret_cast<const float4*>(src)[i];
    dst[4 * i] = v.x, dst[4 * i + 1] = v.y, dst[4 * i + 2] = v.z, dst[4 * i + 3] = v.w;
  }
}

constexpr uint32_t kAhead = 4;  // tokens of inputs a recurrence thread holds

// One token's inputs to a recurrence thread: element e of k, q and f, column j of v, the head's beta
// (thread 0 only), before any activation.
struct TokenInputs {
  float k = 0.0f, q = 0.0f, f = 0.0f, v = 0.0f, beta = 0.0f;
  __device__ __forceinline__ void load(const KdaArgs& a, size_t row, uint32_t he, uint32_t hj, uint32_t h,
                                       bool with_beta) {
    const size_t C = static_cast<size_t>(a.heads) * a.head_dim;
    const float* qkv = a.qkv + row * 3 * C;
    k = qkv[C + he];
    q = qkv[he];
    f = a.f[row * C + he];
    v = qkv[2 * C + hj];
    if (with_beta) beta = a.beta[row * a.heads + h];
  }
};

// The taps of the convolution that recurrent_norm_kernel<DK, true> runs (GLM's; other sizes take kda_conv).
constexpr uint32_t kFusedConvTaps = 4;

// A head's q, k (DK each) and a block's CB columns of v for each row of its segment, convolved in the
// block (recurrent_norm_kernel<DK, true>): [kMaxMatvecTokens][DK], [..][DK] and [..][CB]; and the conv state
// they leave, [2 * DK + CB][taps - 1] (q, k, then v), stored once no block reads the old one.
template <int DK>
struct ConvolvedRows {
  static constexpr int CB = RecurrentShape<DK>::CB;
  float q[kMaxMatvecTokens * DK], k[kMaxMatvecTokens * DK], v[kMaxMatvecTokens * CB];
  float next[(2 * DK + CB) * (kFusedConvTaps - 1)];
};

// One warp's share of conv_decode_kernel inside a head's cluster: `task` 0 / 1 / 2 is the head's q / k
// (DK channels) or the block's CB columns of v, lane + 32 i its channels, for every row of the segment.
// Its weights and state are asked for before the PDL wait (fixed), then every row's inputs at once
// (run): one memory round trip where conv_decode_kernel makes one a tap. The same sums in the same
// order as conv_silu, qk_norm_head and conv_state_update: their bits.
template <int DK>
struct ConvLane {
  static constexpr uint32_t L = DK / 32, K = kFusedConvTaps, CB = ConvolvedRows<DK>::CB;
  float w[L][K], st[L][K - 1];
  uint32_t task = 0, n = 0, c0 = 0;

  __device__ __forceinline__ void fixed(const KdaArgs& a, uint32_t t, size_t slot) {
    const uint32_t lane = threadIdx.x & 31, C = a.heads * DK, C3 = 3 * C;
    task = t;
    n = t < 2 ? DK : CB;
    c0 = t * C + blockIdx.x * DK + (t == 2 ? blockIdx.z * CB : 0);
#pragma unroll
    for (uint32_t i = 0; i < L; ++i) {
      const uint32_t e = lane + 32 * i, c = c0 + e;
      const bool ok = e < n;
#pragma unroll
      for (uint32_t j = 0; j < K; ++j) w[i][j] = ok ? a.conv_w[static_cast<size_t>(c) * K + j] : 0.0f;
#pragma unroll
      for (uint32_t j = 0; j + 1 < K; ++j) st[i][j] = ok ? a.conv_state[(slot * C3 + c) * (K - 1) + j] : 0.0f;
    }
  }

  // Rows first .. first + len - 1 (len <= kMaxMatvecTokens) into `rows` (and a.qkv where `store`).
  __device__ __forceinline__ void run(const KdaArgs& a, size_t first, uint32_t len, ConvolvedRows<DK>& rows,
                                      bool store) {
    const uint32_t lane = threadIdx.x & 31, C3 = 3 * a.heads * DK;
    float raw[kMaxMatvecTokens][L];
#pragma unroll
    for (uint32_t t = 0; t < kMaxMatvecTokens; ++t) {
#pragma unroll
      for (uint32_t i = 0; i < L; ++i) {
        const uint32_t e = lane + 32 * i;
        raw[t][i] = t < len && e < n ? a.qkv_raw[(first + t) * C3 + c0 + e] : 0.0f;
      }
    }
    float* out = task == 0 ? rows.q : task == 1 ? rows.k : rows.v;
#pragma unroll
    for (uint32_t t = 0; t < kMaxMatvecTokens; ++t) {
      if (t >= len) break;
      float v[L];
#pragma unroll
      for (uint32_t i = 0; i < L; ++i) {
        float acc = 0.0f;
#pragma unroll
        for (uint32_t j = 0; j < K; ++j) {
          const int p = static_cast<int>(t + j) - static_cast<int>(K - 1);  // the tap's row in the segment
          const float in = p >= 0 ? raw[p][i] : st[i][static_cast<int>(K - 1) + p];  // < 0: the state's
          acc += w[i][j] * in;
        }
        v[i] = acc / (1.0f + expf(-acc));
      }
      if (task < 2) {
        float ss = 0.0f;
#pragma unroll
        for (uint32_t i = 0; i < L; ++i) {
          if (lane + 32 * i < n) ss += v[i] * v[i];
        }
        ss = warp_sum(ss);
        const float scale = 1.0f / sqrtf(ss + 1e-6f);
        const float qs = rsqrtf(static_cast<float>(a.head_dim));
#pragma unroll
        for (uint32_t i = 0; i < L; ++i) v[i] = task == 0 ? (v[i] * scale) * qs : v[i] * scale;
      }
#pragma unroll
      for (uint32_t i = 0; i < L; ++i) {
        const uint32_t e = lane + 32 * i;
        if (e >= n) continue;
        out[t * n + e] = v[i];
        if (store) a.qkv[(first + t) * C3 + c0 + e] = v[i];
      }
    }
    // The state after the segment: its last K - 1 inputs, from these rows or the state before them.
    float* next = rows.next + (task * DK) * (K - 1);
#pragma unroll
    for (uint32_t i = 0; i < L; ++i) {
      const uint32_t e = lane + 32 * i;
      if (e >= n) continue;
#pragma unroll
      for (uint32_t j = 0; j + 1 < K; ++j) {
        const int p = static_cast<int>(len + j) - static_cast<int>(K - 1);  // as a tap's row above
        float x = 0.0f;
#pragma unroll
        for (uint32_t q = 0; q + 1 < K; ++q) {
          if (static_cast<int>(K - 1) + p == static_cast<int>(q)) x = st[i][q];
        }
#pragma unroll
        for (uint32_t t = 0; t < kMaxMatvecTokens; ++t) {
          if (p == static_cast<int>(t)) x = raw[t][i];
        }
        next[e * (K - 1) + j] = x;
      }
    }
  }
};

// conv_decode_kernel's work for one head of a segment inside the head's cluster (ConvLane): each block
// makes the head's q and k rows (the same values in every block: block 0 stores them in a.qkv) and its
// own CB columns of v. The weights and state of a warp's first share are asked before `wait` runs.
template <int DK, class Wait>
__device__ __forceinline__ void convolve_head(const KdaArgs& a, ConvolvedRows<DK>& rows, const Wait& wait) {
  constexpr uint32_t kWarps = DK / 32;
  const uint32_t s = blockIdx.y, warp = threadIdx.x >> 5;
  const size_t first = static_cast<size_t>(a.seg.first_row[s]), slot = static_cast<size_t>(a.seg.slot[s]);
  const uint32_t len = static_cast<uint32_t>(a.seg.len[s]);
  ConvLane<DK> mine;
  if (warp < 3) mine.fixed(a, warp, slot);
  wait();
  if (warp < 3) mine.run(a, first, len, rows, warp == 2 || blockIdx.z == 0);
  for (uint32_t task = warp + kWarps; task < 3; task += kWarps) {
    ConvLane<DK> more;
    more.fixed(a, task, slot);
    more.run(a, first, len, rows, task == 2 || blockIdx.z == 0);
  }
}

// The conv state convolve_head left in shared memory, stored: q and k by block 0, v by each block.
template <int DK>
__device__ __forceinline__ void conv_state_after(const KdaArgs& a, const ConvolvedRows<DK>& rows) {
  constexpr uint32_t CB = ConvolvedRows<DK>::CB, K = kFusedConvTaps;
  const uint32_t h = blockIdx.x, z = blockIdx.z, C = a.heads * DK, C3 = 3 * C;
  const size_t slot = static_cast<size_t>(a.seg.slot[blockIdx.y]);
  for (uint32_t i = threadIdx.x; i < (2 * DK + CB) * (K - 1); i += DK) {
    const uint32_t e = i / (K - 1), j = i % (K - 1);
    if (e < 2 * DK && z != 0) continue;
    const uint32_t c = e < DK ? h * DK + e : e < 2 * DK ? C + h * DK + (e - DK) : 2 * C + h * DK + z * CB + (e - 2 * DK);
    a.conv_state[(slot * C3 + c) * (K - 1) + j] = rows.next[i];
  }
}

// The recurrence of block (h, s, z)'s columns over its segment's rows (recurrent_kernel; the fused
// kernel below runs the same code).
template <int DK, bool Conv = false>
__device__ __forceinline__ void recurrence(const KdaArgs& a, ConvolvedRows<DK>* conv = nullptr) {
  using S = RecurrentShape<DK>;
  __shared__ __align__(16) float sk[S::P * S::LD], sq[S::P * S::LD], sdec[S::P * S::LD];
  __shared__ float sbeta;
  const uint32_t h = blockIdx.x, s = blockIdx.y, e = threadIdx.x;
  const uint32_t p = e % S::P, j = blockIdx.z * S::CB + e / S::P;
  const uint32_t se = (e / S::RP) * S::LD + e % S::RP;  // where element e of k, q and decay goes
  const uint32_t C = a.heads * DK;
  const size_t slot = static_cast<size_t>(a.seg.slot[s]);
  const uint32_t len = static_cast<uint32_t>(a.seg.len[s]);
  const size_t first = static_cast<size_t>(a.seg.first_row[s]);
  float* state = a.state + ((slot * a.heads + h) * DK + p * S::RP) * DK + j;
  float st[S::RP];
#pragma unroll
  for (int i = 0; i < S::RP; ++i) st[i] = state[static_cast<size_t>(i) * DK];
  const float rate = -a.a[h];  // exp(A_log)
  const float dt_bias = a.dt_bias[h * DK + e];
  // Launched with PDL (the decode graphs' fused kernel), the state (this layer's, a step old) and the
  // weights are asked while the products ahead finish; their outputs only after the wait. Conv: q, k and
  // v convolved here into *conv (recurrent_norm_kernel<DK, true>); f and beta read as they lie.
  if constexpr (Conv) {
    convolve_head<DK>(a, *conv, [] { pdl_wait(); });
    __syncthreads();
  } else {
    pdl_wait();
  }
  auto load = [&](TokenInputs& x, uint32_t t) {
    if constexpr (Conv) {
      const size_t row = first + t;
      x.k = conv->k[t * DK + e];
      x.q = conv->q[t * DK + e];
      x.f = a.f[row * C + h * DK + e];
      x.v = conv->v[t * S::CB + e / S::P];
      if (e == 0) x.beta = a.beta[row * a.heads + h];
    } else {
      x.load(a, first + t, h * DK + e, h * DK + j, h, e == 0);
    }
  };
  auto decay = [&](const TokenInputs& x) { return expf(a.lower_bound / (1.0f + expf(-rate * (x.f + dt_bias)))); };
  auto gate = [](const TokenInputs& x) { return 1.0f / (1.0f + expf(-x.beta)); };
  // in[d]: token t + d's inputs, loaded kAhead tokens ahead; the current token's decay and beta
  // computed in the token before it.
  TokenInputs in[kAhead];
#pragma unroll
  for (uint32_t d = 0; d < kAhead; ++d) {
    if (d < len) load(in[d], d);
  }
  float token_decay = len > 0 ? decay(in[0]) : 0.0f, token_beta = len > 0 && e == 0 ? gate(in[0]) : 0.0f;
  for (uint32_t t = 0; t < len; ++t) {
    const size_t row = first + t;
    sk[se] = in[0].k;
    sq[se] = in[0].q;
    sdec[se] = token_decay;
    if (e == 0) sbeta = token_beta;
    const float v = in[0].v;
    __syncthreads();
#pragma unroll
    for (uint32_t d = 0; d + 1 < kAhead; ++d) in[d] = in[d + 1];
    if (t + kAhead < len) load(in[kAhead - 1], t + kAhead);
    float k[S::RP], q[S::RP], dec[S::RP];
    load_row<S::RP>(sk + p * S::LD, k);
    load_row<S::RP>(sdec + p * S::LD, dec);
    float kv = 0.0f;
#pragma unroll
    for (int i = 0; i < S::RP; ++i) {
      st[i] *= dec[i];
      kv += st[i] * k[i];
    }
#pragma unroll
    for (int m = 1; m < S::P; m <<= 1) kv += __shfl_xor_sync(0xffffffffu, kv, m);
    const float delta = sbeta * (v - kv);
    load_row<S::RP>(sq + p * S::LD, q);
    float o = 0.0f;
#pragma unroll
    for (int i = 0; i < S::RP; ++i) {
      st[i] += k[i] * delta;
      o += st[i] * q[i];
    }
#pragma unroll
    for (int m = 1; m < S::P; m <<= 1) o += __shfl_xor_sync(0xffffffffu, o, m);
    if (p == 0) a.out[row * C + h * DK + j] = o;
    if (t + 1 < len) {
      token_decay = decay(in[0]);
      if (e == 0) token_beta = gate(in[0]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < S::RP; ++i) state[static_cast<size_t>(i) * DK] = st[i];
}

template <int DK>
__global__ void __launch_bounds__(DK) recurrent_kernel(KdaArgs a) {
  if (a.skip_chunked && static_cast<uint32_t>(a.seg.len[blockIdx.y]) >= kKdaChunkedMinRows) return;
  recurrence<DK>(a);
}

// One output of the gated RMSNorm: x times the head's 1/rms, the norm weight and sigmoid(gate); the
// f32 kernels and the split kernel below share it, so they give the same values.
__device__ __forceinline__ float gated_norm_value(float x, float inv, float w, float g) {
  return x * inv * w * (1.0f / (1.0f + expf(-g)));
}

// One warp's (row, head) `item` of the gated RMSNorm (gated_norm_kernel; the fused kernel below).
__device__ __forceinline__ void gated_norm_item(const float* o, const float* gate, const float* w, size_t item,
                                                uint32_t head_dim, float eps, float* out, uint32_t lane) {
  const size_t base = item * head_dim;
  float ss = 0.0f;
  for (uint32_t i = lane; i < head_dim; i += 32) ss += o[base + i] * o[base + i];
  const float inv = rsqrtf(warp_sum(ss) / static_cast<float>(head_dim) + eps);
  for (uint32_t i = lane; i < head_dim; i += 32) {
    out[base + i] = gated_norm_value(o[base + i], inv, w[i], gate[base + i]);
  }
}

__global__ void gated_norm_kernel(const float* o, const float* gate, const float* w, uint32_t rows, uint32_t heads,
                                  uint32_t head_dim, float eps, float* out) {
  pdl_launch_dependents();  // the output projection may request its weights now (gpu/pdl.hpp)
  const uint32_t lane = threadIdx.x & 31;
  const size_t item = (blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x) >> 5;
  if (item >= static_cast<size_t>(rows) * heads) return;
  gated_norm_item(o, gate, w, item, head_dim, eps, out, lane);
}

// Prefill rows: gated_norm_item's values (the same lanes, sums and operations) written as the output
// projection's fp16 split (half_split.cuh) into LayerRunner::mm_staged's staging, row i's lo values then its hi
// values, rows 2 * heads * head_dim apart: the f32 rows and the pass that split them are not needed. A lane's
// loads all come before its stores.
__global__ void __launch_bounds__(256) gated_norm_split_kernel(const float* o, const float* gate, const float* w,
                                                               uint32_t rows, uint32_t heads, uint32_t head_dim,
                                                               float eps, __half* lo_hi) {
  constexpr uint32_t L = 4;  // head dims up to 128
  const uint32_t lane = threadIdx.x & 31;
  const uint32_t item = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  if (item >= rows * heads) return;
  const size_t base = static_cast<size_t>(item) * head_dim;
  float x[L], g[L];
#pragma unroll
  for (uint32_t k = 0; k < L; ++k) {
    const uint32_t i = lane + 32 * k;
    x[k] = i < head_dim ? o[base + i] : 0.0f;
    g[k] = i < head_dim ? gate[base + i] : 0.0f;
  }
  float ss = 0.0f;
#pragma unroll
  for (uint32_t k = 0; k < L; ++k) {
    if (lane + 32 * k < head_dim) ss += x[k] * x[k];
  }
  const float inv = rsqrtf(warp_sum(ss) / static_cast<float>(head_dim) + eps);
  const uint32_t C = heads * head_dim, r = item / heads;
  __half* lo = lo_hi + static_cast<size_t>(r) * 2 * C + (item - r * heads) * head_dim;
#pragma unroll
  for (uint32_t k = 0; k < L; ++k) {
    const uint32_t i = lane + 32 * k;
    if (i < head_dim) {
      __half h, l;
      split_half(gated_norm_value(x[k], inv, w[i], g[k]), h, l);
      lo[i] = l;
      lo[C + i] = h;
    }
  }
}

// Decode rows: the recurrence, then the gated norm of the heads it wrote, in one launch. A head's
// DK / CB blocks (its columns) are one cluster; once all have written their columns of a row's output
// (the cluster barrier orders those writes before the reads), warp w of the cluster's block q takes
// the segment's rows q * warps + w, q * warps + w + P * warps, ...: gated_norm_kernel's warp code on
// the same values, so the two launches' bits. Conv: the head's convolution first (convolve_head), its
// state stored after the cluster barrier.
template <int DK, bool Conv>
__global__ void __launch_bounds__(DK) recurrent_norm_kernel(KdaArgs a, GatedNorm g) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (Conv) {
    __shared__ ConvolvedRows<DK> rows;
    recurrence<DK, true>(a, &rows);
    pdl_launch_dependents();  // the output projection may request its weights now (gpu/pdl.hpp)
    cooperative_groups::this_cluster().sync();
    conv_state_after<DK>(a, rows);  // every block of the head has read the old state
  } else {
    recurrence<DK>(a);
    pdl_launch_dependents();
    cooperative_groups::this_cluster().sync();
  }
  const uint32_t h = blockIdx.x, s = blockIdx.y, lane = threadIdx.x & 31, warps = DK / 32;
  const uint32_t len = static_cast<uint32_t>(a.seg.len[s]);
  const size_t first = static_cast<size_t>(a.seg.first_row[s]);
  for (uint32_t t = blockIdx.z * warps + (threadIdx.x >> 5); t < len; t += gridDim.z * warps) {
    gated_norm_item(a.out, g.gate, g.w, (first + t) * a.heads + h, DK, g.eps, g.out, lane);
  }
#else
  (void)a, (void)g;
  __trap();  // launched only where it was built for sm90+ (kda_recurrent_gated_norm)
#endif
}

unsigned grid_for(size_t n) { return static_cast<unsigned>(std::min<size_t>((n + 255) / 256, 65535 * 4)); }

}  // namespace

void kda_conv(const KdaArgs& a, cudaStream_t stream) {
  if (a.rows <= kMaxMatvecTokens) {
    kda_conv_decode(a, stream);
  } else {
    kda_conv_rows(a, stream);
  }
}

void kda_conv_decode(const KdaArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  if (a.kernel < 1 || a.kernel > kMaxConv) throw CudaError("KDA: conv kernel size not in 1..8");
  const size_t warps = static_cast<size_t>(a.segments) * 3 * a.heads;
  launch_with_pdl(conv_decode_kernel, dim3(static_cast<unsigned>((warps * 32 + 127) / 128)), dim3(128), 0, stream, a);
}

void kda_conv_rows(const KdaArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  if (a.kernel < 1 || a.kernel > kMaxConv) throw CudaError("KDA: conv kernel size not in 1..8");
  if (a.head_dim > 32 * kConvLaneChannels) {
    throw CudaError("KDA: head dim " + std::to_string(a.head_dim) + " is above 128");
  }
  const size_t warps = size_t{(a.rows + kConvRowsPerWarp - 1) / kConvRowsPerWarp} * 3 * a.heads;
  const unsigned blocks = static_cast<unsigned>((warps * 32 + 127) / 128);
  switch (a.kernel) {
    case 1: conv_rows_kernel<1><<<blocks, 128, 0, stream>>>(a); break;
    case 2: conv_rows_kernel<2><<<blocks, 128, 0, stream>>>(a); break;
    case 3: conv_rows_kernel<3><<<blocks, 128, 0, stream>>>(a); break;
    case 4: conv_rows_kernel<4><<<blocks, 128, 0, stream>>>(a); break;
    case 5: conv_rows_kernel<5><<<blocks, 128, 0, stream>>>(a); break;
    case 6: conv_rows_kernel<6><<<blocks, 128, 0, stream>>>(a); break;
    case 7: conv_rows_kernel<7><<<blocks, 128, 0, stream>>>(a); break;
    default: conv_rows_kernel<8><<<blocks, 128, 0, stream>>>(a); break;
  }
  FERRY_CUDA_LAUNCHED();
  conv_state_kernel<<<grid_for(static_cast<size_t>(a.segments) * 3 * a.heads * a.head_dim), 256, 0, stream>>>(a);
  FERRY_CUDA_LAUNCHED();
}

void kda_recurrent(const KdaArgs& a, cudaStream_t stream) {
  if (a.segments == 0) return;
  // Blocks of DK threads, each CB columns of a head: DK / CB blocks a head and segment.
  auto launch = [&](auto kernel, int cb) {
    kernel<<<dim3(a.heads, a.segments, a.head_dim / cb), a.head_dim, 0, stream>>>(a);
  };
  switch (a.head_dim) {
    case 8: launch(recurrent_kernel<8>, RecurrentShape<8>::CB); break;
    case 16: launch(recurrent_kernel<16>, RecurrentShape<16>::CB); break;
    case 32: launch(recurrent_kernel<32>, RecurrentShape<32>::CB); break;
    case 64: launch(recurrent_kernel<64>, RecurrentShape<64>::CB); break;
    case 128: launch(recurrent_kernel<128>, RecurrentShape<128>::CB); break;
    default: throw CudaError("KDA: head dim " + std::to_string(a.head_dim) + " is not 8, 16, 32, 64 or 128");
  }
  FERRY_CUDA_LAUNCHED();
}

namespace {

template <bool Conv>
bool launch_recurrent_norm(const KdaArgs& a, const GatedNorm& g, cudaStream_t stream) {
  if (a.segments == 0 || a.rows > kMaxMatvecTokens) return false;
  if (Conv && a.kernel != kFusedConvTaps) return false;
  auto launch = [&](auto kernel, int cb) {
    if (!sm90_code_built(reinterpret_cast<const void*>(kernel))) return false;
    const uint32_t blocks = a.head_dim / static_cast<uint32_t>(cb);  // a head's: one cluster
    // PDL inside the decode graphs
    const ClusterLaunch l(reinterpret_cast<const void*>(kernel), dim3(a.heads, a.segments, blocks), dim3(a.head_dim), 0,
                          stream, dim3(1, 1, blocks), true);
    FERRY_CUDA(cudaLaunchKernelEx(&l.cfg, kernel, a, g));
    return true;
  };
  // Head dims of at least a warp: the norm's warps are whole.
  switch (a.head_dim) {
    case 32: return launch(recurrent_norm_kernel<32, Conv>, RecurrentShape<32>::CB);
    case 64: return launch(recurrent_norm_kernel<64, Conv>, RecurrentShape<64>::CB);
    case 128: return launch(recurrent_norm_kernel<128, Conv>, RecurrentShape<128>::CB);
    default: return false;
  }
}

}  // namespace

bool kda_recurrent_gated_norm(const KdaArgs& a, const GatedNorm& g, cudaStream_t stream) {
  return launch_recurrent_norm<false>(a, g, stream);
}

bool kda_conv_fuses(const KdaArgs& a) {
  if (a.segments == 0 || a.rows > kMaxMatvecTokens || a.kernel != kFusedConvTaps) return false;
  switch (a.head_dim) {
    case 32: return sm90_code_built(reinterpret_cast<const void*>(recurrent_norm_kernel<32, true>));
    case 64: return sm90_code_built(reinterpret_cast<const void*>(recurrent_norm_kernel<64, true>));
    case 128: return sm90_code_built(reinterpret_cast<const void*>(recurrent_norm_kernel<128, true>));
    default: return false;
  }
}

bool kda_conv_recurrent_gated_norm(const KdaArgs& a, const GatedNorm& g, cudaStream_t stream) {
  return launch_recurrent_norm<true>(a, g, stream);
}

void gated_rms_norm_split(const float* o, const float* gate, const float* w, uint32_t rows, uint32_t heads,
                          uint32_t head_dim, float eps, void* lo_hi, cudaStream_t stream) {
  if (rows == 0) return;
  if (head_dim > 128) throw CudaError("gated_rms_norm_split: head dim " + std::to_string(head_dim) + " is above 128");
  const size_t warps = static_cast<size_t>(rows) * heads;
  gated_norm_split_kernel<<<static_cast<unsigned>((warps * 32 + 255) / 256), 256, 0, stream>>>(
      o, gate, w, rows, heads, head_dim, eps, static_cast<__half*>(lo_hi));
  FERRY_CUDA_LAUNCHED();
}

void gated_rms_norm(const float* o, const float* gate, const float* w, uint32_t rows, uint32_t heads,
                    uint32_t head_dim, float eps, float* out, cudaStream_t stream) {
  if (rows == 0) return;
  const size_t warps = static_cast<size_t>(rows) * heads;
  gated_norm_kernel<<<static_cast<unsigned>((warps * 32 + 255) / 256), 256, 0, stream>>>(o, gate, w, rows, heads,
                                                                                       head_dim, eps, out);
  FERRY_CUDA_LAUNCHED();
}

}  // namespace ferry::gpu
