// The lightning indexer's scores and top-k for decode steps (1 to kIndexerDecodeRows query rows):
// the pools of a layer spread over the whole device, each pool key read once for all the step's rows
// of its slot, then the top pools of each row by a radix select over the scores' bits with the keys in
// registers (with deep contexts, per chunk and then merged). Scores and selections are bit for bit those of the per-row kernels of gpu/dsa.cu
// (which prefill steps keep): the same sums in the same order, the same selection rule.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "gpu/kernels.hpp"

namespace ferry::gpu {

constexpr uint32_t kIndexerDecodeRows = 8;

// Whether the decode kernels take this step: at most kIndexerDecodeRows rows, head_dim a multiple of
// 4, the pool cache 16-byte aligned, and the rows' queries and one tile of pool keys in shared memory.
bool indexer_decode_fits(const IndexerArgs& a);
// a.scores of every row's visible pools (rows of a slot share each read of its pool keys).
void indexer_decode_scores(const IndexerArgs& a, cudaStream_t stream);
// a.tokens / a.counts from a.scores: the selection rule of gpu/dsa.cu, one block a row; contexts of
// more than 8,192 pools with a.select_scratch large enough (rows x chunks of 8,192 pools x 2 x
// topk / kpool words), a block per chunk listing its top pools, then a block a row over the lists.
void indexer_decode_select(const IndexerArgs& a, cudaStream_t stream);

// The same selection on a block of 512 threads a row, 9,216 keys in registers: prefill rows, which
// fill the device by their number (decode steps need each row spread over more threads).
void indexer_select_rows(const IndexerArgs& a, cudaStream_t stream);

// The per-row kernels of gpu/dsa.cu (one block per 256 pools of a row; one block a row to select).
void indexer_scores_by_row(const IndexerArgs& a, cudaStream_t stream);
void indexer_select_by_row(const IndexerArgs& a, cudaStream_t stream);

}  // namespace ferry::gpu
