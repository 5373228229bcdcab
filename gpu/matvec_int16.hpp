#pragma once
// The int16-activation matvec path (gpu/matvec_int16.cu), chosen by matvec() in gpu/matvec.cu.
#include "gpu/kernels.hpp"

namespace ferry::gpu {

// iq3s_grid: the device copy of model::kIq3sGrid (read by IQ3_S weights only). Runs the tensor-core
// kernel (gpu/matvec_mma.hpp) where it applies, else the dp2a kernel.
void launch_matvec_int16(const MatvecArgs& a, const uint32_t* iq3s_grid, cudaStream_t stream);
// The dp2a kernel alone (the Volta build's path; the tests' reference for the tensor-core kernel).
void launch_matvec_dp2a(const MatvecArgs& a, const uint32_t* iq3s_grid, cudaStream_t stream);

}  // namespace ferry::gpu
