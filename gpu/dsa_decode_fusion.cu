#include "gpu/dsa_decode_fusion.hpp"

#include <algorithm>
#include <string>

#include "gpu/cuda_check.hpp"
#include "gpu/pdl.cuh"
#include "gpu/pool_key.cuh"
#include "gpu/row_ops.cuh"

namespace ferry::gpu {
namespace {

static_assert(kRmsNormThreads == kStoreLatentThreads, "the latent norm and its store share a block");

// Grid (rows, 2): y = 0 the q_a norm, y = 1 the kv_a norm and the row's cache write.
__global__ void __launch_bounds__(kRmsNormThreads) dsa_norms_kernel(DsaNormsArgs a) {
  pdl_launch_dependents();  // q_b's matvec may request its weights now (gpu/pdl.hpp)
  pdl_wait();               // q_a and kv_a are the product's ahead
  __shared__ float scratch[32];
  const uint32_t r = blockIdx.x;
  if (blockIdx.y == 0) {
    rms_norm_row(a.qa + r * a.qa_stride, a.qa_w, a.qlr, a.eps, a.qr + r * a.qr_stride, scratch);
    return;
  }
  float* lat = a.lat + r * a.lat_stride;
  rms_norm_row(lat, a.lat_w, a.kvlr, a.eps, lat, scratch);
  if (a.cache == nullptr) return;
  __syncthreads();  // the normalised row is written
  const size_t row = static_cast<size_t>(a.row.slot[r]) * a.ctx + static_cast<size_t>(a.row.pos[r]);
  store_latent_row(lat, row, a.kvlr, a.type, a.cache, a.scales, scratch);
}

// Row r's key normed in place, then it and its gate written to the slot's ring rows (a block's threads).
__device__ __forceinline__ void indexer_key_row(const IndexerKeysArgs& a, uint32_t r, float* scratch) {
  float* kk = a.kk + r * a.kk_stride;
  layer_norm_row(kk, a.w, a.b, a.width, a.eps, kk, scratch);
  __syncthreads();  // the normalised row is written
  const float* gs = a.gs + r * a.gs_stride;
  const size_t at = (static_cast<size_t>(a.row.slot[r]) * a.key_rows + static_cast<uint32_t>(a.row.pos[r]) % a.key_rows) *
                    a.width;
  for (uint32_t c = threadIdx.x; c < a.width; c += blockDim.x) {
    a.keys[at + c] = kk[c];
    a.gates[at + c] = gs[c];
  }
}

__global__ void __launch_bounds__(kLayerNormThreads) indexer_keys_kernel(IndexerKeysArgs a) {
  __shared__ float scratch[32];
  indexer_key_row(a, blockIdx.x, scratch);
}

// Block s: segment s's rows as indexer_keys_kernel makes them, then (their ring rows written) the
// keys of the pools the segment completes, as pool_key_kernel makes them.
__global__ void __launch_bounds__(kLayerNormThreads) indexer_keys_pools_kernel(IndexerKeysArgs k, IndexerArgs a) {
  __shared__ float scratch[32];
  const uint32_t s = blockIdx.x, first = static_cast<uint32_t>(a.seg.first_row[s]);
  const int start = a.seg.start[s], len = a.seg.len[s];
  for (uint32_t r = first; r < first + static_cast<uint32_t>(len); ++r) indexer_key_row(k, r, scratch);
  __syncthreads();  // the segment's ring rows are written
  const int kp = static_cast<int>(a.kpool);
  for (int p = start / kp; p < (start + len) / kp; ++p) pool_key_channels(a, static_cast<size_t>(a.seg.slot[s]), p);
}

}  // namespace

void indexer_keys_and_pools(const IndexerKeysArgs& k, const IndexerArgs& pools, cudaStream_t stream) {
  if (k.rows == 0) return;
  if (pools.kk_cache != k.keys || pools.gate_cache != k.gates || pools.key_rows != k.key_rows ||
      pools.head_dim != k.width) {
    throw CudaError("indexer_keys_and_pools: the pools are not made from the rings the keys go to");
  }
  if (k.rows > kMaxMatvecTokens || pools.segments == 0) {
    indexer_keys(k, stream);
    indexer_pool_keys(pools, stream);
    return;
  }
  check_pool_ring(pools);  // pools.key_rows is k.key_rows (checked above)
  if (k.row.slot == nullptr || k.row.pos == nullptr) throw CudaError("indexer_keys_and_pools: rows without slots");
  indexer_keys_pools_kernel<<<pools.segments, kLayerNormThreads, 0, stream>>>(k, pools);
  FERRY_CUDA_LAUNCHED();
}

void dsa_norms(const DsaNormsArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  if (a.cache != nullptr && (a.row.slot == nullptr || a.row.pos == nullptr || a.ctx == 0)) {
    throw CudaError("dsa_norms: a latent cache write needs the rows' slots, positions and the cache's rows");
  }
  if (a.cache != nullptr && a.type == config::KvType::int8 && a.scales == nullptr) {
    throw CudaError("dsa_norms: an int8 latent cache needs its scales");
  }
  launch_with_pdl(dsa_norms_kernel, dim3(a.rows, 2), dim3(kRmsNormThreads), 0, stream, a);
}

void indexer_keys(const IndexerKeysArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  if (a.key_rows == 0 || a.row.slot == nullptr || a.row.pos == nullptr) {
    throw CudaError("indexer_keys: the key rings need their rows, and the rows their slots and positions");
  }
  indexer_keys_kernel<<<a.rows, kLayerNormThreads, 0, stream>>>(a);
  FERRY_CUDA_LAUNCHED();
}

}  // namespace ferry::gpu
