// The strided-batched cuBLAS entry points the per-head prefill products use (LayerRunner::mm_grouped):
// each batch's product against a plain CPU loop, with operands and outputs interleaved the way the
// heads are (a batch's inputs and outputs a column block of wider rows).
#if FERRY_HAVE_CUDA
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "gpu/cuda_blas.hpp"
#include "gpu/cuda_check.hpp"
#include "tests/gpu/gpu_test_support.hpp"

namespace ferry::gpu {
namespace {

constexpr int kM = 24, kN = 19, kK = 40, kBatches = 5;
// y[t][b*kM + i] = sum_c W_b[i][c] x[t][b*kK + c]: W_b rows of kK, batch b's weights kM rows further on.
std::vector<float> reference(const std::vector<float>& w, const std::vector<float>& x) {
  std::vector<float> y(size_t{kN} * kBatches * kM);
  for (size_t b = 0; b < kBatches; ++b) {
    for (size_t t = 0; t < kN; ++t) {
      for (size_t i = 0; i < kM; ++i) {
        double s = 0.0;
        for (size_t c = 0; c < kK; ++c) s += double{w[(b * kM + i) * kK + c]} * x[(t * kBatches + b) * kK + c];
        y[(t * kBatches + b) * kM + i] = static_cast<float>(s);
      }
    }
  }
  return y;
}

template <class E>
E* upload(const std::vector<E>& v) {
  E* d = nullptr;
  FERRY_CUDA(cudaMalloc(reinterpret_cast<void**>(&d), v.size() * sizeof(E)));
  FERRY_CUDA(cudaMemcpy(d, v.data(), v.size() * sizeof(E), cudaMemcpyHostToDevice));
  return d;
}

TEST(BlasStrided, BatchesOfPerHeadProductsMatchACpuLoop) {
  if (!testing::have_device()) GTEST_SKIP() << "no CUDA device";
  const blas::Api& api = blas::api();
  ASSERT_NE(api.sgemm_strided, nullptr);
  ASSERT_NE(api.gemm_strided_ex, nullptr);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  // Values exact in fp16 so the half product has nothing to round but its f32 sums.
  auto half_exact = [&] { return std::round(u(rng) * 64.0f) / 64.0f; };
  std::vector<float> w(size_t{kBatches} * kM * kK), x(size_t{kN} * kBatches * kK);
  for (float& v : w) v = half_exact();
  for (float& v : x) v = half_exact();
  const std::vector<float> want = reference(w, x);
  std::vector<__half> wh(w.size()), xh(x.size());
  for (size_t i = 0; i < w.size(); ++i) wh[i] = __float2half(w[i]);
  for (size_t i = 0; i < x.size(); ++i) xh[i] = __float2half(x[i]);
  float* dw = upload(w);
  float* dx = upload(x);
  __half* dwh = upload(wh);
  __half* dxh = upload(xh);
  float* dy = nullptr;
  FERRY_CUDA(cudaMalloc(reinterpret_cast<void**>(&dy), want.size() * sizeof(float)));
  blas::Handle h = nullptr;
  FERRY_CUBLAS(api.create(&h));
  const float one = 1.0f, zero = 0.0f;
  for (const bool half : {false, true}) {
    FERRY_CUDA(cudaMemset(dy, 0xff, want.size() * sizeof(float)));
    if (half) {
      FERRY_CUBLAS(api.gemm_strided_ex(h, blas::op_t, blas::op_n, kM, kN, kK, &one, dwh, CUDA_R_16F, kK,
                                       static_cast<long long>(kM) * kK, dxh, CUDA_R_16F, kBatches * kK, kK, &zero, dy, CUDA_R_32F,
                                       kBatches * kM, kM, kBatches, blas::compute_32f, blas::gemm_default));
    } else {
      FERRY_CUBLAS(api.sgemm_strided(h, blas::op_t, blas::op_n, kM, kN, kK, &one, dw, kK, static_cast<long long>(kM) * kK, dx,
                                     kBatches * kK, kK, &zero, dy, kBatches * kM, kM, kBatches));
    }
    std::vector<float> got(want.size());
    FERRY_CUDA(cudaMemcpy(got.data(), dy, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-4f * (1.0f + std::fabs(want[i]))) << (half ? "fp16" : "f32") << " at " << i;
    }
  }
  FERRY_CUBLAS(api.destroy(h));
  for (void* p : {static_cast<void*>(dw), static_cast<void*>(dx), static_cast<void*>(dwh), static_cast<void*>(dxh),
                  static_cast<void*>(dy)}) {
    FERRY_CUDA(cudaFree(p));
  }
}

}  // namespace
}  // namespace ferry::gpu
#endif
