// A decode step's MoE combine made inside the next mHC site's launch (MhcPostPre::combine,
// gpu/mhc_decode.hpp) against moe_combine into y and then the site reading y: the same bits in the
// streams (the post), x, post and comb, with and without a shared expert, at one, three and eight
// rows and GLM's width (H = 4, D = 4,096) and a small one. Outputs are poisoned (NaN) first; the
// combine of the plain way is also checked against its sum on the host. The last post of a step with
// the combine (mhc_post_combine) against moe_combine then mhc_post, the same way. moe_combine's row
// kernel against its element kernel.
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu/cuda_memory.hpp"
#include "gpu/kernels.hpp"
#include "gpu/mhc_decode.hpp"
#include "tests/gpu/gpu_test_support.hpp"

namespace ferry::gpu {
namespace {

using ferry::testing::have_device;

constexpr uint32_t kH = 4, kMix = (2 + kH) * kH, kK = 8;

DeviceBuffer up(const std::vector<float>& v) {
  DeviceBuffer b(v.size() * 4);
  EXPECT_EQ(cudaMemcpy(b.get(), v.data(), v.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  return b;
}
std::vector<float> down(const DeviceBuffer& b) {
  std::vector<float> v(b.bytes() / 4);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(v.data(), b.get(), b.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}
void expect_bits(const std::vector<float>& plain, const std::vector<float>& fused, const std::string& what) {
  ASSERT_EQ(plain.size(), fused.size()) << what;
  for (size_t i = 0; i < plain.size(); ++i) {
    uint32_t a = 0, b = 0;
    std::memcpy(&a, &plain[i], 4);
    std::memcpy(&b, &fused[i], 4);
    if (a != b) {
      ADD_FAILURE() << what << ": first difference at " << i << " of " << plain.size() << ": " << plain[i]
                    << " unfused, " << fused[i] << " fused";
      return;
    }
  }
}

struct Outputs {
  std::vector<float> streams, x, post, comb;
};

// One site after a MoE sublayer, the plain way (moe_combine, then the site's post from y) or fused;
// false when the cluster kernel does not apply here (no sm90 build or device).
bool run_site(uint32_t rows, uint32_t D, bool with_shared, bool fused, Outputs& out, std::vector<float>* y_out) {
  std::mt19937 rng(rows * 131 + D + with_shared);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::uniform_real_distribution<float> u(0.05f, 0.5f);
  auto randn = [&](size_t count, float scale) {
    std::vector<float> v(count);
    for (float& x : v) x = n(rng) * scale;
    return v;
  };
  auto randu = [&](size_t count, float scale) {
    std::vector<float> v(count);
    for (float& x : v) x = u(rng) * scale;
    return v;
  };
  const std::vector<float> streams = randn(size_t{rows} * kH * D, 1.0f), eo = randn(size_t{rows} * kK * D, 1.0f),
                           weights = randu(size_t{rows} * kK, 2.0f), shared = randn(size_t{rows} * D, 1.0f),
                           post_in = randu(size_t{rows} * kH, 4.0f), comb_in = randu(size_t{rows} * kH * kH, 1.0f),
                           fn = randn(size_t{kMix} * kH * D, 1.0f / std::sqrt(static_cast<float>(kH * D))),
                           base = randn(kMix, 1.0f), norm_w = randu(D, 3.0f), scale = {0.6f, 0.8f, 1.7f};
  DeviceBuffer d_streams = up(streams), d_eo = up(eo), d_w = up(weights), d_sh = up(shared), d_post = up(post_in),
               d_comb = up(comb_in), d_fn = up(fn), d_base = up(base), d_norm = up(norm_w), d_scale = up(scale);
  DeviceBuffer d_y(size_t{rows} * D * 4), d_x(size_t{rows} * D * 4);
  EXPECT_EQ(cudaMemset(d_y.get(), 0xff, d_y.bytes()), cudaSuccess);
  EXPECT_EQ(cudaMemset(d_x.get(), 0xff, d_x.bytes()), cudaSuccess);
  DevMatrix m;
  m.type = model::GgmlType::F32;
  m.data = d_fn.as<uint8_t>();
  m.rows = kMix;
  m.cols = kH * D;
  m.row_bytes = size_t{m.cols} * 4;
  MhcPostPre p;
  p.pre.streams = d_streams.as<float>();
  p.pre.base = d_base.as<float>();
  p.pre.scale = d_scale.as<float>();
  p.pre.norm_w = d_norm.as<float>();
  p.pre.rows = rows;
  p.pre.H = kH;
  p.pre.D = D;
  p.pre.iters = 20;
  p.pre.x = d_x.as<float>();
  p.pre.post = d_post.as<float>();  // the site writes its own over the post's inputs, as in the layer runner
  p.pre.comb = d_comb.as<float>();
  p.fn = &m;
  p.streams = d_streams.as<float>();
  p.post_in = d_post.as<float>();
  p.comb_in = d_comb.as<float>();
  const MoeCombineIn c{d_eo.as<float>(), d_w.as<float>(), with_shared ? d_sh.as<float>() : nullptr, kK};
  if (fused) {
    p.combine = &c;
  } else {
    moe_combine(c.eo, nullptr, c.weights, c.shared, rows, kK, D, d_y.as<float>(), nullptr);
    p.y = d_y.as<float>();
  }
  if (!mhc_post_pre(p, nullptr)) return false;
  out = {down(d_streams), down(d_x), down(d_post), down(d_comb)};
  if (y_out != nullptr) {
    *y_out = down(d_y);
    // The plain combine against its sum on the host (in f64): the inputs of the comparison are right.
    for (uint32_t r = 0; r < rows; ++r) {
      for (uint32_t d = 0; d < D; d += 97) {
        double s = with_shared ? shared[size_t{r} * D + d] : 0.0;
        for (uint32_t j = 0; j < kK; ++j) s += double(weights[r * kK + j]) * eo[(size_t{r} * kK + j) * D + d];
        EXPECT_NEAR((*y_out)[size_t{r} * D + d], s, 1e-4 * (1.0 + std::abs(s))) << "row " << r << " column " << d;
      }
    }
  }
  return true;
}

TEST(MoeCombineFusion, SiteMakesTheCombineItselfWithTheSameBits) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  for (const uint32_t D : {4096u, 64u}) {
    for (const uint32_t rows : {1u, 3u, 8u}) {
      for (const bool with_shared : {true, false}) {
        const std::string what = "D " + std::to_string(D) + ", " + std::to_string(rows) + " rows" +
                                 (with_shared ? ", shared expert" : "");
        Outputs plain, fused;
        std::vector<float> y;
        if (!run_site(rows, D, with_shared, false, plain, &y)) {
          GTEST_SKIP() << "the kernels were not built for sm90+ or the device has no clusters";
        }
        ASSERT_TRUE(run_site(rows, D, with_shared, true, fused, nullptr)) << what;
        expect_bits(plain.streams, fused.streams, what + ": streams after the post");
        expect_bits(plain.x, fused.x, what + ": x");
        expect_bits(plain.post, fused.post, what + ": post");
        expect_bits(plain.comb, fused.comb, what + ": comb");
        for (float v : fused.x) ASSERT_EQ(v, v) << what << ": x left unwritten (NaN)";
      }
    }
  }
}

// The step's last post (no site after it) with the combine: moe_combine then mhc_post, in one
// launch; any device.
TEST(MoeCombineFusion, FinalPostMakesTheCombineItselfWithTheSameBits) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  for (const uint32_t D : {4096u, 100u}) {
    for (const uint32_t rows : {1u, 3u, 8u}) {
      for (const bool with_shared : {true, false}) {
        const std::string what = "D " + std::to_string(D) + ", " + std::to_string(rows) + " rows" +
                                 (with_shared ? ", shared expert" : "");
        std::mt19937 rng(rows * 17 + D + with_shared);
        std::normal_distribution<float> n(0.0f, 1.0f);
        auto randn = [&](size_t count) {
          std::vector<float> v(count);
          for (float& x : v) x = n(rng);
          return v;
        };
        const std::vector<float> streams = randn(size_t{rows} * kH * D), eo = randn(size_t{rows} * kK * D),
                                 weights = randn(size_t{rows} * kK), shared = randn(size_t{rows} * D),
                                 post = randn(size_t{rows} * kH), comb = randn(size_t{rows} * kH * kH);
        const DeviceBuffer d_eo = up(eo), d_w = up(weights), d_sh = up(shared), d_post = up(post), d_comb = up(comb);
        const MoeCombineIn c{d_eo.as<float>(), d_w.as<float>(), with_shared ? d_sh.as<float>() : nullptr, kK};
        std::vector<float> out[2];
        for (int fused = 0; fused < 2; ++fused) {
          DeviceBuffer d_streams = up(streams), d_y(size_t{rows} * D * 4);
          if (fused == 1) {
            mhc_post_combine(d_streams.as<float>(), c, d_post.as<float>(), d_comb.as<float>(), rows, kH, D, nullptr);
          } else {
            moe_combine(c.eo, nullptr, c.weights, c.shared, rows, kK, D, d_y.as<float>(), nullptr);
            mhc_post(d_streams.as<float>(), d_y.as<float>(), d_post.as<float>(), d_comb.as<float>(), rows, kH, D,
                     nullptr);
          }
          out[fused] = down(d_streams);
        }
        expect_bits(out[0], out[1], what + ": streams after the post");
        EXPECT_NE(std::memcmp(out[1].data(), streams.data(), streams.size() * 4), 0) << what << ": no post";
      }
    }
  }
}

// moe_combine a row a block (aligned rows, D a multiple of 4) against its element kernel (y one float
// off 16 bytes): the same bits, with a prefill's `where` and without, with and without a shared expert.
TEST(MoeCombineFusion, RowKernelHasTheElementKernelsBits) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  for (const uint32_t D : {4096u, 100u}) {
    for (const bool with_where : {true, false}) {
      for (const bool with_shared : {true, false}) {
        const uint32_t rows = 37;
        const std::string what = "D " + std::to_string(D) + (with_where ? ", where" : "") +
                                 (with_shared ? ", shared expert" : "");
        std::mt19937 rng(D + 2 * with_where + with_shared);
        std::normal_distribution<float> n(0.0f, 1.0f);
        auto randn = [&](size_t count) {
          std::vector<float> v(count);
          for (float& x : v) x = n(rng);
          return v;
        };
        const std::vector<float> eo = randn(size_t{rows} * kK * D), weights = randn(size_t{rows} * kK),
                                 shared = randn(size_t{rows} * D);
        std::vector<int32_t> where(size_t{rows} * kK);
        for (size_t i = 0; i < where.size(); ++i) where[i] = static_cast<int32_t>((i * 7919) % where.size());
        DeviceBuffer d_where(where.size() * 4), d_y((size_t{rows} * D + 4) * 4);
        ASSERT_EQ(cudaMemcpy(d_where.get(), where.data(), where.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
        const DeviceBuffer d_eo = up(eo), d_w = up(weights), d_sh = up(shared);
        std::vector<float> out[2];
        for (int off = 0; off < 2; ++off) {
          ASSERT_EQ(cudaMemset(d_y.get(), 0xff, d_y.bytes()), cudaSuccess);
          moe_combine(d_eo.as<float>(), with_where ? d_where.as<int32_t>() : nullptr, d_w.as<float>(),
                      with_shared ? d_sh.as<float>() : nullptr, rows, kK, D, d_y.as<float>() + off, nullptr);
          const std::vector<float> y = down(d_y);
          out[off].assign(y.begin() + off, y.begin() + off + size_t{rows} * D);
        }
        expect_bits(out[1], out[0], what);
        // Row 5, column 3 on the host: the FMAs in route order.
        float v = 0.0f;
        for (uint32_t j = 0; j < kK; ++j) {
          const size_t route = 5 * kK + j, slot = with_where ? static_cast<size_t>(where[route]) : route;
          v = std::fma(weights[route], eo[slot * D + 3], v);
        }
        EXPECT_EQ(out[0][5 * D + 3], (with_shared ? shared[5 * D + 3] : 0.0f) + v) << what;
      }
    }
  }
}

}  // namespace
}  // namespace ferry::gpu
#endif
