#pragma once
// The decode matvec on int8 tensor cores (gpu/matvec_mma.cu, issue 15): the int16 path's products
// (gpu/matvec_int16.cu) with the same int16 activations and the same integer sums, multiplied by
// mma.sync instead of dp2a. launch_matvec_int16 takes it where it applies.
#include "gpu/kernels.hpp"

namespace ferry::gpu {

// Whether the tensor-core kernel takes calls of this weight type on the current device: Q4_K and
// Q5_K where its code was built for sm80+ (not the Volta build).
bool matvec_mma_takes(model::GgmlType type);
// Whether this call runs on it: a call of such a type, one row format a launch, that takes the int16
// path (matvec_quantizes_activations) with at most 8 tokens whose shared memory fits.
bool matvec_mma_applies(const MatvecArgs& a);
// Launches it; throws CudaError where matvec_mma_applies does not hold.
void launch_matvec_mma(const MatvecArgs& a, cudaStream_t stream);

}  // namespace ferry::gpu
