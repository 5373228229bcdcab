// DeepSeek sparse attention on the device: the lightning indexer's pool keys, pool scores and top-k
// selection, and MLA in absorbed form over the selected latents.
//
// Selection rule (the same as the CPU backend's): the top min(index_topk / kpool, visible pools)
// complete pools by score; among equal scores the lower pool index wins (the ReLU makes exact ties of
// 0.0 common). Selected pools are listed in increasing index, each expanded to its kpool tokens, then
// the visible tail of the incomplete pool when index_kpool_always_select_tail is set.
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <string>

#include "gpu/block_reduce.cuh"
#include "gpu/cuda_check.hpp"
#include "gpu/indexer_decode.hpp"
#include "gpu/indexer_prefill.hpp"
#include "gpu/kernels.hpp"
#include "gpu/latent_rows.cuh"
#include "gpu/order_key.cuh"
#include "gpu/pdl.cuh"
#include "gpu/pool_key.cuh"
#include "gpu/row_ops.cuh"
#include "gpu/sparse_mla_tc.hpp"
#include "kv/kv_codec.hpp"

namespace ferry::gpu {
namespace {

constexpr int kPoolChunk = 256;

__global__ void pool_key_kernel(IndexerArgs a) {
  const uint32_t s = blockIdx.y;
  const int start = a.seg.start[s], end = start + a.seg.len[s];
  const int p = start / static_cast<int>(a.kpool) + static_cast<int>(blockIdx.x);
  if (p >= end / static_cast<int>(a.kpool)) return;
  pool_key_channels(a, static_cast<size_t>(a.seg.slot[s]), p);
}

// Block: 256 pools of one query row; one warp per pool at a time, one lane per indexer head.
__global__ void pool_score_kernel(IndexerArgs a) {
  extern __shared__ float smem[];
  const uint32_t r = blockIdx.y;
  const int pos = a.row.pos[r];
  const int nv = (pos + 1) / static_cast<int>(a.kpool);
  const int p0 = static_cast<int>(blockIdx.x) * kPoolChunk;
  if (p0 >= nv) return;
  const uint32_t H = a.heads, hd = a.head_dim, ld = hd + 1;
  float* kq = smem;           // [H][hd + 1]
  float* w = smem + H * ld;   // [H]
  const float* q = a.q + static_cast<size_t>(r) * H * hd;
  for (uint32_t i = threadIdx.x; i < H * hd; i += blockDim.x) kq[(i / hd) * ld + i % hd] = q[i];
  const float wscale = rsqrtf(static_cast<float>(H));
  for (uint32_t h = threadIdx.x; h < H; h += blockDim.x) w[h] = a.w[static_cast<size_t>(r) * H + h] * wscale;
  __syncthreads();
  const float scale = rsqrtf(static_cast<float>(hd));
  const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const size_t slot = static_cast<size_t>(a.row.slot[r]);
  const float* pools = a.pool_cache + slot * (a.ctx / a.kpool) * hd;
  const int p_end = min(p0 + kPoolChunk, nv);
  for (int p = p0 + static_cast<int>(warp); p < p_end; p += static_cast<int>(warps)) {
    const float* pk = pools + static_cast<size_t>(p) * hd;
    float part = 0.0f;
    for (uint32_t h = lane; h < H; h += 32) {
      const float* kh = kq + h * ld;
      float dot = 0.0f;
      for (uint32_t c = 0; c < hd; ++c) dot += kh[c] * __ldg(pk + c);
      part += w[h] * fmaxf(dot * scale, 0.0f);
    }
    part = warp_sum(part);
    if (lane == 0) a.scores[static_cast<size_t>(r) * (a.ctx / a.kpool) + p] = part;
  }
}

constexpr int kSelectThreads = 256;

__global__ void __launch_bounds__(kSelectThreads) select_kernel(IndexerArgs a) {
  using Scan = cub::BlockScan<int, kSelectThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ uint32_t hist[256];
  __shared__ uint32_t s_prefix, s_mask, s_remaining;
  __shared__ int s_taken, s_eq_seen;
  const uint32_t r = blockIdx.x;
  const int pos = a.row.pos[r];
  const int kp = static_cast<int>(a.kpool);
  const int nv = (pos + 1) / kp;
  const int K = min(static_cast<int>(a.topk) / kp, nv);
  const float* sc = a.scores + static_cast<size_t>(r) * (a.ctx / a.kpool);
  int32_t* toks = a.tokens + static_cast<size_t>(r) * a.max_tokens;

  if (threadIdx.x == 0) {
    s_prefix = 0;
    s_mask = 0;
    s_remaining = static_cast<uint32_t>(K);
    s_taken = 0;
    s_eq_seen = 0;
  }
  __syncthreads();
  const bool all = K >= nv;
  if (!all) {
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
      __syncthreads();
      const uint32_t prefix = s_prefix, mask = s_mask;
      for (int p = threadIdx.x; p < nv; p += blockDim.x) {
        const uint32_t key = order_key(sc[p]);
        if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        uint32_t above = 0;
        for (int b = 255; b >= 0; --b) {
          if (above + hist[b] >= s_remaining) {
            s_remaining -= above;
            s_prefix |= static_cast<uint32_t>(b) << shift;
            s_mask |= 255u << shift;
            break;
          }
          above += hist[b];
        }
      }
      __syncthreads();
    }
  }
  const uint32_t thr = s_prefix;
  const int eq_wanted = static_cast<int>(s_remaining);
  for (int base = 0; base < nv; base += kSelectThreads) {
    const int p = base + static_cast<int>(threadIdx.x);
    bool gt = false, eq = false;
    if (p < nv) {
      if (all) {
        gt = true;
      } else {
        const uint32_t key = order_key(sc[p]);
        gt = key > thr;
        eq = key == thr;
      }
    }
    int eq_rank, eq_total;
    Scan(scan_tmp).ExclusiveSum(eq ? 1 : 0, eq_rank, eq_total);
    __syncthreads();
    const bool take = gt || (eq && s_eq_seen + eq_rank < eq_wanted);
    int at, taken_here;
    Scan(scan_tmp).ExclusiveSum(take ? 1 : 0, at, taken_here);
    if (take) {
      const int j = s_taken + at;
      for (int i = 0; i < kp; ++i) toks[j * kp + i] = p * kp + i;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      s_taken += taken_here;
      s_eq_seen += eq_total;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    int count = s_taken * kp;
    if (a.select_tail) {
      const int tail = (pos + 1) % kp;
      for (int i = 0; i < tail; ++i) toks[count++] = pos + 1 - tail + i;
    }
    a.counts[r] = count;
  }
}

constexpr int kMaxHg = 8;       // heads per block
constexpr uint32_t kMaxSplits = 16;  // blocks one row's selection is split over

// Tokens a split's scores hold in shared memory: its share of max_tokens, rounded up to 4 so that
// each head's scores start 16-byte aligned (the value loop reads them as float4s).
__host__ __device__ __forceinline__ uint32_t split_capacity(uint32_t max_tokens, uint32_t splits) {
  return ((max_tokens + splits - 1) / splits + 3) & ~3u;
}

// Attention of `hg` heads of row r over split z of the row's selected tokens (flash-decoding): the
// scores, their maximum m and sum l of exp(score - m), and sum_i exp(s_i - m) latent_i. With one split
// the block writes the normalised output; otherwise (m, l, unnormalised sum) go to a.partial and
// mla_merge_kernel combines the splits.
template <config::KvType T>
__global__ void sparse_mla_kernel(SparseMlaArgs a, uint32_t hg, uint32_t splits) {
  extern __shared__ __align__(16) float smem[];
  __shared__ float s_max[kMaxHg], s_sum[kMaxHg];
  pdl_launch_dependents();  // the merge or v_b's matvec may take their places (gpu/pdl.hpp)
  pdl_wait();               // the selection, q_lat and the latents are the kernels' ahead
  const uint32_t r = blockIdx.y, h0 = blockIdx.x * hg, z = blockIdx.z;
  const uint32_t R = a.rank;
  const uint32_t per = split_capacity(a.max_tokens, splits);  // shared-memory capacity of a split
  float* sq = smem;               // [hg][R]
  float* ss = smem + hg * R;      // [hg][per]
  int32_t* toks = reinterpret_cast<int32_t*>(ss + hg * per);  // [per]
  const int all = a.counts[r];
  const int share = (all + static_cast<int>(splits) - 1) / static_cast<int>(splits);
  const int beg = min(all, static_cast<int>(z) * share);
  const int cnt = min(all, beg + share) - beg;
  const int32_t* gtoks = a.tokens + static_cast<size_t>(r) * a.max_tokens + beg;
  for (int i = threadIdx.x; i < cnt; i += blockDim.x) toks[i] = gtoks[i];
  const LatentRows<T> lat{a.latents, a.latent_scales, R};
  const size_t row0 = static_cast<size_t>(a.row.slot[r]) * a.ctx;
  const float* q = a.q_lat + (static_cast<size_t>(r) * a.heads + h0) * R;
  for (uint32_t i = threadIdx.x; i < hg * R; i += blockDim.x) sq[i] = q[i];
  __syncthreads();
  const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  // Scores: one warp per token; the latent row is loaded once (float4, up to 16 floats per lane in
  // flight), then dotted with each head's query.
  constexpr int kMaxVec = 4;  // rank <= 512 in registers; a larger rank loops over global memory
  const uint32_t R4 = R / 4;
  const bool vec = R % 4 == 0 && R4 <= 32 * kMaxVec;
  for (int i = static_cast<int>(warp); i < cnt; i += static_cast<int>(warps)) {
    const size_t lrow = row0 + static_cast<size_t>(toks[i]);
    if (vec) {
      float4 l[kMaxVec];
#pragma unroll
      for (int k = 0; k < kMaxVec; ++k) {
        const uint32_t c4 = lane + 32 * k;
        l[k] = c4 < R4 ? lat.load4(lrow, c4) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
      for (uint32_t hh = 0; hh < hg; ++hh) {
        float part = 0.0f;
#pragma unroll
        for (int k = 0; k < kMaxVec; ++k) {
          const uint32_t c4 = lane + 32 * k;
          if (c4 < R4) {
            const float4 qv = reinterpret_cast<const float4*>(sq + hh * R)[c4];
            part += qv.x * l[k].x + qv.y * l[k].y + qv.z * l[k].z + qv.w * l[k].w;
          }
        }
        part = warp_sum(part);
        if (lane == 0) ss[hh * per + i] = part * a.scale;
      }
    } else {
      for (uint32_t hh = 0; hh < hg; ++hh) {
        float part = 0.0f;
        for (uint32_t c = lane; c < R; c += 32) part += sq[hh * R + c] * lat.load(lrow, c);
        part = warp_sum(part);
        if (lane == 0) ss[hh * per + i] = part * a.scale;
      }
    }
  }
  __syncthreads();
  for (uint32_t hh = warp; hh < hg; hh += warps) {
    float* s = ss + hh * per;
    float mx = -INFINITY;
    for (int i = static_cast<int>(lane); i < cnt; i += 32) mx = fmaxf(mx, s[i]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int i = static_cast<int>(lane); i < cnt; i += 32) {
      s[i] = expf(s[i] - mx);
      sum += s[i];
    }
    sum = warp_sum(sum);
    if (lane == 0) s_max[hh] = mx, s_sum[hh] = sum;
  }
  __syncthreads();
  for (uint32_t c = threadIdx.x; c < R; c += blockDim.x) {
    float acc[kMaxHg];
#pragma unroll
    for (int hh = 0; hh < kMaxHg; ++hh) acc[hh] = 0.0f;
    // Eight independent latent loads in flight per step: the loop is bound by memory latency. Each
    // head's eight weights come as two float4s (its scores start 16-byte aligned when hg * R is a
    // multiple of 4): a quarter of the shared loads, the same products in the same order.
    int i = 0;
    const bool vec_ss = (hg * R) % 4 == 0;
    for (; i + 8 <= cnt; i += 8) {
      float v[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) v[u] = lat.load(row0 + static_cast<size_t>(toks[i + u]), c);
      if (vec_ss) {
#pragma unroll
        for (int hh = 0; hh < kMaxHg; ++hh) {
          if (hh >= static_cast<int>(hg)) continue;
          const float4 w0 = *reinterpret_cast<const float4*>(ss + hh * per + i);
          const float4 w1 = *reinterpret_cast<const float4*>(ss + hh * per + i + 4);
          const float w[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
#pragma unroll
          for (int u = 0; u < 8; ++u) acc[hh] += w[u] * v[u];
        }
      } else {
#pragma unroll
        for (int u = 0; u < 8; ++u) {
#pragma unroll
          for (int hh = 0; hh < kMaxHg; ++hh) {
            if (hh < static_cast<int>(hg)) acc[hh] += ss[hh * per + i + u] * v[u];
          }
        }
      }
    }
    for (; i < cnt; ++i) {
      const float v = lat.load(row0 + static_cast<size_t>(toks[i]), c);
#pragma unroll
      for (int hh = 0; hh < kMaxHg; ++hh) {
        if (hh < static_cast<int>(hg)) acc[hh] += ss[hh * per + i] * v;
      }
    }
#pragma unroll
    for (int hh = 0; hh < kMaxHg; ++hh) {
      if (hh >= static_cast<int>(hg)) continue;
      const size_t head = static_cast<size_t>(r) * a.heads + h0 + hh;
      if (splits == 1) {
        a.out[head * R + c] = s_sum[hh] > 0.0f ? acc[hh] / s_sum[hh] : 0.0f;
      } else {
        float* part = a.partial + (head * splits + z) * (R + 2);
        part[2 + c] = acc[hh];
        if (c == 0) part[0] = s_max[hh], part[1] = s_sum[hh];
      }
    }
  }
}

// out = sum_z e^(m_z - M) acc_z / sum_z e^(m_z - M) l_z over the splits of one (row, head); an empty
// split has l = 0 and adds nothing, a row without tokens gives 0.
__global__ void mla_merge_kernel(SparseMlaArgs a, uint32_t splits) {
  pdl_launch_dependents();  // v_b's matvec may request its weights now (gpu/pdl.hpp)
  pdl_wait();               // the splits' partials
  const size_t head = static_cast<size_t>(blockIdx.y) * a.heads + blockIdx.x;
  const uint32_t R = a.rank;
  const float* part = a.partial + head * splits * (R + 2);
  float m = -INFINITY;
  for (uint32_t z = 0; z < splits; ++z) {
    if (part[z * (R + 2) + 1] > 0.0f) m = fmaxf(m, part[z * (R + 2)]);
  }
  float w[kMaxSplits];
  float total = 0.0f;
  for (uint32_t z = 0; z < splits; ++z) {
    const float l = part[z * (R + 2) + 1];
    w[z] = l > 0.0f ? expf(part[z * (R + 2)] - m) : 0.0f;
    total += w[z] * l;
  }
  for (uint32_t c = threadIdx.x; c < R; c += blockDim.x) {
    float o = 0.0f;
    for (uint32_t z = 0; z < splits; ++z) o += w[z] * part[z * (R + 2) + 2 + c];
    a.out[head * R + c] = total > 0.0f ? o / total : 0.0f;
  }
}

// One block per row: the row's max |x| (int8), then its encoding.
__global__ void store_latents_kernel(const float* src, size_t src_stride, RowInfo rows, uint32_t width, uint32_t ctx,
                                     config::KvType type, void* cache, float* scales) {
  __shared__ float scratch[32];
  const uint32_t r = blockIdx.x;
  const size_t row = rows.slot == nullptr ? r : static_cast<size_t>(rows.slot[r]) * ctx + static_cast<size_t>(rows.pos[r]);
  store_latent_row(src + static_cast<size_t>(r) * src_stride, row, width, type, cache, scales, scratch);
}

}  // namespace

void store_latents(const float* src, size_t src_stride, RowInfo rows, uint32_t n_rows, uint32_t width, uint32_t ctx,
                   config::KvType type, void* cache, float* scales, cudaStream_t stream) {
  if (n_rows == 0) return;
  store_latents_kernel<<<n_rows, kStoreLatentThreads, 0, stream>>>(src, src_stride, rows, width, ctx, type, cache, scales);
  FERRY_CUDA_LAUNCHED();
}

void check_pool_ring(const IndexerArgs& a) {
  // A segment's new pools read from kpool - 1 positions before it to its end: all in the ring.
  if (a.key_rows < std::min(a.ctx, a.max_rows_per_segment + a.kpool - 1)) {
    throw CudaError("indexer: a segment of " + std::to_string(a.max_rows_per_segment) + " rows needs " +
                    std::to_string(a.max_rows_per_segment + a.kpool - 1) + " rows of keys, the ring holds " +
                    std::to_string(a.key_rows));
  }
}

void indexer_pool_keys(const IndexerArgs& a, cudaStream_t stream) {
  if (a.segments == 0) return;
  check_pool_ring(a);
  const dim3 grid(a.max_rows_per_segment / a.kpool + 1, a.segments);
  pool_key_kernel<<<grid, std::min<uint32_t>(a.head_dim, 256), 0, stream>>>(a);
  FERRY_CUDA_LAUNCHED();
}

void indexer_select(const IndexerArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  if (indexer_decode_fits(a)) {
    indexer_decode_scores(a, stream);
    indexer_decode_select(a, stream);
  } else if (indexer_prefill_applies(a)) {
    indexer_prefill_scores(a, stream);
    indexer_select_rows(a, stream);
  } else {
    indexer_scores_by_row(a, stream);
    indexer_select_by_row(a, stream);
  }
}

void indexer_scores_by_row(const IndexerArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  const uint32_t max_pools = a.ctx / a.kpool;
  const size_t smem = (static_cast<size_t>(a.heads) * (a.head_dim + 1) + a.heads) * sizeof(float);
  if (smem > 48 * 1024) {
    FERRY_CUDA(cudaFuncSetAttribute(pool_score_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  }
  const dim3 grid((max_pools + kPoolChunk - 1) / kPoolChunk, a.rows);
  pool_score_kernel<<<grid, 256, smem, stream>>>(a);
  FERRY_CUDA_LAUNCHED();
}

void indexer_select_by_row(const IndexerArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  select_kernel<<<a.rows, kSelectThreads, 0, stream>>>(a);
  FERRY_CUDA_LAUNCHED();
}

void sparse_mla(const SparseMlaArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  if (sparse_mla_tc_applies(a)) {
    sparse_mla_tc(a, stream);
  } else {
    sparse_mla_simt(a, stream);
  }
}

void sparse_mla_simt(const SparseMlaArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  const int limit = current_smem_optin();
  // Few rows (decode): each row's selection is split over enough blocks to fill the device twice,
  // as far as the scratch holds; many rows (prefill) fill it already.
  uint32_t hg = kMaxHg;
  while (hg > 1 && a.heads % hg != 0) hg /= 2;
  const uint32_t plan_rows = std::max(a.rows, a.split_rows);
  const uint32_t base_blocks = a.heads / hg * plan_rows;
  uint32_t splits = (2 * static_cast<uint32_t>(current_sm_count()) + base_blocks - 1) / base_blocks;
  splits = std::min({splits, kMaxSplits, a.partial ? a.partial_rows / plan_rows : 1u, std::max(a.max_tokens, 1u)});
  splits = std::max(splits, 1u);
  auto kernel = sparse_mla_kernel<config::KvType::f32>;
  if (a.latent_type == config::KvType::f16) kernel = sparse_mla_kernel<config::KvType::f16>;
  if (a.latent_type == config::KvType::int8) kernel = sparse_mla_kernel<config::KvType::int8>;
  auto need = [&](uint32_t g) {
    const size_t per = split_capacity(a.max_tokens, splits);
    return static_cast<size_t>(g) * (a.rank + per) * sizeof(float) + per * sizeof(int32_t);
  };
  while (hg > 1 && need(hg) > static_cast<size_t>(limit)) hg /= 2;
  if (need(hg) > static_cast<size_t>(limit)) throw CudaError("sparse MLA: selection too large for shared memory");
  const size_t smem = need(hg);
  if (smem > 48 * 1024) {
    FERRY_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  }
  launch_with_pdl(kernel, dim3(a.heads / hg, a.rows, splits), dim3(256), smem, stream, a, hg, splits);
  FERRY_CUDA_LAUNCHED();
  if (splits > 1) {
    launch_with_pdl(mla_merge_kernel, dim3(a.heads, a.rows), dim3(128), 0, stream, a, splits);
    FERRY_CUDA_LAUNCHED();
  }
}

}  // namespace ferry::gpu
