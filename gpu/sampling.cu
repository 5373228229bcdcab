// Token choice on the device.
#include <cfloat>

#include "gpu/cuda_check.hpp"
#include "gpu/kernels.hpp"

namespace ferry::gpu {
namespace {

__global__ void argmax_kernel(const float* logits, uint32_t vocab, int32_t* out) {
  __shared__ float sv[32];
  __shared__ int si[32];
  const float* row = logits + static_cast<size_t>(blockIdx.x) * vocab;
  float best = -INFINITY;
  int best_i = 0x7fffffff;
  for (uint32_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float v = row[i];
    if (v > best) {  // strided ascending scan: the first maximum seen is this thread's lowest id
      best = v;
      best_i = static_cast<int>(i);
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
    if (ov > best || (ov == best && oi < best_i)) {
      best = ov;
      best_i = oi;
    }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sv[warp] = best;
    si[warp] = best_i;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) {
      if (sv[w] > best || (sv[w] == best && si[w] < best_i)) {
        best = sv[w];
        best_i = si[w];
      }
    }
    out[blockIdx.x] = best_i == 0x7fffffff ? 0 : best_i;  // an all-NaN row: token 0
  }
}

}  // namespace

void argmax_rows(const float* logits, uint32_t rows, uint32_t vocab, int32_t* out, cudaStream_t stream) {
  if (rows == 0) return;
  argmax_kernel<<<rows, 1024, 0, stream>>>(logits, vocab, out);
  FERRY_CUDA_LAUNCHED();
}

}  // namespace ferry::gpu
