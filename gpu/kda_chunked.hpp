#pragma once
// KDA's delta-rule recurrence of long prefill segments in the chunked form (model/cpu/kda.hpp), the
// products between a chunk and the state on tensor cores (issue 15: the token-by-token recurrence of
// gpu/kda.cu costs ~1.5 ms a 2,048-row chunk a layer, its tokens one after another).
//
// Per head and chunk of 64 tokens from the segment's first row, with G_t the chunk's cumulative log
// decay through token t (per channel, <= 0) and every decay relative to a point of the chunk, so that
// each factor is e^{x} with x <= 0:
//   N_ts = beta_t sum_c k_t[c] k_s[c] e^{G_t[c] - G_s[c]}  (s < t),  M_ts = the same with q_t, s <= t,
//   (I + N) U = beta v,  (I + N) W = beta e^{G} k       (forward substitution, f32),
//   delta = U - W S,  o = (e^{G} q) S + M delta,  S <- e^{G_last} S + (e^{G_last - G} k)^T delta.
// A first kernel forms N, M (their exponentials one by one in f32: a per-channel decay over the chunk
// reaches e^-320, which no factorisation into two GEMM operands survives in fp16 or f32), U, W and the
// scaled q and k for every chunk at once; a second walks each head's chunks in order, 16 state columns
// a block, the three products per chunk on mma.sync m16n8k16 over the fp16 hi/lo split of both operands
// (three products, ~22 bits: gpu/half_split.cuh), the state in f32 accumulators.
//
// Not the recurrent kernel's bits (other sums in another order), within ~f32 rounding of it and of the
// CPU's double chunked form (tests/gpu/kda_chunked_test.cpp). The decode rows of a step, and segments
// shorter than kKdaChunkedMinRows, keep the recurrent kernel (KdaArgs::skip_chunked).
//
// LayerRunner::kda_layer calls it before the recurrent kernel: on the H200 a 2,048-row chunk a layer
// takes 1.05 ms against the recurrent kernel's 1.54 (gpu/PERF.md, the h64 section; its first version,
// 2.42 ms, was not dispatched).
#include <cuda_runtime_api.h>

#include <cstdint>

#include "gpu/kernels.hpp"

namespace ferry::gpu {

// Segments of at least this many rows take the chunked form.
inline constexpr uint32_t kKdaChunkedMinRows = 128;

// Runs the chunked form for a's segments of at least kKdaChunkedMinRows rows (max_seg_rows: the
// longest segment's) where head_dim is 128 and this device runs sm80+ code of the kernels; returns
// whether it did. Then kda_recurrent must run with skip_chunked set for the other segments. It uses
// a.qkv_raw as scratch and overwrites a.qkv of those rows (q, k, v become e^{G} q, e^{G_last - G} k, U).
bool kda_chunked(const KdaArgs& a, uint32_t max_seg_rows, cudaStream_t stream);

}  // namespace ferry::gpu
