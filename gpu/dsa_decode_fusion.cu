#include "gpu/dsa_decode_fusion.hpp"

#include "gpu/cuda_check.hpp"
#include "gpu/pdl.cuh"
#include "gpu/row_ops.cuh"

namespace ferry::gpu {
namespace {

static_assert(kRmsNormThreads == kStoreLatentThreads, "the latent norm and its store share a block");

// Grid (rows, 2): y = 0 the q_a norm, y = 1 the kv_a norm and the row's cache write.
__global__ void __launch_bounds__(kRmsNormThreads) dsa_norms_kernel(DsaNormsArgs a) {
  pdl_launch_dependents();  // q_b's matvec may request its weights now (gpu/pdl.hpp)
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

__global__ void __launch_bounds__(kLayerNormThreads) indexer_keys_kernel(IndexerKeysArgs a) {
  __shared__ float scratch[32];
  const uint32_t r = blockIdx.x;
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

}  // namespace

void dsa_norms(const DsaNormsArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  if (a.cache != nullptr && (a.row.slot == nullptr || a.row.pos == nullptr || a.ctx == 0)) {
    throw CudaError("dsa_norms: a latent cache write needs the rows' slots, positions and the cache's rows");
  }
  if (a.cache != nullptr && a.type == config::KvType::int8 && a.scales == nullptr) {
    throw CudaError("dsa_norms: an int8 latent cache needs its scales");
  }
  dsa_norms_kernel<<<dim3(a.rows, 2), kRmsNormThreads, 0, stream>>>(a);
  FERRY_CUDA_LAUNCHED();
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
