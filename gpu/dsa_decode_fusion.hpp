#pragma once
// DSA's per-row kernels between its products in fewer launches (issue 15): the q_a and kv_a norms
// with the latent cache write in one, the indexer's key norm with both key-cache writes and (decode)
// the new pools' keys in another (7 launches a DSA layer -> 2). Each block runs the plain kernel's code (gpu/row_ops.cuh) in a block
// of its size: the same bits as rms_norm, store_latents, layer_norm and scatter_to_cache.
#include <cuda_runtime_api.h>

#include "gpu/kernels.hpp"

namespace ferry::gpu {

// rms_norm(qa -> qr), rms_norm(lat in place), then store_latents(lat) into cache (when set: a
// windowed step stores its rows itself) at each row's slot * ctx + position.
struct DsaNormsArgs {
  uint32_t rows = 0;
  float eps = 1e-5f;
  const float* qa = nullptr;  // [rows][qa_stride] -> qr [rows][qr_stride], qlr wide
  size_t qa_stride = 0;
  const float* qa_w = nullptr;
  uint32_t qlr = 0;
  float* qr = nullptr;
  size_t qr_stride = 0;
  float* lat = nullptr;  // [rows][lat_stride], kvlr wide, in place
  size_t lat_stride = 0;
  const float* lat_w = nullptr;
  uint32_t kvlr = 0;
  RowInfo row;
  uint32_t ctx = 0;
  config::KvType type = config::KvType::f32;
  void* cache = nullptr;
  float* scales = nullptr;
};
void dsa_norms(const DsaNormsArgs& a, cudaStream_t stream);

// layer_norm(kk in place), then scatter_to_cache of kk into keys and of gs into gates (rings of
// key_rows rows a slot).
struct IndexerKeysArgs {
  uint32_t rows = 0, width = 0;
  float eps = 1e-5f;
  float* kk = nullptr;        // [rows][kk_stride]
  size_t kk_stride = 0;
  const float* w = nullptr;   // [width]
  const float* b = nullptr;   // [width]
  const float* gs = nullptr;  // [rows][gs_stride]
  size_t gs_stride = 0;
  RowInfo row;
  uint32_t key_rows = 0;
  float* keys = nullptr;
  float* gates = nullptr;
};
void indexer_keys(const IndexerKeysArgs& a, cudaStream_t stream);
// indexer_keys(k), then indexer_pool_keys(pools) (its rings k's: keys, gates, key_rows): for decode
// rows (<= kMaxMatvecTokens) one launch of a block a segment, which writes its rows' keys, then the
// keys of the pools they complete; otherwise the two launches. The same bits either way.
void indexer_keys_and_pools(const IndexerKeysArgs& k, const IndexerArgs& pools, cudaStream_t stream);

}  // namespace ferry::gpu
