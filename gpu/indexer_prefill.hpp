#pragma once
// The lightning indexer's pool scores of prefill rows (more than a decode step's) on tensor cores.
// For a chunk at depth they are a batched product: (rows x heads) x head_dim queries against the
// slot's pool keys, then per row and pool sum_h w[h] relu(dot * head_dim^-0.5). gpu/dsa.cu's per-row
// kernel made each of those dot products one lane's serial f32 loop (66 ms a 2,048-row chunk at 32K,
// three DSA layers, on the H200); here a block takes 4 rows x 32 heads (two m16 tiles a row) against
// tiles of 64 pools on mma.sync m16n8k16, over the fp16 hi/lo split of both operands (three
// products: hi hi, hi lo, lo hi; ~22 significant bits, the split every prefill product takes), the
// ReLU, the weights and the sum over heads in f32 on the accumulators. The scores are not the per-row
// kernel's bits (other sums, in another order) but within rounding of them; the selection rule after
// them is unchanged (gpu/indexer_decode.hpp), so the selected pools are the f32 path's except where two
// scores are within rounding of a tie (tests/gpu/indexer_prefill_test.cpp).
#include <cuda_runtime_api.h>

#include "gpu/kernels.hpp"

namespace ferry::gpu {

// Whether indexer_prefill_scores() takes `a`: at most 32 heads, head_dim a multiple of 4 up to 128,
// the pool cache 16-byte aligned, sm80+ code on this device and its shared memory.
bool indexer_prefill_applies(const IndexerArgs& a);
// a.scores of every row's visible pools; throws CudaError where indexer_prefill_applies() fails.
void indexer_prefill_scores(const IndexerArgs& a, cudaStream_t stream);

}  // namespace ferry::gpu
