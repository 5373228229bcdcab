// Sparse MLA of prefill rows on tensor cores by WMMA, any KV type, sm70+ (gpu/sparse_mla_tc.hpp says
// what and why; int8 latents on sm80+ code take gpu/sparse_mla_mma.cu's kernel).
//
// A block: 8 warps, 16 heads of one row (a row's last block may have fewer, its other query rows zero),
// the row's selection in tiles of 16 latents. Per tile the block gathers the latents into shared
// memory as fp16 hi/lo (any KV type, as floats first); warp w multiplies the queries' columns
// [w R/8, (w+1) R/8) (kept in registers as hi/lo fragments) with the tile's, the eight partial scores
// are summed in a fixed order and scaled; one thread per (head, latent) updates the head's running
// max and sum (online softmax, f32) and splits exp(s - max) into hi/lo; warp w then rescales and
// accumulates output columns [w R/8, (w+1) R/8) (f32, shared memory) with the tile's weights times
// its latents. Products: hi*hi + (hi*lo + lo*hi) / 2^12.
#include <cuda_fp16.h>
#include <mma.h>

#include <algorithm>
#include <string>

#include "gpu/cuda_check.hpp"
#include "gpu/half_split.cuh"
#include "gpu/kernels.hpp"
#include "gpu/latent_rows.cuh"
#include "gpu/sparse_mla_tc.hpp"

namespace ferry::gpu {
namespace {

namespace wm = nvcuda::wmma;

constexpr uint32_t kHeads = 16;   // heads of a block: one WMMA row tile
constexpr uint32_t kTile = 16;    // selected latents a step
constexpr uint32_t kWarps = 8;
constexpr uint32_t kThreads = kWarps * 32;
constexpr uint32_t kMaxSteps = 4;  // k-steps of 16 columns a warp's share of the rank holds: rank <= 512
constexpr uint32_t kPad = 8;       // fp16 past each latent row: 16-byte multiple, rows off the same banks
static_assert(kHeads == kTile, "the queries are staged through a latent tile");
static_assert(kThreads == kHeads * kTile, "the softmax takes one thread per (head, latent) of a tile");

using FragA = wm::fragment<wm::matrix_a, 16, 16, 16, __half, wm::row_major>;
using FragAcc = wm::fragment<wm::accumulator, 16, 16, 16, float>;

struct Layout {
  uint32_t ldl;  // fp16 per latent row in shared memory
  size_t lat_hi, lat_lo, out, partial, p_hi, p_lo, stats, bytes;
  __host__ __device__ explicit Layout(uint32_t rank) : ldl(rank + kPad) {
    const size_t lat = size_t{kTile} * ldl * sizeof(__half);  // also holds the queries (kHeads == kTile)
    lat_hi = 0;
    lat_lo = lat_hi + lat;
    out = lat_lo + lat;                                        // [kHeads][rank] f32
    partial = out + size_t{kHeads} * rank * sizeof(float);     // [kWarps][kHeads][kTile] f32
    p_hi = partial + size_t{kWarps} * kHeads * kTile * sizeof(float);
    p_lo = p_hi + size_t{kHeads} * kTile * sizeof(__half);
    stats = p_lo + size_t{kHeads} * kTile * sizeof(__half);   // max, sum, rescale: [3][kHeads] f32
    bytes = stats + 3 * kHeads * sizeof(float);
  }
};

// 16 rows of R floats (each row from `load(row, c4)` as float4s; rows >= valid are zero) into the
// hi/lo tiles, four columns a store.
template <uint32_t R, class Load>
__device__ __forceinline__ void stage_rows(uint32_t valid, __half* hi, __half* lo, Load load) {
  constexpr uint32_t r4 = R / 4, ldl = R + kPad;
  for (uint32_t i = threadIdx.x; i < kTile * r4; i += kThreads) {
    const uint32_t row = i / r4, c4 = i % r4;
    const float4 v = row < valid ? load(row, c4) : make_float4(0.f, 0.f, 0.f, 0.f);
    const float f[4] = {v.x, v.y, v.z, v.w};
    __align__(8) __half h[4], l[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) split_half(f[k], h[k], l[k]);
    const size_t at = static_cast<size_t>(row) * ldl + 4 * c4;  // ldl % 4 == 0: 8-byte aligned
    *reinterpret_cast<uint2*>(hi + at) = *reinterpret_cast<const uint2*>(h);
    *reinterpret_cast<uint2*>(lo + at) = *reinterpret_cast<const uint2*>(l);
  }
}

// S: k-steps of 16 columns a warp takes (rank = 128 S), constant so that the loops unroll and the
// index arithmetic folds.
template <config::KvType T, uint32_t S>
__global__ void __launch_bounds__(kThreads) sparse_mla_tc_kernel(SparseMlaArgs a) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr uint32_t R = 16 * kWarps * S, kCols = 16 * S;  // the rank; a warp's columns
  const uint32_t r = blockIdx.y, h0 = blockIdx.x * kHeads;
  const uint32_t nh = min(kHeads, a.heads - h0);  // heads of this block; the rest of its rows are zero
  const Layout lay(R);
  constexpr uint32_t ldl = R + kPad;
  __half* lh = reinterpret_cast<__half*>(smem + lay.lat_hi);
  __half* ll = reinterpret_cast<__half*>(smem + lay.lat_lo);
  float* out = reinterpret_cast<float*>(smem + lay.out);
  float* partial = reinterpret_cast<float*>(smem + lay.partial);
  __half* ph = reinterpret_cast<__half*>(smem + lay.p_hi);
  __half* pl = reinterpret_cast<__half*>(smem + lay.p_lo);
  float* s_max = reinterpret_cast<float*>(smem + lay.stats);
  float* s_sum = s_max + kHeads;
  float* s_rescale = s_sum + kHeads;
  const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint32_t col0 = warp * kCols;

  // The queries, through the latent tiles, into each warp's fragments of its columns.
  const float* q = a.q_lat + (static_cast<size_t>(r) * a.heads + h0) * R;
  stage_rows<R>(nh, lh, ll, [&](uint32_t row, uint32_t c4) {
    return reinterpret_cast<const float4*>(q + static_cast<size_t>(row) * R)[c4];
  });
  for (uint32_t i = threadIdx.x; i < kHeads * R; i += kThreads) out[i] = 0.0f;
  if (threadIdx.x < kHeads) s_max[threadIdx.x] = -INFINITY, s_sum[threadIdx.x] = 0.0f;
  __syncthreads();
  FragA qh[S], ql[S];
#pragma unroll
  for (uint32_t k = 0; k < S; ++k) {
    wm::load_matrix_sync(qh[k], lh + col0 + 16 * k, ldl);
    wm::load_matrix_sync(ql[k], ll + col0 + 16 * k, ldl);
  }
  __syncthreads();

  const uint32_t cnt = static_cast<uint32_t>(a.counts[r]);
  const int32_t* toks = a.tokens + static_cast<size_t>(r) * a.max_tokens;
  const LatentRows<T> lat{a.latents, a.latent_scales, R};
  const size_t row0 = static_cast<size_t>(a.row.slot[r]) * a.ctx;
  const uint32_t h = threadIdx.x / kTile, j = threadIdx.x % kTile;  // the softmax's (head, latent)
  for (uint32_t t0 = 0; t0 < cnt; t0 += kTile) {
    const uint32_t valid = min(kTile, cnt - t0);
    stage_rows<R>(valid, lh, ll, [&](uint32_t row, uint32_t c4) {
      return lat.load4(row0 + static_cast<size_t>(toks[t0 + row]), c4);
    });
    __syncthreads();
    {  // partial scores of the warp's columns: queries (16 x cols) x latents^T (cols x 16)
      FragAcc hi, mixed;
      wm::fill_fragment(hi, 0.0f);
      wm::fill_fragment(mixed, 0.0f);
#pragma unroll
      for (uint32_t k = 0; k < S; ++k) {
        wm::fragment<wm::matrix_b, 16, 16, 16, __half, wm::col_major> bh, bl;
        wm::load_matrix_sync(bh, lh + col0 + 16 * k, ldl);
        wm::load_matrix_sync(bl, ll + col0 + 16 * k, ldl);
        wm::mma_sync(hi, qh[k], bh, hi);
        wm::mma_sync(mixed, qh[k], bl, mixed);
        wm::mma_sync(mixed, ql[k], bh, mixed);
      }
#pragma unroll
      for (int e = 0; e < hi.num_elements; ++e) hi.x[e] += mixed.x[e] * (1.0f / kHalfLoScale);
      wm::store_matrix_sync(partial + warp * kHeads * kTile, hi, kTile, wm::mem_row_major);
    }
    __syncthreads();
    {  // online softmax: a head's 16 latents are 16 lanes of one warp
      float s = 0.0f;
      for (uint32_t w = 0; w < kWarps; ++w) s += partial[(w * kHeads + h) * kTile + j];
      s *= a.scale;
      const bool in = j < valid;
      float mx = in ? s : -INFINITY;
#pragma unroll
      for (int o = kTile / 2; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o, kTile));
      const float m_old = s_max[h];
      const float m_new = fmaxf(m_old, mx);  // finite: latent 0 of a tile is always in
      const float p = in ? expf(s - m_new) : 0.0f;
      float sum = p;
#pragma unroll
      for (int o = kTile / 2; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o, kTile);
      split_half(p, ph[h * kTile + j], pl[h * kTile + j]);
      __syncwarp();
      if (j == 0) {
        const float rescale = expf(m_old - m_new);  // 0 on the first tile (m_old = -inf)
        s_rescale[h] = rescale;
        s_sum[h] = s_sum[h] * rescale + sum;
        s_max[h] = m_new;
      }
    }
    __syncthreads();
    {  // output columns of the warp: out = out * rescale + weights (16 x 16) x latents (16 x cols)
#pragma unroll 4
      for (uint32_t hh = 0; hh < kHeads; ++hh) {
        const float f = s_rescale[hh];
#pragma unroll
        for (uint32_t c = lane; c < kCols; c += 32) out[hh * R + col0 + c] *= f;
      }
      __syncwarp();
      wm::fragment<wm::matrix_a, 16, 16, 16, __half, wm::row_major> pah, pal;
      wm::load_matrix_sync(pah, ph, kTile);
      wm::load_matrix_sync(pal, pl, kTile);
#pragma unroll
      for (uint32_t k = 0; k < S; ++k) {
        const uint32_t c = col0 + 16 * k;
        wm::fragment<wm::matrix_b, 16, 16, 16, __half, wm::row_major> bh, bl;
        wm::load_matrix_sync(bh, lh + c, ldl);
        wm::load_matrix_sync(bl, ll + c, ldl);
        FragAcc acc, mixed;
        wm::load_matrix_sync(acc, out + c, R, wm::mem_row_major);
        wm::fill_fragment(mixed, 0.0f);
        wm::mma_sync(acc, pah, bh, acc);
        wm::mma_sync(mixed, pah, bl, mixed);
        wm::mma_sync(mixed, pal, bh, mixed);
#pragma unroll
        for (int e = 0; e < acc.num_elements; ++e) acc.x[e] += mixed.x[e] * (1.0f / kHalfLoScale);
        wm::store_matrix_sync(out + c, acc, R, wm::mem_row_major);
      }
    }
    __syncthreads();
  }
  for (uint32_t i = threadIdx.x; i < nh * R; i += kThreads) {
    const uint32_t hh = i / R;
    const float l = s_sum[hh];
    a.out[(static_cast<size_t>(r) * a.heads + h0 + hh) * R + i % R] = l > 0.0f ? out[i] / l : 0.0f;
  }
}

// What of the shape the kernel cannot take, or empty.
std::string misfit(const SparseMlaArgs& a) {
  if (a.heads == 0) return "no heads";
  if (a.rank == 0 || a.rank % (16 * kWarps) != 0 || a.rank > 16 * kWarps * kMaxSteps) {
    return "rank " + std::to_string(a.rank) + " not a multiple of 128 up to 512";
  }
  const int limit = current_smem_optin();
  const size_t need = Layout(a.rank).bytes;
  if (need > static_cast<size_t>(limit)) {
    return std::to_string(need) + " bytes of shared memory, the device has " + std::to_string(limit);
  }
  return {};
}

}  // namespace

bool sparse_mla_tc_applies(const SparseMlaArgs& a) {
  return std::max(a.rows, a.split_rows) > kMaxMatvecTokens && misfit(a).empty();
}

void sparse_mla_tc(const SparseMlaArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  const std::string why = misfit(a);
  if (!why.empty()) throw CudaError("sparse MLA on tensor cores: " + why);
  if (sparse_mla_mma_applies(a)) {
    sparse_mla_mma(a, stream);
  } else {
    sparse_mla_wmma(a, stream);
  }
}

void sparse_mla_wmma(const SparseMlaArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  const std::string why = misfit(a);
  if (!why.empty()) throw CudaError("sparse MLA on tensor cores: " + why);
  void (*kernel)(SparseMlaArgs) = nullptr;
  const uint32_t steps = a.rank / (16 * kWarps);
#define FERRY_TC_KERNELS(S)                                                                              \
  if (steps == S) {                                                                                      \
    kernel = a.latent_type == config::KvType::f16    ? sparse_mla_tc_kernel<config::KvType::f16, S>    \
             : a.latent_type == config::KvType::int8 ? sparse_mla_tc_kernel<config::KvType::int8, S>   \
                                                     : sparse_mla_tc_kernel<config::KvType::f32, S>;   \
  }
  FERRY_TC_KERNELS(1)
  FERRY_TC_KERNELS(2)
  FERRY_TC_KERNELS(3)
  FERRY_TC_KERNELS(4)
#undef FERRY_TC_KERNELS
  static_assert(kMaxSteps == 4, "one instantiation per k-step count");
  const size_t smem = Layout(a.rank).bytes;
  if (smem > 48 * 1024) {
    FERRY_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  }
  kernel<<<dim3((a.heads + kHeads - 1) / kHeads, a.rows), kThreads, smem, stream>>>(a);
  FERRY_CUDA_LAUNCHED();
}

}  // namespace ferry::gpu
