#pragma once
// The decode matvec on int8 tensor cores (gpu/matvec_mma.cu, issue 15): the int16 path's products
// (gpu/matvec_int16.cu) with the same int16 activations and the same integer sums, multiplied by
// mma.sync instead of dp2a. launch_matvec_int16 takes it where it applies.
#include "gpu/kernels.hpp"

namespace ferry::gpu {

// Whether this call runs on the tensor-core kernel: a Q4_K call that takes the int16 path
// (matvec_quantizes_activations) on a device whose code of the kernel was built for sm80+ (not the
// Volta build).
bool matvec_mma_applies(const MatvecArgs& a);
// Launches it; throws CudaError where matvec_mma_applies does not hold.
void launch_matvec_mma(const MatvecArgs& a, cudaStream_t stream);

}  // namespace ferry::gpu
