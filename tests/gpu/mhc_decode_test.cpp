// The cluster mhc_pre for decode rows (gpu/mhc_decode.cu) against the one-block kernel and the CPU's
// mixer (model/cpu/mhc.cpp), alone and with the post before it and the mixer product in the same
// launch: random streams and mixer weights at GLM's shape (H = 4, D = 4,096) and at widths whose
// slices do not fill a warp or the cluster evenly. Outputs are poisoned (NaN) first.
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "gpu/cuda_memory.hpp"
#include "gpu/kernels.hpp"
#include "gpu/mhc_decode.hpp"
#include "gpu/pdl.hpp"
#include "model/cpu/mhc.hpp"
#include "tests/gpu/gpu_test_support.hpp"

namespace ferry::gpu {
namespace {

using ferry::testing::have_device;

constexpr uint32_t kH = 4, kMix = (2 + kH) * kH;

struct MhcCase {
  uint32_t rows, D;
  std::vector<float> streams, mix, base, scale, norm_w, fn;
  DeviceBuffer d_streams, d_mix, d_base, d_scale, d_norm, d_x, d_post, d_comb, d_fn;

  MhcCase(uint32_t rows_, uint32_t D_, std::mt19937& rng)
      : rows(rows_), D(D_), streams(size_t{rows_} * kH * D_), mix(size_t{rows_} * kMix), base(kMix), scale(3),
        norm_w(D_), fn(size_t{kMix} * kH * D_), d_streams(streams.size() * 4), d_mix(mix.size() * 4),
        d_base(kMix * 4), d_scale(12), d_norm(size_t{D_} * 4), d_x(size_t{rows_} * D_ * 4),
        d_post(size_t{rows_} * kH * 4), d_comb(size_t{rows_} * kH * kH * 4), d_fn(fn.size() * 4) {
    std::normal_distribution<float> n(0.0f, 1.0f);
    std::uniform_real_distribution<float> u(0.5f, 1.5f);
    for (float& v : streams) v = n(rng);
    // fn ~ N(0, 1/(H D)): logits of order 1, the softmax and the sigmoids away from saturation.
    const float fs = 1.0f / std::sqrt(static_cast<float>(kH * D));
    for (float& v : fn) v = n(rng) * fs;
    make_mix();
    for (float& v : base) v = n(rng);
    scale = {0.6f, 0.8f, 1.7f};
    for (float& v : norm_w) v = u(rng);
    if (up(d_streams, streams) != cudaSuccess || up(d_mix, mix) != cudaSuccess || up(d_base, base) != cudaSuccess ||
        up(d_scale, scale) != cudaSuccess || up(d_norm, norm_w) != cudaSuccess || up(d_fn, fn) != cudaSuccess) {
      ADD_FAILURE() << "upload";
    }
  }
  static cudaError_t up(DeviceBuffer& d, const std::vector<float>& h) {
    return cudaMemcpy(d.get(), h.data(), h.size() * 4, cudaMemcpyHostToDevice);
  }
  // The mixing logits as the model makes them: fn @ streams (before the 1/rms), in f64.
  void make_mix() {
    for (uint32_t r = 0; r < rows; ++r) {
      for (uint32_t i = 0; i < kMix; ++i) {
        double s = 0;
        for (size_t c = 0; c < size_t{kH} * D; ++c) s += double(fn[i * kH * D + c]) * streams[r * kH * D + c];
        mix[r * kMix + i] = static_cast<float>(s);
      }
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
  check_case(1, 8192, rng);  // 256 float4 a block: the most a slice holds
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
  a.D = 8196;  // 257 float4 a block: more than a slice holds
  EXPECT_FALSE(mhc_pre_clustered(a, nullptr));
}

// The site after a post in one launch: the post (in place, over the post / comb buffers the
// launch then overwrites), the mixer product and the pre, against mhc_post's bits for the streams
// and the CPU's mixer on the updated streams; and the first site (no post: the product and the pre).
void check_post_pre(uint32_t rows, uint32_t D, bool with_post, std::mt19937& rng) {
  MhcCase c(rows, D, rng);
  SCOPED_TRACE("rows " + std::to_string(rows) + " D " + std::to_string(D) + (with_post ? " after a post" : ""));
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::uniform_real_distribution<float> u(0.05f, 0.5f);
  std::vector<float> y(size_t{rows} * D), post_in(size_t{rows} * kH), comb_in(size_t{rows} * kH * kH);
  for (float& v : y) v = n(rng);
  for (float& v : post_in) v = 4.0f * u(rng);
  for (float& v : comb_in) v = u(rng);
  DeviceBuffer d_y(y.size() * 4), d_ref(c.streams.size() * 4), d_pin(post_in.size() * 4), d_cin(comb_in.size() * 4);
  ASSERT_EQ(MhcCase::up(d_y, y), cudaSuccess);
  ASSERT_EQ(MhcCase::up(d_ref, c.streams), cudaSuccess);
  ASSERT_EQ(MhcCase::up(d_pin, post_in), cudaSuccess);
  ASSERT_EQ(MhcCase::up(d_cin, comb_in), cudaSuccess);
  if (with_post) {
    mhc_post(d_ref.as<float>(), d_y.as<float>(), d_pin.as<float>(), d_cin.as<float>(), rows, kH, D, nullptr);
  }
  std::vector<float> want_streams(c.streams.size());
  ASSERT_EQ(cudaMemcpy(want_streams.data(), d_ref.get(), want_streams.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  c.poison();
  // The post's inputs in the buffers the site writes its own into, as the layer runner has them.
  ASSERT_EQ(MhcCase::up(c.d_post, post_in), cudaSuccess);
  ASSERT_EQ(MhcCase::up(c.d_comb, comb_in), cudaSuccess);
  DevMatrix fn;
  fn.type = model::GgmlType::F32;
  fn.data = c.d_fn.as<uint8_t>();
  fn.rows = kMix;
  fn.cols = kH * D;
  fn.row_bytes = size_t{fn.cols} * 4;
  MhcPostPre p;
  p.pre = c.args();
  p.pre.mix = nullptr;
  p.fn = &fn;
  p.streams = c.d_streams.as<float>();
  p.y = with_post ? d_y.as<float>() : nullptr;
  p.post_in = c.d_post.as<float>();
  p.comb_in = c.d_comb.as<float>();
  if (!mhc_post_pre(p, nullptr)) GTEST_SKIP() << "the kernels were not built for sm90+ or the device has no clusters";
  const MhcCase::Out got = c.read();
  std::vector<float> got_streams(c.streams.size());
  ASSERT_EQ(cudaMemcpy(got_streams.data(), c.d_streams.get(), got_streams.size() * 4, cudaMemcpyDeviceToHost),
            cudaSuccess);
  ASSERT_EQ(std::memcmp(got_streams.data(), want_streams.data(), got_streams.size() * 4), 0)
      << "the streams are not mhc_post's";
  c.streams = want_streams;
  c.make_mix();
  const MhcCase::Out ref = c.cpu();
  expect_close(got.post, ref.post, 1e-5, "post vs cpu");
  expect_close(got.comb, ref.comb, 1e-5, "comb vs cpu");
  expect_close(got.x, ref.x, 1e-4, "x vs cpu");
}

TEST(MhcDecode, PostThenSiteInOneLaunchMatchesTheSeparateStepsAndTheCpu) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(42);
  for (uint32_t rows : {1u, 3u, 8u}) check_post_pre(rows, 4096, true, rng);
  check_post_pre(2, 4100, true, rng);
  check_post_pre(1, 64, true, rng);
  check_post_pre(2, 8192, true, rng);
}

TEST(MhcDecode, FirstSiteProductAndPreInOneLaunch) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(43);
  check_post_pre(1, 4096, false, rng);
  check_post_pre(3, 4100, false, rng);
}

TEST(MhcDecode, PostThenSiteNeedsAnF32MixerOfTheSiteShape) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(44);
  MhcCase c(1, 64, rng);
  DevMatrix fn;
  fn.type = model::GgmlType::F16;
  fn.data = c.d_fn.as<uint8_t>();
  fn.rows = kMix;
  fn.cols = kH * 64;
  fn.row_bytes = size_t{fn.cols} * 2;
  MhcPostPre p;
  p.pre = c.args();
  p.fn = &fn;
  p.streams = c.d_streams.as<float>();
  EXPECT_FALSE(mhc_post_pre(p, nullptr));
  fn.type = model::GgmlType::F32;
  fn.row_bytes = size_t{fn.cols} * 4;
  fn.rows = kMix - 1;
  EXPECT_FALSE(mhc_post_pre(p, nullptr));
}

// comb made on a branch (MhcCombBranch) instead of by the site: a chain of sites, each the post of
// the one before, gives the same bits in every output, eagerly and replayed from a graph captured
// with PDL where the device has it (the fork and join then graph edges).
TEST(MhcDecode, CombOnABranchGivesTheSiteBits) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  constexpr uint32_t kSites = 3;
  std::mt19937 rng(83);
  for (uint32_t rows : {1u, 3u}) {
    SCOPED_TRACE("rows " + std::to_string(rows));
    MhcCase c(rows, 4096, rng);
    std::normal_distribution<float> n(0.0f, 1.0f);
    std::uniform_real_distribution<float> u(0.05f, 0.5f);
    std::vector<float> y(size_t{rows} * 4096), post_in(size_t{rows} * kH), comb_in(size_t{rows} * kH * kH);
    for (float& v : y) v = n(rng);
    for (float& v : post_in) v = 4.0f * u(rng);
    for (float& v : comb_in) v = u(rng);
    DeviceBuffer d_y(y.size() * 4);
    ASSERT_EQ(MhcCase::up(d_y, y), cudaSuccess);
    DevMatrix fn{model::GgmlType::F32, c.d_fn.as<uint8_t>(), kMix, kH * 4096, size_t{kH} * 4096 * 4};
    Stream s;
    MhcCombBranch branch;
    auto chain = [&](bool on_branch) {
      for (uint32_t i = 0; i < kSites; ++i) {
        MhcPostPre p;
        p.pre = c.args();
        p.pre.mix = nullptr;
        p.fn = &fn;
        p.streams = c.d_streams.as<float>();
        p.y = d_y.as<float>();
        p.post_in = c.d_post.as<float>();
        p.comb_in = c.d_comb.as<float>();
        p.branch = on_branch ? &branch : nullptr;
        if (!mhc_post_pre(p, s.get())) return false;
      }
      branch.join(s.get());
      return true;
    };
    auto run = [&](bool on_branch, bool graph) {
      EXPECT_EQ(MhcCase::up(c.d_streams, c.streams), cudaSuccess);
      EXPECT_EQ(MhcCase::up(c.d_post, post_in), cudaSuccess);
      EXPECT_EQ(MhcCase::up(c.d_comb, comb_in), cudaSuccess);
      cudaMemset(c.d_x.get(), 0xff, size_t{rows} * 4096 * 4);
      bool ok = true;
      if (!graph) {
        ok = chain(on_branch);
      } else {
        GraphExec exec;
        EXPECT_EQ(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
        {
          const PdlScope pdl(pdl_device_ready());
          ok = chain(on_branch);
        }
        exec.end_capture(s.get());
        exec.launch(s.get());
      }
      s.synchronize();
      std::vector<float> streams(c.streams.size());
      EXPECT_EQ(cudaMemcpy(streams.data(), c.d_streams.get(), streams.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      MhcCase::Out o = c.read();
      o.x.insert(o.x.end(), streams.begin(), streams.end());
      return std::make_pair(ok, o);
    };
    const auto [fused, want] = run(false, false);
    if (!fused) GTEST_SKIP() << "the kernels were not built for sm90+ or the device has no clusters";
    for (bool graph : {false, true}) {
      SCOPED_TRACE(graph ? "graph" : "eager");
      const auto [ok, got] = run(true, graph);
      ASSERT_TRUE(ok);
      EXPECT_EQ(std::memcmp(got.comb.data(), want.comb.data(), want.comb.size() * 4), 0) << "comb";
      EXPECT_EQ(std::memcmp(got.post.data(), want.post.data(), want.post.size() * 4), 0) << "post";
      EXPECT_EQ(std::memcmp(got.x.data(), want.x.data(), want.x.size() * 4), 0) << "x and the streams";
    }
  }
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
    std::printf("[ timing ] mhc_pre rows %u D 4096 H 4: one block a row %.1f us, cluster %.1f us\n", rows, one, cl);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }
}

}  // namespace
}  // namespace ferry::gpu
#endif
