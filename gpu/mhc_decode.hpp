#pragma once
// mhc_pre for decode rows (issue 15): a cluster of blocks a row instead of one block (gpu/ops.cu).
#include "gpu/kernels.hpp"

namespace ferry::gpu {

// Rows up to which mhc_pre takes the cluster kernel; above it the one-block kernel fills the device.
inline constexpr uint32_t kMhcClusterMaxRows = 256;

// Launches mhc_pre as kMhcClusterBlocks blocks a row, each reading its slice of the H streams once
// (the 1/rms and the collapsed stream's norm both come from the slices' Gram sums, in f64), when the
// kernels were built for sm90+ and the shape fits (H = 4, D a multiple of 4 and at most 32,768);
// returns false (launching nothing) otherwise. Same coefficients as the one-block kernel for the
// same 1/rms (the same operations in the same order); the 1/rms and the norm differ in rounding only.
bool mhc_pre_clustered(const MhcArgs& a, cudaStream_t stream);
// The one-block-a-row kernel, whatever the rows (mhc_pre picks; the tests compare the two).
void mhc_pre_one_block(const MhcArgs& a, cudaStream_t stream);

}  // namespace ferry::gpu
