// The few-long-rows f32 matvec (gpu/matvec_wide.cu) against a double-precision CPU dot product at
// matvec_test's f32 tolerance: the mHC mixer's shape (24 rows of 16,384) for every token count
// shape the kernel is built for, and grouped (per-group matrix and input). Outputs are poisoned (NaN).
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "gpu/cuda_memory.hpp"
#include "gpu/kernels.hpp"
#include "gpu/matvec_wide.hpp"
#include "tests/gpu/gpu_test_support.hpp"

namespace ferry::gpu {
namespace {

using ferry::testing::have_device;

void check_wide(uint32_t rows, uint32_t cols, uint32_t groups, uint32_t tokens, std::mt19937& rng) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> w(size_t{groups} * rows * cols), x(size_t{groups} * tokens * cols);
  for (float& v : w) v = n(rng);
  for (float& v : x) v = n(rng);
  const size_t ny = size_t{groups} * tokens * rows;
  DeviceBuffer dw(w.size() * 4), dx(x.size() * 4), dy(ny * 4);
  ASSERT_EQ(cudaMemcpy(dw.get(), w.data(), w.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dx.get(), x.data(), x.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(dy.get(), 0xff, ny * 4), cudaSuccess);
  MatvecArgs a;
  a.w.type = model::GgmlType::F32;
  a.w.data = dw.as<uint8_t>();
  a.w.rows = rows;
  a.w.cols = cols;
  a.w.row_bytes = size_t{cols} * 4;
  a.w_group_bytes = a.w.row_bytes * rows;
  a.x = dx.as<float>();
  a.x_tok_stride = cols;
  a.x_group_stride = size_t{tokens} * cols;
  a.y = dy.as<float>();
  a.y_tok_stride = rows;
  a.y_group_stride = size_t{tokens} * rows;
  a.tokens = tokens;
  a.groups = groups;
  ASSERT_TRUE(matvec_wide_applies(a, current_sm_count())) << rows << " x " << cols << " x " << groups;
  matvec(a, nullptr);
  std::vector<float> y(ny);
  ASSERT_EQ(cudaMemcpy(y.data(), dy.get(), ny * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  for (uint32_t g = 0; g < groups; ++g) {
    for (uint32_t t = 0; t < tokens; ++t) {
      for (uint32_t r = 0; r < rows; ++r) {
        const float* wr = &w[(size_t{g} * rows + r) * cols];
        const float* xt = &x[(size_t{g} * tokens + t) * cols];
        double ref = 0, mag = 0;
        for (uint32_t c = 0; c < cols; ++c) {
          ref += double(wr[c]) * xt[c];
          mag += std::abs(double(wr[c]) * xt[c]);
        }
        ASSERT_NEAR(y[(size_t{g} * tokens + t) * rows + r], ref, 1e-5 * mag + 1e-6)
            << "group " << g << " token " << t << " row " << r << " of " << tokens;
      }
    }
  }
}

TEST(MatvecWide, MixerShapeMatchesTheCpuForEveryTokenCount) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(2026);
  for (uint32_t tokens = 1; tokens <= kMaxMatvecTokens; ++tokens) check_wide(24, 16384, 1, tokens, rng);
}

TEST(MatvecWide, GroupsAndRowsNotAMultipleOfTheBlock) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(7);
  check_wide(5, 2048 + 4, 3, 2, rng);  // 513 float4 a row: one thread takes a second
  check_wide(1, 6000, 1, 1, rng);
}

TEST(MatvecWide, NotForManyRowsOrOtherTypes) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  MatvecArgs a;
  a.w.type = model::GgmlType::F32;
  a.w.cols = 16384;
  a.w.row_bytes = 16384 * 4;
  a.w.rows = static_cast<uint32_t>(current_sm_count());
  EXPECT_FALSE(matvec_wide_applies(a, current_sm_count()));
  a.w.rows = 24;
  EXPECT_TRUE(matvec_wide_applies(a, current_sm_count()));
  a.w.cols = kMinWideCols - 4;
  EXPECT_FALSE(matvec_wide_applies(a, current_sm_count()));
  a.w.cols = 16384;
  a.w.type = model::GgmlType::Q8_0;
  EXPECT_FALSE(matvec_wide_applies(a, current_sm_count()));
}

}  // namespace
}  // namespace ferry::gpu
#endif
