// Decode-step indexer kernels (gpu/indexer_decode.hpp). At depth the per-row kernels of gpu/dsa.cu
// ran on few blocks (one per 256 pools of a row) with one serial dot product per lane, and selected on
// one block of 256 threads; here the pools are tiled over about as many blocks as the device holds.
//
// Bit-exact with dsa.cu: a pool's score is, as there, per head (one lane each, heads lane, lane + 32,
// ...) a dot product summed over the dims in order, then part += w * relu(dot * scale) in head order,
// then warp_sum over the lanes; only the number of pools a lane works on at once (independent sums)
// differs. The selection is the same radix select over order_key of the scores with the same
// tie rule (the lower pool index first), the pools listed in increasing index.
#include <cub/block/block_scan.cuh>

#include <algorithm>

#include "gpu/block_reduce.cuh"
#include "gpu/cuda_check.hpp"
#include "gpu/indexer_decode.hpp"
#include "gpu/kernels.hpp"
#include "gpu/order_key.cuh"

namespace ferry::gpu {
namespace {

constexpr int kScoreThreads = 256;
constexpr int kScoreWarps = kScoreThreads / 32;
constexpr int kPoolsPerWarp = 4;                       // independent dot products a lane keeps
constexpr int kTile = kScoreWarps * kPoolsPerWarp;     // pools a block scores at once

size_t score_smem(const IndexerArgs& a) {
  const size_t g = std::min(a.rows, kIndexerDecodeRows);
  return (static_cast<size_t>(kTile) * a.head_dim + g * a.heads * (a.head_dim + 1) + g * a.heads) * sizeof(float);
}

// Grid: (tile strides, rows). The block of a slot's first row scores all of that slot's rows; the
// others return. Shared memory: a tile of pool keys [kTile][hd], then each row's q [H][hd + 1] (the
// pad keeps the lanes' heads on distinct banks) and weights [H].
__global__ void __launch_bounds__(kScoreThreads) decode_score_kernel(IndexerArgs a) {
  extern __shared__ float4 smem4[];
  __shared__ uint32_t s_rows[kIndexerDecodeRows];
  __shared__ int s_nv[kIndexerDecodeRows];
  const uint32_t r0 = blockIdx.y;
  const int slot = a.row.slot[r0];
  for (uint32_t r = 0; r < r0; ++r) {
    if (a.row.slot[r] == slot) return;
  }
  const int kp = static_cast<int>(a.kpool);
  uint32_t G = 0;
  int nv_max = 0;
  for (uint32_t r = r0; r < a.rows; ++r) {
    if (a.row.slot[r] != slot) continue;
    const int nv = (a.row.pos[r] + 1) / kp;
    if (threadIdx.x == 0) {
      s_rows[G] = r;
      s_nv[G] = nv;
    }
    nv_max = max(nv_max, nv);
    ++G;
  }
  if (static_cast<int>(blockIdx.x) * kTile >= nv_max) return;  // no tile here (the grid is for the context)
  if (a.skip_whole_selections && nv_max <= static_cast<int>(a.topk) / kp) return;  // every pool selected
  const uint32_t H = a.heads, hd = a.head_dim, ld = hd + 1, hd4 = hd / 4;
  float* keys = reinterpret_cast<float*>(smem4);
  float* kq = keys + static_cast<size_t>(kTile) * hd;  // [G][H][hd + 1]
  float* w = kq + static_cast<size_t>(G) * H * ld;      // [G][H]
  const float wscale = rsqrtf(static_cast<float>(H));
  __syncthreads();  // s_rows written
  for (uint32_t g = 0; g < G; ++g) {
    const uint32_t r = s_rows[g];
    const float* q = a.q + static_cast<size_t>(r) * H * hd;
    for (uint32_t i = threadIdx.x; i < H * hd; i += blockDim.x) kq[(g * H + i / hd) * ld + i % hd] = q[i];
    for (uint32_t h = threadIdx.x; h < H; h += blockDim.x) w[g * H + h] = a.w[static_cast<size_t>(r) * H + h] * wscale;
  }
  const float scale = rsqrtf(static_cast<float>(hd));
  const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint32_t max_pools = a.ctx / a.kpool;
  const float4* pools = reinterpret_cast<const float4*>(a.pool_cache + static_cast<size_t>(slot) * max_pools * hd);
  const float4* keys4 = reinterpret_cast<const float4*>(keys);
  for (int p0 = static_cast<int>(blockIdx.x) * kTile; p0 < nv_max; p0 += static_cast<int>(gridDim.x) * kTile) {
    __syncthreads();  // the previous tile's reads are done (and the queries are in)
    const uint32_t n4 = static_cast<uint32_t>(min(kTile, nv_max - p0)) * hd4;
    for (uint32_t i = threadIdx.x; i < n4; i += blockDim.x) {
      smem4[i] = __ldg(pools + static_cast<size_t>(p0) * hd4 + i);
    }
    __syncthreads();
    const int pw = p0 + static_cast<int>(warp) * kPoolsPerWarp;  // the warp's first pool
    for (uint32_t g = 0; g < G; ++g) {
      const int nv = s_nv[g];
      if (pw >= nv) continue;
      const float4* kw = keys4 + (warp * kPoolsPerWarp) * hd4;
      float part[kPoolsPerWarp] = {};
      for (uint32_t h = lane; h < H; h += 32) {
        const float* kh = kq + (g * H + h) * ld;
        float dot[kPoolsPerWarp] = {};
        for (uint32_t c4 = 0; c4 < hd4; ++c4) {
          const float q0 = kh[4 * c4], q1 = kh[4 * c4 + 1], q2 = kh[4 * c4 + 2], q3 = kh[4 * c4 + 3];
#pragma unroll
          for (int j = 0; j < kPoolsPerWarp; ++j) {
            const float4 k = kw[j * hd4 + c4];
            dot[j] += q0 * k.x;
            dot[j] += q1 * k.y;
            dot[j] += q2 * k.z;
            dot[j] += q3 * k.w;
          }
        }
        const float wh = w[g * H + h];
#pragma unroll
        for (int j = 0; j < kPoolsPerWarp; ++j) part[j] += wh * fmaxf(dot[j] * scale, 0.0f);
      }
      float* out = a.scores + static_cast<size_t>(s_rows[g]) * max_pools;
#pragma unroll
      for (int j = 0; j < kPoolsPerWarp; ++j) {
        const float s = warp_sum(part[j]);
        if (lane == 0 && pw + j < nv) out[pw + j] = s;
      }
    }
  }
}

constexpr int kSelectThreads = 1024;
constexpr int kSelectPer = 8;                            // keys a thread holds, pools t * 8 .. t * 8 + 7
constexpr int kSelectChunk = kSelectThreads * kSelectPer;  // keys of a row the block holds at once
constexpr uint32_t kNoBin = 0xffffffffu;
// Prefill rows: a block of 512 a row, 9,216 keys in registers (a 2,048-row chunk at 32K has up to
// 8,704 pools a row). On the H200 (2,048 rows, gpu/PERF.md h62) 0.277 ms at 32K and 1.017 at 128K,
// against 0.268 / 1.188 for 256 threads of 36 keys and 0.415 / 0.920 for the decode steps' 1,024 of 8.
constexpr int kRowsThreads = 512;
constexpr int kRowsPer = 18;

// Keys base + threadIdx.x * P + j (j < P) of n, and how many of them exist.
template <int P, class KeyAt>
__device__ __forceinline__ int load_keys(const KeyAt& key_at, int base, int n, uint32_t (&key)[P]) {
  const int i0 = base + static_cast<int>(threadIdx.x) * P;
#pragma unroll
  for (int j = 0; j < P; ++j) key[j] = i0 + j < n ? key_at(i0 + j) : 0u;
  return max(0, min(P, n - i0));
}

// The top K of n keys key_at(i) (ties: the lower i first) on the whole block of T threads: emit(j, i)
// for the j-th selected in increasing i; returns how many (min(K, n)), to every thread. The radix passes count the
// keys matching the prefix so far into 256 bins (equal bins of a warp added at once: the ReLU puts
// many scores on exactly 0.0), warp 0 finds the bin of the K-th key from the top; then the keys above
// the threshold and the first `remaining` equal ones in index order are listed by two block scans a
// chunk. n <= T * P keeps the keys in registers (P a thread); more are read again each pass.
template <int T, int P, class KeyAt, class Emit>
__device__ int block_top_k(int n, int K, const KeyAt& key_at, const Emit& emit) {
  using Scan = cub::BlockScan<int, T>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ uint32_t hist[256];
  __shared__ uint32_t s_prefix, s_mask, s_remaining;
  __shared__ int s_taken, s_eq_seen;
  const uint32_t lane = threadIdx.x & 31;
  K = min(K, n);
  const bool one_chunk = n <= T * P;
  uint32_t key[P];
  int valid = one_chunk ? load_keys<P>(key_at, 0, n, key) : 0;
  __syncthreads();  // a previous call's reads of the shared state are done
  if (threadIdx.x == 0) {
    s_prefix = 0;
    s_mask = 0;
    s_remaining = static_cast<uint32_t>(K);
    s_taken = 0;
    s_eq_seen = 0;
  }
  const bool all = K >= n;
  if (!all) {
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
      __syncthreads();
      const uint32_t prefix = s_prefix, mask = s_mask;
      for (int base = 0; base < n; base += T * P) {
        if (!one_chunk) valid = load_keys<P>(key_at, base, n, key);
#pragma unroll
        for (int j = 0; j < P; ++j) {
          const uint32_t bin = j < valid && (key[j] & mask) == prefix ? (key[j] >> shift) & 255u : kNoBin;
          const unsigned peers = __match_any_sync(0xffffffffu, bin);
          if (bin != kNoBin && (__ffs(peers) - 1) == static_cast<int>(lane)) {
            atomicAdd(&hist[bin], static_cast<uint32_t>(__popc(peers)));
          }
        }
      }
      __syncthreads();
      if (threadIdx.x < 32) {
        // Lane l sums bins 255 - 8l down to 248 - 8l; the first lane whose running sum from the top
        // reaches `remaining` holds the bin, the first one there that does.
        uint32_t mine = 0;
        for (int i = 0; i < 8; ++i) mine += hist[255 - 8 * lane - i];
        uint32_t incl = mine;
        for (int o = 1; o < 32; o <<= 1) {
          const uint32_t v = __shfl_up_sync(0xffffffffu, incl, o);
          if (static_cast<int>(lane) >= o) incl += v;
        }
        const uint32_t remaining = s_remaining;
        const unsigned reach = __ballot_sync(0xffffffffu, incl >= remaining);
        if (static_cast<int>(lane) == __ffs(reach) - 1) {
          uint32_t above = incl - mine;
          for (int i = 0; i < 8; ++i) {
            const uint32_t b = 255u - 8u * lane - static_cast<uint32_t>(i);
            if (above + hist[b] >= remaining) {
              s_remaining = remaining - above;
              s_prefix |= b << shift;
              s_mask |= 255u << shift;
              break;
            }
            above += hist[b];
          }
        }
      }
      __syncthreads();
    }
  }
  __syncthreads();
  const uint32_t thr = s_prefix;
  const int eq_wanted = static_cast<int>(s_remaining);
  for (int base = 0; base < n; base += T * P) {
    if (!one_chunk) valid = load_keys<P>(key_at, base, n, key);
    int eq_n = 0;
#pragma unroll
    for (int j = 0; j < P; ++j) eq_n += (!all && j < valid && key[j] == thr) ? 1 : 0;
    int eq_before, eq_total;
    Scan(scan_tmp).ExclusiveSum(eq_n, eq_before, eq_total);
    __syncthreads();
    bool take[P];
    int take_n = 0, eq_rank = s_eq_seen + eq_before;
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const bool in = j < valid;
      const bool eq = !all && in && key[j] == thr;
      take[j] = in && (all || key[j] > thr || (eq && eq_rank < eq_wanted));
      eq_rank += eq ? 1 : 0;
      take_n += take[j] ? 1 : 0;
    }
    int at, taken_here;
    Scan(scan_tmp).ExclusiveSum(take_n, at, taken_here);
    int j_out = s_taken + at;
    const int i0 = base + static_cast<int>(threadIdx.x) * P;
#pragma unroll
    for (int j = 0; j < P; ++j) {
      if (take[j]) emit(j_out++, i0 + j);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      s_taken += taken_here;
      s_eq_seen += eq_total;
    }
    __syncthreads();
  }
  return s_taken;
}

struct RowSelect {
  int pos, nv, K;
  const float* scores;
  int32_t* tokens;
};
__device__ __forceinline__ RowSelect row_select(const IndexerArgs& a, uint32_t r) {
  const int pos = a.row.pos[r], kp = static_cast<int>(a.kpool);
  const int nv = (pos + 1) / kp;
  return {pos, nv, min(static_cast<int>(a.topk) / kp, nv), a.scores + static_cast<size_t>(r) * (a.ctx / a.kpool),
          a.tokens + static_cast<size_t>(r) * a.max_tokens};
}

// The row's selected pools (`taken` of them, already in tokens) followed by its visible tail.
__device__ __forceinline__ void finish_row(const IndexerArgs& a, uint32_t r, const RowSelect& s, int taken) {
  if (threadIdx.x != 0) return;
  const int kp = static_cast<int>(a.kpool);
  int count = taken * kp;
  if (a.select_tail) {
    const int tail = (s.pos + 1) % kp;
    for (int i = 0; i < tail; ++i) s.tokens[count++] = s.pos + 1 - tail + i;
  }
  a.counts[r] = count;
}

// A row that selects every visible pool (s.K == s.nv): block_top_k's list (all of them, in increasing
// index) without reading a score.
__device__ __forceinline__ bool select_all(const IndexerArgs& a, uint32_t r, const RowSelect& s) {
  if (s.K < s.nv) return false;
  const int kp = static_cast<int>(a.kpool);
  for (int i = static_cast<int>(threadIdx.x); i < s.nv * kp; i += static_cast<int>(blockDim.x)) s.tokens[i] = i;
  finish_row(a, r, s, s.nv);
  return true;
}

// One block of T threads a row over all its visible pools.
template <int T, int P>
__global__ void __launch_bounds__(T) decode_select_kernel(IndexerArgs a) {
  const uint32_t r = blockIdx.x;
  const RowSelect s = row_select(a, r);
  if (select_all(a, r, s)) return;
  const int kp = static_cast<int>(a.kpool);
  const int taken = block_top_k<T, P>(
      s.nv, s.K, [&](int i) { return order_key(s.scores[i]); },
      [&](int j, int p) {
        for (int i = 0; i < kp; ++i) s.tokens[j * kp + i] = p * kp + i;
      });
  finish_row(a, r, s, taken);
}

// Rows deeper than a chunk, in two launches. First, block (b, r) lists the top K of chunk b of row r's
// pools (K of the whole row: the row's top K under (score, then lower index) are among its chunks'),
// in increasing index, into the scratch at list (r, b): `cap` order keys, then `cap` pool indices.
struct SelectLists {
  uint32_t* base;
  uint32_t chunks, cap;  // lists a row, entries a list
  __device__ __forceinline__ uint32_t* keys(uint32_t r, uint32_t b) const {
    return base + (static_cast<size_t>(r) * chunks + b) * 2 * cap;
  }
  __device__ __forceinline__ uint32_t* pools(uint32_t r, uint32_t b) const { return keys(r, b) + cap; }
};

__global__ void __launch_bounds__(kSelectThreads) chunk_select_kernel(IndexerArgs a, SelectLists lists) {
  const uint32_t b = blockIdx.x, r = blockIdx.y;
  const RowSelect s = row_select(a, r);
  const int p0 = static_cast<int>(b) * kSelectChunk;
  if (p0 >= s.nv || s.K == s.nv) return;  // the merge takes a row that selects every pool
  uint32_t* keys = lists.keys(r, b);
  uint32_t* pools = lists.pools(r, b);
  block_top_k<kSelectThreads, kSelectPer>(
      min(kSelectChunk, s.nv - p0), s.K, [&](int i) { return order_key(s.scores[p0 + i]); },
      [&](int j, int i) {
        keys[j] = order_key(s.scores[p0 + i]);
        pools[j] = static_cast<uint32_t>(p0 + i);
      });
}

// Then one block a row selects from its lists, concatenated in chunk order (so in increasing pool
// index): every list but the last holds min(K, kSelectChunk) entries, the last min(K, its pools).
__global__ void __launch_bounds__(kSelectThreads) merge_select_kernel(IndexerArgs a, SelectLists lists) {
  const uint32_t r = blockIdx.x;
  const RowSelect s = row_select(a, r);
  if (select_all(a, r, s)) return;
  const int kp = static_cast<int>(a.kpool);
  const int chunks = (s.nv + kSelectChunk - 1) / kSelectChunk;
  const int E = max(min(s.K, kSelectChunk), 1);  // entries of a full chunk's list
  const int n = chunks == 0 ? 0 : (chunks - 1) * min(s.K, kSelectChunk) + min(s.K, s.nv - (chunks - 1) * kSelectChunk);
  const int taken = block_top_k<kSelectThreads, kSelectPer>(
      n, s.K, [&](int i) { return lists.keys(r, static_cast<uint32_t>(i / E))[i % E]; },
      [&](int j, int i) {
        const int p = static_cast<int>(lists.pools(r, static_cast<uint32_t>(i / E))[i % E]);
        for (int t = 0; t < kp; ++t) s.tokens[j * kp + t] = p * kp + t;
      });
  finish_row(a, r, s, taken);
}

}  // namespace

bool indexer_decode_fits(const IndexerArgs& a) {
  return a.rows >= 1 && a.rows <= kIndexerDecodeRows && a.heads >= 1 && a.head_dim >= 4 && a.head_dim % 4 == 0 &&
         reinterpret_cast<uintptr_t>(a.pool_cache) % 16 == 0 &&
         score_smem(a) <= static_cast<size_t>(current_smem_optin());
}

void indexer_decode_scores(const IndexerArgs& a, cudaStream_t stream) {
  if (!indexer_decode_fits(a)) throw CudaError("indexer decode scores: the step does not fit the decode kernel");
  const size_t smem = score_smem(a);
  if (smem > 48 * 1024) {
    FERRY_CUDA(cudaFuncSetAttribute(decode_score_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem)));
  }
  int per_sm = 0;
  FERRY_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, decode_score_kernel, kScoreThreads, smem));
  // Enough tile strides for one slot's rows to fill the device (all the step's rows may be one
  // slot's: a verify step); a block loads its rows' queries once and walks its tiles.
  const uint32_t tiles = (a.ctx / a.kpool + kTile - 1) / kTile;
  const uint32_t fill = static_cast<uint32_t>(std::max(per_sm, 1) * current_sm_count());
  const dim3 grid(std::max(1u, std::min(tiles, fill)), a.rows);
  decode_score_kernel<<<grid, kScoreThreads, smem, stream>>>(a);
  FERRY_CUDA_LAUNCHED();
}

void indexer_decode_select(const IndexerArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  // Contexts of more than one chunk of pools select on a block per chunk, then merge the chunks' lists,
  // when the budget is small enough for the lists to be fewer keys and the scratch holds them.
  const uint32_t cap = a.topk / a.kpool;
  const uint32_t chunks = (a.ctx / a.kpool + kSelectChunk - 1) / kSelectChunk;
  const size_t need = static_cast<size_t>(a.rows) * chunks * 2 * cap * sizeof(uint32_t);
  if (chunks > 1 && cap >= 1 && cap <= kSelectChunk / 2 && a.select_scratch != nullptr &&
      need <= a.select_scratch_bytes) {
    const SelectLists lists{static_cast<uint32_t*>(a.select_scratch), chunks, cap};
    chunk_select_kernel<<<dim3(chunks, a.rows), kSelectThreads, 0, stream>>>(a, lists);
    FERRY_CUDA_LAUNCHED();
    merge_select_kernel<<<a.rows, kSelectThreads, 0, stream>>>(a, lists);
    FERRY_CUDA_LAUNCHED();
    return;
  }
  decode_select_kernel<kSelectThreads, kSelectPer><<<a.rows, kSelectThreads, 0, stream>>>(a);
  FERRY_CUDA_LAUNCHED();
}

void indexer_select_rows(const IndexerArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  decode_select_kernel<kRowsThreads, kRowsPer><<<a.rows, kRowsThreads, 0, stream>>>(a);
  FERRY_CUDA_LAUNCHED();
}

}  // namespace ferry::gpu
