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
// The depth of the ring of weights in shared memory (items a warp has in flight, plus the one it
// multiplies) that launch_matvec_mma(a, stream, stages) takes: `stages` (2 to 4) where it fits, for
// 0 FERRY_MATVEC_STAGES where set, else the deepest at which two blocks share an SM; 0: the call
// does not apply or that depth does not fit. The outputs are the same bits at every depth.
uint32_t matvec_mma_stages(const MatvecArgs& a, uint32_t stages = 0);
// Launches it; throws CudaError where matvec_mma_stages(a, stages) is 0.
void launch_matvec_mma(const MatvecArgs& a, cudaStream_t stream, uint32_t stages = 0);

}  // namespace ferry::gpu
