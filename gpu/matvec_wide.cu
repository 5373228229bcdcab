// f32 matrices of few, long rows (the mHC mixers: 24 rows of H * D = 16,384 at the GLM shape): one
// 1024-thread block per row with every load of a thread in flight at once. The general kernel
// (matvec.cu) gives such a matrix 8 warps a row with two units a lane in flight, so each of the few
// SMs it occupies waits on ~8 round trips to memory; here it is one or two.
#include <cuda_runtime.h>

#include "gpu/block_reduce.cuh"
#include "gpu/cuda_check.hpp"
#include "gpu/matvec_part.cuh"
#include "gpu/matvec_wide.hpp"

namespace ferry::gpu {
namespace {

constexpr int kThreads = 1024;

template <int NT>
__global__ void __launch_bounds__(kThreads) wide_kernel(MatvecArgs a) {
  __shared__ float scratch[32];
  const uint32_t row = blockIdx.x, g = blockIdx.y;
  const MatvecPartView view = matvec_part_view(a, g);
  const float4* w = reinterpret_cast<const float4*>(view.w + static_cast<size_t>(row) * a.w.row_bytes);
  const float* x = view.x;
  const uint32_t n4 = a.w.cols / 4, ntok = a.tokens;
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
#pragma unroll 4
  for (uint32_t i = threadIdx.x; i < n4; i += kThreads) {
    const float4 wv = __ldg(w + i);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t < static_cast<int>(ntok)) {
        const float4 xv = __ldg(reinterpret_cast<const float4*>(x + t * a.x_tok_stride) + i);
        acc[t] += wv.x * xv.x + wv.y * xv.y + wv.z * xv.z + wv.w * xv.w;
      }
    }
  }
  float* y = a.y + static_cast<size_t>(g) * a.y_group_stride + row;
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    if (t >= static_cast<int>(ntok)) break;  // ntok is uniform: every thread leaves together
    const float s = block_sum(acc[t], scratch);
    if (threadIdx.x == 0) y[t * a.y_tok_stride] = s;
  }
}

}  // namespace

bool matvec_wide_applies(const MatvecArgs& a, int sm_count) {
  const bool aligned = reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && a.x_tok_stride % 4 == 0 &&
                       a.x_group_stride % 4 == 0 && a.w.row_bytes % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(a.w.data) % 16 == 0 && a.w_group_bytes % 16 == 0;
  return a.w.type == model::GgmlType::F32 && a.parts == 1 && a.x_up == nullptr && a.w_group_ptrs == nullptr &&
         a.w.cols >= kMinWideCols && a.w.cols % 4 == 0 && aligned &&
         static_cast<uint64_t>(a.w.rows) * a.groups < static_cast<uint64_t>(sm_count) && a.tokens >= 1 &&
         a.tokens <= kMaxMatvecTokens;
}

void launch_matvec_wide(const MatvecArgs& a, cudaStream_t stream) {
  const dim3 grid(a.w.rows, a.groups);
  if (a.tokens <= 1) {
    wide_kernel<1><<<grid, kThreads, 0, stream>>>(a);
  } else if (a.tokens <= 2) {
    wide_kernel<2><<<grid, kThreads, 0, stream>>>(a);
  } else if (a.tokens <= 4) {
    wide_kernel<4><<<grid, kThreads, 0, stream>>>(a);
  } else {
    wide_kernel<8><<<grid, kThreads, 0, stream>>>(a);
  }
  FERRY_CUDA_LAUNCHED();
}

}  // namespace ferry::gpu
