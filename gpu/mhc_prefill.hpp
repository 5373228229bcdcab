#pragma once
// One mHC site of a prefill chunk in one launch (issue 15): the post of the site before, the mixing
// logits fn @ streams and the pre, the streams read from memory once (gpu/mhc_prefill.cu).
#include <cuda_runtime_api.h>

#include "gpu/mhc_decode.hpp"

namespace ferry::gpu {

// Rows of a prefill tile: one cluster of blocks takes 16 rows (one tensor-core MMA's rows).
inline constexpr uint32_t kMhcPrefillTileRows = 16;

// mhc_post_pre's work (same inputs and outputs, see there) for any number of rows, by clusters of 8
// blocks that each hold a column slice of 16 rows' streams, then the rows' Sinkhorn (two launches):
// the mixing logits on tensor cores over tf32 operands split in two (big + small, the small x small
// term dropped: ~f32 accuracy), the 1/rms and the collapsed stream's norm from the slices' Gram sums
// in f64 (as the decode kernel makes them). The post has mhc_post's bits; the coefficients are the
// one-block kernel's operations on these logits and sums. Returns false (launching nothing) when the
// kernels were not built for sm90+, the device cannot place the cluster, H != 4, D is not a multiple
// of 16 or above 4,096, fn is not the site's f32 mixer, a pointer is not 16-byte aligned, or a MoE
// combine is asked for: the caller then runs the separate steps.
bool mhc_site_prefill(const MhcPostPre& p, cudaStream_t stream);

}  // namespace ferry::gpu
