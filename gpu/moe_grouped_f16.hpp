#pragma once
// The grouped expert GEMMs of gpu/moe_grouped.hpp for Q4_K and Q5_K weights on fp16 tensor cores
// over exact integer weights (sm80+): each sub-block's integer scale times its quants (Q4_K <= 945,
// Q5_K <= 1,953) is an exact fp16 integer, so a 256-column block's eight sub-blocks accumulate
// inside mma.sync m16n8k16 with f32 sums, and d, dmin and the minimum terms cost f32 work once a
// block or k-tile instead of once a sub-block. The inputs are the decode matvec's int16 values
// (gpu/x_int16.cuh: a step per 32, amax / 32767) times their step, as fp16 high and low parts (~22
// bits) under a power of two per row, so a prefill row gets the decode product to ~2^-22 of each
// term.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "gpu/moe_grouped.hpp"

namespace ferry::gpu {

bool grouped_f16_takes(const ExpertMatrices& w, const ExpertMatrices* up, const float* x, size_t ldx,
                       uint32_t x_rows, const SplitScratch& split);

void grouped_gemm_f16(const ExpertMatrices& w, const ExpertMatrices* up, const float* x, size_t ldx, uint32_t x_rows,
                      const int32_t* gather, const RouteSort& sort, uint32_t routes, uint32_t E, float limit, float* y,
                      size_t ldy, const SplitScratch& split, cudaStream_t stream);

}  // namespace ferry::gpu
