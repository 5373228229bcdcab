#pragma once
// The grouped expert GEMMs of gpu/moe_grouped.hpp for Q4_K, Q5_K and IQ3_S weights on Hopper's fp16
// warpgroup MMA (wgmma, sm_90a) over exact integer weights: each sub-block's integer scale times its
// quants (Q4_K <= 945, Q5_K <= 1,953, IQ3_S <= 465) is an exact fp16 integer, so a 256-column block's
// eight sub-blocks accumulate inside the products with f32 sums, and d, dmin and the minimum terms
// cost f32 work once a block instead of once a sub-block (the int8 kernel's floor: PERF.md, h53, h63,
// h81, h93). The inputs are the decode matvec's int16 values (gpu/x_int16.cuh: a step per 32, amax /
// 32767) times their step, as fp16 high and low parts (~22 bits) under a power of two per row, so a
// prefill row gets the decode product to ~2^-22 of each term, as the int8 kernel's does to its f32
// order (the same tests' bounds).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "gpu/moe_grouped.hpp"

namespace ferry::gpu {

// Whether grouped_gemm_f16 takes this call: grouped_int8_takes's conditions, a split scratch of
// grouped_split_elems(x_rows, cols), and a device of compute capability 9.0 (the sm_90a code loads
// there alone).
bool grouped_f16_takes(const ExpertMatrices& w, const ExpertMatrices* up, const float* x, size_t ldx,
                       uint32_t x_rows, const SplitScratch& split);

// grouped_gemm's products (same arguments and results) on the wgmma path; throws where
// grouped_f16_takes does not hold.
void grouped_gemm_f16(const ExpertMatrices& w, const ExpertMatrices* up, const float* x, size_t ldx, uint32_t x_rows,
                      const int32_t* gather, const RouteSort& sort, uint32_t routes, uint32_t E, float limit, float* y,
                      size_t ldy, const SplitScratch& split, cudaStream_t stream);

}  // namespace ferry::gpu
