#pragma once
// The int16-activation matvec path (gpu/matvec_int16.cu), chosen by matvec() in gpu/matvec.cu.
#include "gpu/kernels.hpp"

namespace ferry::gpu {

// iq3s_grid: the device copy of model::kIq3sGrid (read by IQ3_S weights only).
void launch_matvec_int16(const MatvecArgs& a, const uint32_t* iq3s_grid, cudaStream_t stream);

}  // namespace ferry::gpu
