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

// TEMPORARY (h92 round 1): a timeline of the launches writing y0 / y1 into buf (2 x 1024 blocks x 8
// u64) under FERRY_MMA_AB's trace bit, and an empty PDL kernel of the matvec's block shape.
void matvec_mma_trace(unsigned long long* buf, const float* y0, const float* y1);
void empty_launch(uint32_t blocks, size_t smem, int reads, const float* x, float* y, cudaStream_t stream);

}  // namespace ferry::gpu
