#pragma once
// The matvec for f32 matrices of few long rows (gpu/matvec_wide.cu), chosen by matvec() in gpu/matvec.cu.
#include "gpu/kernels.hpp"

namespace ferry::gpu {

inline constexpr uint32_t kMinWideCols = 2048;

// f32 weights (by offset, not pointer tables) and activations 16-byte aligned, rows of at least kMinWideCols, fewer (row, group)
// pairs than the device has SMs, one part, no SwiGLU input.
bool matvec_wide_applies(const MatvecArgs& a, int sm_count);
void launch_matvec_wide(const MatvecArgs& a, cudaStream_t stream);

}  // namespace ferry::gpu
