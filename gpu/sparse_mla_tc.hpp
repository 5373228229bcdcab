#pragma once
// Sparse MLA of prefill rows on tensor cores (gpu/sparse_mla_tc.cu, gpu/sparse_mla_mma.cu). All heads
// of a row share its selection, so a block takes a group of heads of one row: scores (heads x rank) x
// (rank x selected latents) and values (heads x latents) x (latents x rank) per tile of the
// selection, over fp16 hi/lo operands (the split LayerRunner::mm uses, ~22 significant bits), the
// softmax in f32 online over the tiles (flash attention). Decode rows keep gpu/dsa.cu's kernel, which
// splits a row's selection over blocks instead.
#include <cuda_runtime_api.h>

#include "gpu/kernels.hpp"

namespace ferry::gpu {

// Whether sparse_mla() takes the tensor-core kernel for `a`: more rows than a decode step (as its
// split_rows plans them), rank a multiple of 128 up to 512, and the shared memory it needs on this
// device (any number of heads: a last group of fewer than 16 leaves the rest of its tile zero).
bool sparse_mla_tc_applies(const SparseMlaArgs& a);
// The tensor-core kernels: sparse_mla_mma() where it applies, else sparse_mla_wmma(); throws CudaError
// naming what does not fit where sparse_mla_tc_applies() fails on the shape (the row count aside).
void sparse_mla_tc(const SparseMlaArgs& a, cudaStream_t stream);
// The WMMA kernel (gpu/sparse_mla_tc.cu) whatever the KV type and the code: fp16 hi/lo latents, 16
// heads a block (a 64-head row gathers its latents 4 times). The Volta path; the tests' comparison.
void sparse_mla_wmma(const SparseMlaArgs& a, cudaStream_t stream);
// Whether sparse_mla_tc() takes the mma.sync kernel (gpu/sparse_mla_mma.cu): int8 latents, rank a
// multiple of 128 up to 512, sm80+ code on this device. 32 heads a block, each warp a slice of the
// rank (its queries and outputs in registers, its latents' columns copied raw by cp.async); the
// int8 values are exact in fp16, so the latents take one product where the WMMA kernel takes
// hi/lo pairs, and a 64-head row gathers its latents twice.
bool sparse_mla_mma_applies(const SparseMlaArgs& a);
// That kernel; throws CudaError where sparse_mla_mma_applies() fails.
void sparse_mla_mma(const SparseMlaArgs& a, cudaStream_t stream);
// gpu/dsa.cu's CUDA-core kernel whatever the rows (the decode path, and the tests' reference).
void sparse_mla_simt(const SparseMlaArgs& a, cudaStream_t stream);

}  // namespace ferry::gpu
