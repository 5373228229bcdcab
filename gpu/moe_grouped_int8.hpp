#pragma once
// The grouped expert GEMMs of gpu/moe_grouped.hpp for Q4_K, Q5_K and IQ3_S weights on int8 tensor
// cores (sm80+), with the decode matvec's numerics (gpu/matvec_int16.cu): the input rows are
// quantized once to int16 (one step per 32 values, amax / 32767, and each block's f32 sum for the
// minimum terms; gpu/x_int16.cuh), each int16 taken as an s8 high and a u8 low byte, and the weights
// (Q4_K's nibbles, u8 as they lie in their bytes; Q5_K's with their fifth bit; IQ3_S's signed grid
// values, decoded into shared memory) multiply both halves by mma.sync m16n8k32 with exact int32
// sums, one 32-column sub-block a step; the sub-block's d * scale, the block's step and (K-quants)
// dmin * min are then applied in f32. Only the f32 order of those terms differs from the decode
// kernel's, so a prefill row gets the product a decode step would (the fp16 kernel keeps ~22 bits of
// each input instead).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "gpu/moe_grouped.hpp"

namespace ferry::gpu {

// Whether grouped_gemm_int8 takes this call: Q4_K, Q5_K or IQ3_S weights (gate and up of one layout),
// rows of whole 256-blocks, x 16-byte aligned with rows a multiple of 4 floats apart, a split
// scratch whose hi part (16-byte aligned) holds x_rows x cols x 2 bytes and whose lo part the
// per-block steps and sums, and a device whose code for the kernel is sm80+ (not the Volta build,
// nor its PTX JIT-compiled).
bool grouped_int8_takes(const ExpertMatrices& w, const ExpertMatrices* up, const float* x, size_t ldx,
                        uint32_t x_rows, const SplitScratch& split);

// grouped_gemm's products (same arguments and results; up_scratch unused: gate and up share a
// layout) on the int8 path; throws where grouped_int8_takes does not hold.
void grouped_gemm_int8(const ExpertMatrices& w, const ExpertMatrices* up, const float* x, size_t ldx, uint32_t x_rows,
                       const int32_t* gather, const RouteSort& sort, uint32_t routes, uint32_t E, float limit, float* y,
                       size_t ldy, const SplitScratch& split, cudaStream_t stream);

}  // namespace ferry::gpu
