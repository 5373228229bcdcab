// The cluster mhc_pre for decode rows (gpu/mhc_decode.cu) against the one-block kernel and the CPU's
// mixer (model/cpu/mhc.cpp): random streams and mixer weights at GLM's shape (H = 4, D = 4,096) and at
// widths whose slices do not fill a warp or the cluster evenly. Outputs are poisoned (NaN) first.
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "gpu/cuda_memory.hpp"
#include "gpu/kernels.hpp"
#include "gpu/mhc_decode.hpp"
#include "model/cpu/mhc.hpp"
#include "tests/gpu/gpu_test_support.hpp"

namespace ferry::gpu {
namespace {

using ferry::testing::have_device;

constexpr uint32_t kH = 4, kMix = (2 + kH) * kH;

struct MhcCase {
  uint32_t rows, D;
  std::vector<float> streams, mix, base, scale, norm_w;
  DeviceBuffer d_streams, d_mix, d_base, d_scale, d_norm, d_x, d_post, d_comb;

  MhcCase(uint32_t rows_, uint32_t D_, std::mt19937& rng)
      : rows(rows_), D(D_), streams(size_t{rows_} * kH * D_), mix(size_t{rows_} * kMix), base(kMix), scale(3),
        norm_w(D_), d_streams(streams.size() * 4), d_mix(mix.size() * 4), d_base(kMix * 4), d_scale(12),
        d_norm(size_t{D_} * 4), d_x(size_t{rows_} * D_ * 4), d_post(size_t{rows_} * kH * 4),
        d_comb(size_t{rows_} * kH * kH * 4) {
    std::normal_distribution<float> n(0.0f, 1.0f);
    std::uniform_real_distribution<float> u(0.5f, 1.5f);
    for (float& v : streams) v = n(rng);
    // The mixing logits as the model makes them: fn @ streams (before the 1/rms), fn ~ N(0, 1/(H D)):
    // logits of order 1, the softmax and the sigmoids away from saturation.
    const float fs = 1.0f / std::sqrt(static_cast<float>(kH * D));
    std::vector<float> fn(size_t{kMix} * kH * D);
    for (float& v : fn) v = n(rng) * fs;
    for (uint32_t r = 0; r < rows; ++r) {
      for (uint32_t i = 0; i < kMix; ++i) {
        double s = 0;
        for (size_t c = 0; c < size_t{kH} * D; ++c) s += double(fn[i * kH * D + c]) * streams[r * kH * D + c];
        mix[r * kMix + i] = static_cast<float>(s);
      }
    }
    for (float& v : base) v = n(rng);
    scale = {0.6f, 0.8f, 1.7f};
    for (float& v : norm_w) v = u(rng);
    auto up = [](DeviceBuffer& d, const std::vector<float>& h) {
      return cudaMemcpy(d.get(), h.data(), h.size() * 4, cudaMemcpyHostToDevice);
    };
    if (up(d_streams, streams) != cudaSuccess || up(d_mix, mix) != cudaSuccess || up(d_base, base) != cudaSuccess ||
        up(d_scale, scale) != cudaSuccess || up(d_norm, norm_w) != cudaSuccess) {
      ADD_FAILURE() << "upload";
    }
  }

  MhcArgs args() {
    MhcArgs a;
    a.streams = d_streams.as<float>();
    a.mix = d_mix.as<float>();
    a.base = d_base.as<float>();
    a.scale = d_scale.as<float>();
    a.norm_w = d_norm.as<float>();
    a.rows = rows;
    a.H = kH;
    a.D = D;
    a.iters = 20;
    a.x = d_x.as<float>();
    a.post = d_post.as<float>();
    a.comb = d_comb.as<float>();
    return a;
  }

  struct Out {
    std::vector<float> x, post, comb;
  };
  void poison() {
    cudaMemset(d_x.get(), 0xff, size_t{rows} * D * 4);
    cudaMemset(d_post.get(), 0xff, size_t{rows} * kH * 4);
    cudaMemset(d_comb.get(), 0xff, size_t{rows} * kH * kH * 4);
  }
  Out read() {
    Out o{std::vector<float>(size_t{rows} * D), std::vector<float>(size_t{rows} * kH),
          std::vector<float>(size_t{rows} * kH * kH)};
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(o.x.data(), d_x.get(), o.x.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(o.post.data(), d_post.get(), o.post.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(o.comb.data(), d_comb.get(), o.comb.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    return o;
  }

  // The CPU's mixer on the same logits: 1/rms in f64, model::mhc_coefficients, the collapse and its
  // RMSNorm in f64.
  Out cpu() const {
    Out o{std::vector<float>(size_t{rows} * D), std::vector<float>(size_t{rows} * kH),
          std::vector<float>(size_t{rows} * kH * kH)};
    model::MhcConfig c;
    c.streams = kH;
    for (uint32_t r = 0; r < rows; ++r) {
      const float* R = &streams[size_t{r} * kH * D];
      double ss = 0;
      for (size_t i = 0; i < size_t{kH} * D; ++i) ss += double(R[i]) * R[i];
      const float inv = static_cast<float>(1.0 / std::sqrt(ss / (double(kH) * D) + 1e-5));
      float m[kMix], pre[kH];
      for (uint32_t i = 0; i < kMix; ++i) m[i] = mix[r * kMix + i] * inv;
      model::mhc_coefficients(c, m, base.data(), scale.data(), pre, &o.post[r * kH], &o.comb[r * kH * kH]);
      std::vector<double> u(D);
      double su = 0;
      for (uint32_t d = 0; d < D; ++d) {
        for (uint32_t h = 0; h < kH; ++h) u[d] += double(pre[h]) * R[h * D + d];
        su += u[d] * u[d];
      }
      const double inv_u = 1.0 / std::sqrt(su / D + 1e-5);
      for (uint32_t d = 0; d < D; ++d) o.x[size_t{r} * D + d] = static_cast<float>(u[d] * inv_u * norm_w[d]);
    }
    return o;
  }
};

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tol * (1.0 + std::abs(want[i]))) << what << " [" << i << "] of " << got.size();
  }
}

// Launches the cluster kernel; false (the test skips) where the build or the device has no clusters.
bool clustered(MhcCase& c) {
  c.poison();
  return mhc_pre_clustered(c.args(), nullptr);
}

void check_case(uint32_t rows, uint32_t D, std::mt19937& rng) {
  MhcCase c(rows, D, rng);
  c.poison();
  mhc_pre_one_block(c.args(), nullptr);
  const MhcCase::Out one = c.read();
  if (!clustered(c)) GTEST_SKIP() << "the kernels were not built for sm90+ or the device has no clusters";
  const MhcCase::Out cl = c.read();
  const MhcCase::Out ref = c.cpu();
  SCOPED_TRACE("rows " + std::to_string(rows) + " D " + std::to_string(D));
  // The coefficients differ from the one-block kernel's only through the 1/rms's rounding.
  expect_close(cl.post, one.post, 1e-6, "post vs one block");
  expect_close(cl.comb, one.comb, 1e-6, "comb vs one block");
  expect_close(cl.x, one.x, 1e-5, "x vs one block");
  expect_close(cl.post, ref.post, 1e-5, "post vs cpu");
  expect_close(cl.comb, ref.comb, 1e-5, "comb vs cpu");
  expect_close(cl.x, ref.x, 1e-4, "x vs cpu");
  ASSERT_TRUE(clustered(c));
  const MhcCase::Out again = c.read();
  EXPECT_EQ(std::memcmp(again.x.data(), cl.x.data(), cl.x.size() * 4), 0) << "not deterministic";
  EXPECT_EQ(std::memcmp(again.comb.data(), cl.comb.data(), cl.comb.size() * 4), 0) << "not deterministic";
}

TEST(MhcDecode, GlmShapeMatchesTheOneBlockKernelAndTheCpu) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(15);
  for (uint32_t rows : {1u, 2u, 3u, 8u}) check_case(rows, 4096, rng);
}

TEST(MhcDecode, WidthsThatDoNotFillTheSlices) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(23);
  check_case(2, 4100, rng);  // 1,025 float4: 129 a block, the last block's slice short
  check_case(3, 64, rng);    // 2 float4 a block: one warp, mostly idle
  check_case(1, 32768, rng); // 1,024 threads a block
}

TEST(MhcDecode, OtherShapesAreLeftToTheOneBlockKernel) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(5);
  MhcCase c(1, 64, rng);
  MhcArgs a = c.args();
  a.H = 2;
  EXPECT_FALSE(mhc_pre_clustered(a, nullptr));
  a = c.args();
  a.D = 66;
  EXPECT_FALSE(mhc_pre_clustered(a, nullptr));
  a = c.args();
  a.D = 32772;  // 1,025 float4 a block: more than a block's threads
  EXPECT_FALSE(mhc_pre_clustered(a, nullptr));
}

// Event-timed medians of both kernels at the decode shape (printed, not asserted).
TEST(MhcDecode, TimingLine) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(1);
  for (uint32_t rows : {1u, 3u}) {
    MhcCase c(rows, 4096, rng);
    if (!clustered(c)) GTEST_SKIP() << "no cluster kernel";
    auto median_us = [&](bool cluster) {
      cudaEvent_t e0, e1;
      cudaEventCreate(&e0);
      cudaEventCreate(&e1);
      std::vector<float> t;
      for (int i = 0; i < 30; ++i) {
        cudaEventRecord(e0);
        if (cluster) {
          mhc_pre_clustered(c.args(), nullptr);
        } else {
          mhc_pre_one_block(c.args(), nullptr);
        }
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        t.push_back(ms * 1000.0f);
      }
      cudaEventDestroy(e0);
      cudaEventDestroy(e1);
      std::sort(t.begin(), t.end());
      return t[t.size() / 2];
    };
    const float one = median_us(false), cl = median_us(true);
    std::printf("[ timing ] mhc_pre rows %u D 4096 H 4: one block a row %.1f us, cluster of 8 %.1f us\n", rows, one,
                cl);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }
}

}  // namespace
}  // namespace ferry::gpu
#endif
