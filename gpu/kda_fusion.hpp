#pragma once
// KDA's recurrence and the gated RMSNorm of its output in one launch for decode rows (issue 15: one
// launch fewer a KDA layer).
#include <cuda_runtime_api.h>

#include "gpu/kernels.hpp"

namespace ferry::gpu {

// gated_rms_norm's arguments past the recurrence's output (a.out, [rows][heads * head_dim]).
struct GatedNorm {
  const float* gate = nullptr;  // [rows][heads * head_dim]
  const float* w = nullptr;     // [head_dim]
  float eps = 1e-5f;
  float* out = nullptr;         // [rows][heads * head_dim]
};

// kda_recurrent(a) then gated_rms_norm(a.out, g.gate, g.w, a.rows, a.heads, a.head_dim, g.eps, g.out)
// as one launch, the same bits: a head's blocks are one cluster, which norms the head's rows once all
// its columns are written. Only for decode rows (<= kMaxMatvecTokens), head dims 32, 64 and 128, and
// kernels built for sm90+; returns false (launching nothing) otherwise.
bool kda_recurrent_gated_norm(const KdaArgs& a, const GatedNorm& g, cudaStream_t stream);

// kda_conv(a) (the decode launch) then kda_recurrent_gated_norm(a, g) as one launch, the same bits: each
// block of a head's cluster convolves the head's q and k rows and its own columns of v into shared
// memory (conv_decode_kernel's sums, a.qkv written as it leaves it; the weights and state asked for
// before the PDL wait, every row's inputs at once after it), and the conv state is stored after the
// cluster barrier. One launch fewer on a decode step's chain, and one memory round trip where the
// decode launch makes one a tap. Where kda_conv_fuses(a) holds (kda_recurrent_gated_norm's cases, a
// conv of 4 taps as GLM's); kda_conv_recurrent_gated_norm returns false (launching nothing) otherwise.
bool kda_conv_fuses(const KdaArgs& a);
bool kda_conv_recurrent_gated_norm(const KdaArgs& a, const GatedNorm& g, cudaStream_t stream);

}  // namespace ferry::gpu
