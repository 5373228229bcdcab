#pragma once
// Sparse MLA of prefill rows on tensor cores (gpu/sparse_mla_tc.cu). All heads of a row share its
// selection, so a block takes 16 heads of one row: scores (16 heads x rank) x (rank x 16 selected
// latents) and values (16 x 16) x (16 x rank) per tile of the selection, by WMMA over fp16 hi/lo
// operands (the split LayerRunner::mm uses, ~22 significant bits), the softmax in f32 online over
// the tiles (flash attention). Decode rows keep gpu/dsa.cu's kernel, which splits a row's selection
// over blocks instead.
#include <cuda_runtime_api.h>

#include "gpu/kernels.hpp"

namespace ferry::gpu {

// Whether sparse_mla() takes the tensor-core kernel for `a`: more rows than a decode step (as its
// split_rows plans them), rank a multiple of 128 up to 512, and the shared memory it needs on this
// device (any number of heads: a last group of fewer than 16 leaves the rest of its tile zero).
bool sparse_mla_tc_applies(const SparseMlaArgs& a);
// The tensor-core kernel; throws CudaError naming what does not fit where sparse_mla_tc_applies() fails
// on the shape (the row count aside).
void sparse_mla_tc(const SparseMlaArgs& a, cudaStream_t stream);
// gpu/dsa.cu's CUDA-core kernel whatever the rows (the decode path, and the tests' reference).
void sparse_mla_simt(const SparseMlaArgs& a, cudaStream_t stream);

}  // namespace ferry::gpu
