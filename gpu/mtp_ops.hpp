#pragma once
// The few element-wise ops the MTP block needs beside the layer kernels (gpu/mtp_ops.cu).
#include <cuda_runtime_api.h>

#include <cstddef>

namespace ferry::gpu {

// x[i] += y[i] for i < n: the MTP block's plain residual adds (its layer has no mHC mixers).
void add_in_place(float* x, const float* y, size_t n, cudaStream_t stream);

}  // namespace ferry::gpu
