// The activations' side of the prefill products' e4m3 corrections (LayerRunner::mm_staged): an input's fp16
// split, however it was staged (float_to_half or a producer that writes it), read again and written as e4m3.
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <string>

#include "gpu/block_reduce.cuh"
#include "gpu/cuda_check.hpp"
#include "gpu/half_split.cuh"
#include "gpu/kernels.hpp"

namespace ferry::gpu {
namespace {

constexpr int kThreads = 256;

// Grid-stride launches: 4,096 blocks for the conversion, 1,024 (an H200's 132 SMs x 8) for the largest |value|,
// whose blocks each end in an atomic on one word.
unsigned blocks_for(size_t items, size_t cap) {
  return static_cast<unsigned>(std::min<size_t>((items + kThreads - 1) / kThreads, cap));
}

// The largest |hi| over rows of `vpr` vectors of 8 (at src + r * ld + cols): lo parts are bounded by twice it,
// which e4m3_scale leaves room for.
__global__ void __launch_bounds__(kThreads)
    hi_amax_kernel(const __half* __restrict__ src, uint32_t ld, uint32_t cols, uint32_t vpr, uint32_t total,
                   uint32_t* amax) {
  float m = 0.0f;
  for (uint32_t i = blockIdx.x * kThreads + threadIdx.x; i < total; i += gridDim.x * kThreads) {
    const uint32_t r = i / vpr, c = (i - r * vpr) * 8;
    const uint4 w = __ldg(reinterpret_cast<const uint4*>(src + r * ld + cols + c));
    const __half2* h = reinterpret_cast<const __half2*>(&w);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 f = __half22float2(h[k]);
      m = fmaxf(m, fmaxf(fabsf(f.x), fabsf(f.y)));
    }
  }
  __shared__ float scratch[32];
  m = block_max(m, scratch);  // one atomic a block: on one word they serialise
  if (threadIdx.x == 0) atomicMax(amax, __float_as_uint(m));
}

// Each vector of 8: its lo and hi halves read, written as e4m3 lo at dst + r * 2 cols + c, hi cols further.
__global__ void __launch_bounds__(kThreads)
    split_to_e4m3_kernel(const __half* __restrict__ src, uint32_t ld, uint32_t cols, uint32_t vpr, uint32_t total,
                         uint8_t* __restrict__ dst, const uint32_t* amax, float* descale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  const float s = e4m3_scale(*amax);
  if (blockIdx.x == 0 && threadIdx.x == 0) *descale = 1.0f / s;
  for (uint32_t i = blockIdx.x * kThreads + threadIdx.x; i < total; i += gridDim.x * kThreads) {
    const uint32_t r = i / vpr, c = (i - r * vpr) * 8;
    const __half* row = src + r * ld;
    const uint4 lw = __ldg(reinterpret_cast<const uint4*>(row + c));
    const uint4 hw = __ldg(reinterpret_cast<const uint4*>(row + cols + c));
    float lo[8], hi[8];
    const __half2* l2 = reinterpret_cast<const __half2*>(&lw);
    const __half2* h2 = reinterpret_cast<const __half2*>(&hw);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 a = __half22float2(l2[k]), b = __half22float2(h2[k]);
      lo[2 * k] = a.x, lo[2 * k + 1] = a.y, hi[2 * k] = b.x, hi[2 * k + 1] = b.y;
    }
    uint8_t* out = dst + r * 2 * cols;
    *reinterpret_cast<uint2*>(out + c) = e4m3x8(lo, s);
    *reinterpret_cast<uint2*>(out + cols + c) = e4m3x8(hi, s);
  }
#else
  (void)src, (void)ld, (void)cols, (void)vpr, (void)total, (void)dst, (void)amax, (void)descale;
  __trap();  // launched only where it was built for sm89+ (e4m3_split_ready)
#endif
}

}  // namespace

bool e4m3_split_ready() {
  static std::atomic<int> known[64];  // per device: 0 not asked yet, 1 no, 2 yes
  int dev = 0;
  FERRY_CUDA(cudaGetDevice(&dev));
  std::atomic<int>& k = known[dev & 63];
  if (k.load(std::memory_order_relaxed) == 0) {
    int major = 0, minor = 0;
    FERRY_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    FERRY_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    cudaFuncAttributes fa{};
    FERRY_CUDA(cudaFuncGetAttributes(&fa, split_to_e4m3_kernel));
    k.store(10 * major + minor >= 89 && fa.ptxVersion >= 89 ? 2 : 1, std::memory_order_relaxed);
  }
  return k.load(std::memory_order_relaxed) == 2;
}

void half_split_to_e4m3(const void* src, size_t ld, size_t rows, size_t cols, void* dst, uint32_t* amax, float* descale,
                        cudaStream_t stream) {
  if (rows * cols == 0) return;
  if (cols % 8 != 0 || ld % 8 != 0 || rows * ld >= (size_t{1} << 31) || rows * 2 * cols >= (size_t{1} << 31)) {
    throw CudaError("half_split_to_e4m3: rows of " + std::to_string(cols) + " values " + std::to_string(ld) +
                    " apart do not fit its kernels");
  }
  const __half* s = static_cast<const __half*>(src);
  const uint32_t vpr = static_cast<uint32_t>(cols / 8), total = static_cast<uint32_t>(rows * vpr);
  FERRY_CUDA(cudaMemsetAsync(amax, 0, sizeof(uint32_t), stream));
  hi_amax_kernel<<<blocks_for(total, 1024), kThreads, 0, stream>>>(s, static_cast<uint32_t>(ld), static_cast<uint32_t>(cols),
                                                             vpr, total, amax);
  split_to_e4m3_kernel<<<blocks_for(total, 4096), kThreads, 0, stream>>>(s, static_cast<uint32_t>(ld),
                                                                   static_cast<uint32_t>(cols), vpr, total,
                                                                   static_cast<uint8_t*>(dst), amax, descale);
  FERRY_CUDA_LAUNCHED();
}

}  // namespace ferry::gpu
