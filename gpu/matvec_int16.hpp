#pragma once
// The int16-activation matvec path (gpu/matvec_int16.cu), chosen by matvec() in gpu/matvec.cu.
#include "gpu/kernels.hpp"

namespace ferry::gpu {

void launch_matvec_int16(const MatvecArgs& a, cudaStream_t stream);

}  // namespace ferry::gpu
