// The grouped decode launches (gpu/decode_fusion.hpp) against the launches they replace: matrices of
// one shape as the parts of one launch give the separate launches' bits (over one input or each its
// own, per expert by index, per expert through a pointer table), and the down projection reading
// SwiGLU(gate, up) itself gives swiglu() then matvec(); both also against a double-precision CPU dot
// product at matvec_test's tolerance. Outputs are poisoned (NaN) before each run.
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gpu/cuda_memory.hpp"
#include "gpu/decode_fusion.hpp"
#include "gpu/kernels.hpp"
#include "model/formats/quant.hpp"
#include "tests/gpu/gpu_test_support.hpp"
#include "tests/gpu/quant_rows.hpp"

namespace ferry::gpu {
namespace {

using ferry::testing::dequant;
using ferry::testing::have_device;
using ferry::testing::random_rows;
using model::GgmlType;

DeviceBuffer to_device(const void* p, size_t bytes) {
  DeviceBuffer b(bytes);
  EXPECT_EQ(cudaMemcpy(b.get(), p, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  return b;
}
template <class V>
DeviceBuffer to_device(const std::vector<V>& v) {
  return to_device(v.data(), v.size() * sizeof(V));
}
DeviceBuffer poisoned(size_t floats) {
  DeviceBuffer b(floats * 4);
  EXPECT_EQ(cudaMemset(b.get(), 0xff, floats * 4), cudaSuccess);
  return b;
}
std::vector<float> to_host(const DeviceBuffer& b, size_t floats) {
  std::vector<float> v(floats);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(v.data(), b.get(), floats * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

// Sum of |w x| over a row, and the largest error the int16 path's rounding adds to it (half a step
// of each 32-value block, amax / 32767, times |w|): matvec_test.cpp's bounds.
double magnitude(const float* w, const float* x, size_t cols) {
  double mag = 0;
  for (size_t c = 0; c < cols; ++c) mag += std::abs(double(w[c]) * x[c]);
  return mag;
}
double int16_rounding(const float* w, const float* x, size_t cols) {
  double bound = 0;
  for (size_t b = 0; b < cols; b += 32) {
    float amax = 0;
    for (size_t c = b; c < b + 32; ++c) amax = std::max(amax, std::abs(x[c]));
    for (size_t c = b; c < b + 32; ++c) bound += std::abs(double(w[c])) * amax / 32767.0 * 0.5;
  }
  return bound;
}
double tolerance(const float* w, const float* x, size_t cols, bool int16) {
  return 1e-5 * magnitude(w, x, cols) + 1e-6 + (int16 ? int16_rounding(w, x, cols) : 0.0);
}
double dot(const float* w, const float* x, size_t cols) {
  double s = 0;
  for (size_t c = 0; c < cols; ++c) s += double(w[c]) * x[c];
  return s;
}

struct Matrices {
  std::vector<float> w;  // dequantised, [mats * rows][cols]
  DeviceBuffer buf;
  DevMatrix m;          // all mats x rows
};
Matrices random_matrices(GgmlType type, size_t rows, size_t cols, std::mt19937& rng) {
  const auto data = random_rows(type, rows, cols, rng);
  Matrices r{dequant(type, data, rows * cols), to_device(data), {}};
  r.m.type = type;
  r.m.data = r.buf.as<uint8_t>();
  r.m.rows = static_cast<uint32_t>(rows);
  r.m.cols = static_cast<uint32_t>(cols);
  r.m.row_bytes = *model::ggml_bytes(type, cols);
  return r;
}

std::vector<float> normal(size_t n, std::mt19937& rng, float sd = 1.0f) {
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

class DecodeFusionTest : public ::testing::TestWithParam<GgmlType> {
 protected:
  void SetUp() override {
    if (!have_device()) GTEST_SKIP() << "no CUDA device";
    upload_quant_tables();
  }
};

bool is_int16_type(GgmlType t) {
  return t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q6_K || t == GgmlType::IQ4_XS ||
         t == GgmlType::IQ3_S;
}

// q/k/v-style: three matrices over the same tokens, written interleaved into one buffer as the KDA
// projections are (row stride 3 * rows).
TEST_P(DecodeFusionTest, PartsOfOneLaunchGiveTheSeparateLaunchesBits) {
  const GgmlType type = GetParam();
  std::mt19937 rng(515 + static_cast<int>(type));
  for (size_t cols : {size_t{256}, size_t{768}}) {
    const size_t rows = 75;
    Matrices q = random_matrices(type, rows, cols, rng), k = random_matrices(type, rows, cols, rng),
             v = random_matrices(type, rows, cols, rng);
    for (uint32_t n : {1u, 2u, 3u, 8u}) {
      const auto x = normal(n * cols, rng);
      DeviceBuffer dx = to_device(x), fused = poisoned(3 * rows * n), apart = poisoned(3 * rows * n);
      const MatvecProduct ps[] = {{&q.m, fused.as<float>()},
                                     {&k.m, fused.as<float>() + rows},
                                     {&v.m, fused.as<float>() + 2 * rows}};
      ASSERT_TRUE(matvec_products(ps, 3, dx.as<float>(), cols, n, 3 * rows, nullptr));
      const Matrices* ms[] = {&q, &k, &v};
      for (int p = 0; p < 3; ++p) {
        MatvecArgs a;
        a.w = ms[p]->m;
        a.x = dx.as<float>();
        a.x_tok_stride = cols;
        a.y = apart.as<float>() + p * rows;
        a.y_tok_stride = 3 * rows;
        a.tokens = n;
        matvec(a, nullptr);
      }
      const auto yf = to_host(fused, 3 * rows * n), ya = to_host(apart, 3 * rows * n);
      const bool int16 = is_int16_type(type);
      for (uint32_t t = 0; t < n; ++t) {
        for (int p = 0; p < 3; ++p) {
          for (size_t r = 0; r < rows; ++r) {
            const size_t at = t * 3 * rows + p * rows + r;
            ASSERT_EQ(yf[at], ya[at]) << "token " << t << " part " << p << " row " << r << " cols " << cols;
            const float* w = &ms[p]->w[r * cols];
            ASSERT_NEAR(yf[at], dot(w, &x[t * cols], cols), tolerance(w, &x[t * cols], cols, int16));
          }
        }
      }
    }
  }
}

// KDA's f_b and g_b: two matrices, each over its own input (narrow rows: 128 columns where the type
// allows, else one 256-block).
TEST_P(DecodeFusionTest, PartsWithTheirOwnInputs) {
  const GgmlType type = GetParam();
  std::mt19937 rng(616 + static_cast<int>(type));
  const size_t rows = 96, cols = model::ggml_type_traits(type).block_elems <= 32 ? 128 : 256;
  Matrices f = random_matrices(type, rows, cols, rng), g = random_matrices(type, rows, cols, rng);
  for (uint32_t n : {1u, 4u}) {
    const auto xf = normal(n * cols, rng), xg = normal(n * cols, rng);
    DeviceBuffer dxf = to_device(xf), dxg = to_device(xg);
    DeviceBuffer yf = poisoned(rows * n), yg = poisoned(rows * n), af = poisoned(rows * n), ag = poisoned(rows * n);
    const MatvecProduct ps[] = {{&f.m, yf.as<float>(), dxf.as<float>()}, {&g.m, yg.as<float>(), dxg.as<float>()}};
    ASSERT_TRUE(matvec_products(ps, 2, nullptr, cols, n, rows, nullptr));
    const std::pair<const Matrices*, std::pair<const DeviceBuffer*, const DeviceBuffer*>> apart[] = {
        {&f, {&dxf, &af}}, {&g, {&dxg, &ag}}};
    for (const auto& [m, io] : apart) {
      MatvecArgs a;
      a.w = m->m;
      a.x = io.first->as<float>();
      a.x_tok_stride = cols;
      a.y = io.second->as<float>();
      a.y_tok_stride = rows;
      a.tokens = n;
      matvec(a, nullptr);
    }
    const auto hf = to_host(yf, rows * n), hg = to_host(yg, rows * n);
    const auto haf = to_host(af, rows * n), hag = to_host(ag, rows * n);
    const bool int16 = is_int16_type(type);
    for (uint32_t t = 0; t < n; ++t) {
      for (size_t r = 0; r < rows; ++r) {
        const size_t at = t * rows + r;
        ASSERT_EQ(hf[at], haf[at]) << "f token " << t << " row " << r;
        ASSERT_EQ(hg[at], hag[at]) << "g token " << t << " row " << r;
        ASSERT_NEAR(hf[at], dot(&f.w[r * cols], &xf[t * cols], cols),
                    tolerance(&f.w[r * cols], &xf[t * cols], cols, int16));
        ASSERT_NEAR(hg[at], dot(&g.w[r * cols], &xg[t * cols], cols),
                    tolerance(&g.w[r * cols], &xg[t * cols], cols, int16));
      }
    }
  }
}

// The DSA layer's products of x: three matrices of other row counts (q_a, kv_a, the indexer's
// weights), each output with its own token stride.
TEST_P(DecodeFusionTest, PartsOfOtherRowCountsAndStrides) {
  const GgmlType type = GetParam();
  std::mt19937 rng(88 + static_cast<int>(type));
  const size_t cols = 512;
  const size_t rows[3] = {75, 20, 130};
  Matrices ms[3] = {random_matrices(type, rows[0], cols, rng), random_matrices(type, rows[1], cols, rng),
                    random_matrices(type, rows[2], cols, rng)};
  for (uint32_t n : {1u, 3u}) {
    const auto x = normal(n * cols, rng);
    DeviceBuffer dx = to_device(x);
    std::vector<DeviceBuffer> fused, apart;
    for (size_t r : rows) {
      fused.push_back(poisoned(r * n));
      apart.push_back(poisoned(r * n));
    }
    const MatvecProduct ps[] = {{&ms[0].m, fused[0].as<float>()},
                                {&ms[1].m, fused[1].as<float>(), nullptr, rows[1]},
                                {&ms[2].m, fused[2].as<float>(), nullptr, rows[2]}};
    ASSERT_TRUE(matvec_products(ps, 3, dx.as<float>(), cols, n, rows[0], nullptr));
    for (int p = 0; p < 3; ++p) {
      MatvecArgs a;
      a.w = ms[p].m;
      a.x = dx.as<float>();
      a.x_tok_stride = cols;
      a.y = apart[p].as<float>();
      a.y_tok_stride = rows[p];
      a.tokens = n;
      matvec(a, nullptr);
    }
    const bool int16 = is_int16_type(type);
    for (int p = 0; p < 3; ++p) {
      const auto yf = to_host(fused[p], rows[p] * n), ya = to_host(apart[p], rows[p] * n);
      for (uint32_t t = 0; t < n; ++t) {
        for (size_t r = 0; r < rows[p]; ++r) {
          const size_t at = t * rows[p] + r;
          ASSERT_EQ(yf[at], ya[at]) << "part " << p << " token " << t << " row " << r;
          const float* w = &ms[p].w[r * cols];
          ASSERT_NEAR(yf[at], dot(w, &x[t * cols], cols), tolerance(w, &x[t * cols], cols, int16));
        }
      }
    }
  }
}

// Rows of other lengths or types are not grouped, nor more than 8 tokens: the caller's per-matrix
// path runs instead.
TEST_P(DecodeFusionTest, OtherRowFormatsAreNotGrouped) {
  const GgmlType type = GetParam();
  std::mt19937 rng(9);
  Matrices a = random_matrices(type, 40, 256, rng), b = random_matrices(type, 40, 512, rng);
  Matrices c = random_matrices(type == GgmlType::Q8_0 ? GgmlType::F32 : GgmlType::Q8_0, 40, 256, rng);
  DeviceBuffer dx = to_device(normal(512, rng)), dy = poisoned(120);
  const MatvecProduct ab[] = {{&a.m, dy.as<float>()}, {&b.m, dy.as<float>() + 40}};
  const MatvecProduct ac[] = {{&a.m, dy.as<float>()}, {&c.m, dy.as<float>() + 40}};
  EXPECT_FALSE(matvec_products(ab, 2, dx.as<float>(), 256, 1, 80, nullptr));
  EXPECT_FALSE(matvec_products(ac, 2, dx.as<float>(), 256, 1, 80, nullptr));
  EXPECT_FALSE(matvec_products(ab, 1, dx.as<float>(), 256, kMaxMatvecTokens + 1, 80, nullptr));
}

// The routed experts' gate and up: (token, expert) groups by a device index, the experts read through
// pointer tables (the pool's) for one part and by offset for the other.
TEST_P(DecodeFusionTest, ExpertGateAndUpInOneLaunch) {
  const GgmlType type = GetParam();
  std::mt19937 rng(77 + static_cast<int>(type));
  const size_t rows = 24, cols = 512, mats = 5;
  Matrices gate = random_matrices(type, rows * mats, cols, rng), up = random_matrices(type, rows * mats, cols, rng);
  const std::vector<int32_t> ids = {4, 1, 0, 4, 2, 3};
  const uint32_t k = 2, tokens = 3, groups = tokens * k;
  std::vector<const uint8_t*> up_ptrs(mats);
  for (size_t e = 0; e < mats; ++e) up_ptrs[e] = up.m.data + e * rows * up.m.row_bytes;
  const auto x = normal(tokens * cols, rng);
  DeviceBuffer dx = to_device(x), dids = to_device(ids), dptrs = to_device(up_ptrs);
  DeviceBuffer g_fused = poisoned(groups * rows), u_fused = poisoned(groups * rows);
  DeviceBuffer g_apart = poisoned(groups * rows), u_apart = poisoned(groups * rows);
  MatvecArgs a;
  a.w = gate.m.slice_rows(0, rows);
  a.w_group_bytes = gate.m.row_bytes * rows;
  a.w_group_index = dids.as<int32_t>();
  a.x = dx.as<float>();
  a.x_group_stride = cols;
  a.x_group_div = k;
  a.y_group_stride = rows;
  a.groups = groups;
  MatvecArgs both = a;
  both.y = g_fused.as<float>();
  both.parts = 2;
  both.more[0] = {nullptr, reinterpret_cast<const uint8_t* const*>(dptrs.get()), u_fused.as<float>()};
  matvec(both, nullptr);
  MatvecArgs g1 = a;
  g1.y = g_apart.as<float>();
  matvec(g1, nullptr);
  MatvecArgs u1 = a;
  u1.w = up.m.slice_rows(0, rows);
  u1.w_group_ptrs = reinterpret_cast<const uint8_t* const*>(dptrs.get());
  u1.y = u_apart.as<float>();
  matvec(u1, nullptr);
  const auto gf = to_host(g_fused, groups * rows), uf = to_host(u_fused, groups * rows);
  const auto ga = to_host(g_apart, groups * rows), ua = to_host(u_apart, groups * rows);
  const bool int16 = is_int16_type(type);
  for (uint32_t g = 0; g < groups; ++g) {
    for (size_t r = 0; r < rows; ++r) {
      const size_t at = g * rows + r;
      ASSERT_EQ(gf[at], ga[at]) << "gate group " << g << " row " << r;
      ASSERT_EQ(uf[at], ua[at]) << "up group " << g << " row " << r;
      const float* xg = &x[(g / k) * cols];
      const float* wg = &gate.w[(ids[g] * rows + r) * cols];
      const float* wu = &up.w[(ids[g] * rows + r) * cols];
      ASSERT_NEAR(gf[at], dot(wg, xg, cols), tolerance(wg, xg, cols, int16)) << "gate group " << g << " row " << r;
      ASSERT_NEAR(uf[at], dot(wu, xg, cols), tolerance(wu, xg, cols, int16)) << "up group " << g << " row " << r;
    }
  }
}

float host_swiglu(float g, float u, float limit) {
  g = std::min(g, limit);
  u = std::clamp(u, -limit, limit);
  return g / (1.0f + std::exp(-g)) * u;
}

// The down projection over SwiGLU(gate, up), per (token, expert) group: one launch against swiglu()
// then matvec(), and against the CPU; with a clamp that bites and with none.
TEST_P(DecodeFusionTest, DownReadsSwigluOfGateAndUp) {
  const GgmlType type = GetParam();
  std::mt19937 rng(31 + static_cast<int>(type));
  const size_t rows = 40, cols = 512, mats = 4;
  Matrices down = random_matrices(type, rows * mats, cols, rng);
  const std::vector<int32_t> ids = {3, 0, 2, 2, 1, 3};
  const uint32_t groups = 6;
  DeviceBuffer dids = to_device(ids);
  for (float limit : {2.5f, std::numeric_limits<float>::infinity()}) {
    const auto gate = normal(groups * cols, rng, 2.0f), up = normal(groups * cols, rng, 2.0f);
    DeviceBuffer dg = to_device(gate), du = to_device(up), dg2 = to_device(gate);
    DeviceBuffer fused = poisoned(groups * rows), apart = poisoned(groups * rows);
    MatvecArgs a;
    a.w = down.m.slice_rows(0, rows);
    a.w_group_bytes = down.m.row_bytes * rows;
    a.w_group_index = dids.as<int32_t>();
    a.x_group_stride = cols;
    a.y_group_stride = rows;
    a.groups = groups;
    a.y = fused.as<float>();
    matvec_swiglu(a, dg.as<float>(), du.as<const float>(), cols, groups, cols, limit, nullptr);
    swiglu(dg2.as<float>(), du.as<const float>(), cols, groups, cols, limit, nullptr);
    MatvecArgs plain = a;
    plain.x = dg2.as<float>();
    plain.y = apart.as<float>();
    matvec(plain, nullptr);
    const bool int16 = matvec_quantizes_activations(plain);
    ASSERT_EQ(int16, is_int16_type(type));
    const auto yf = to_host(fused, groups * rows), ya = to_host(apart, groups * rows);
    std::vector<float> act(groups * cols);
    for (size_t i = 0; i < act.size(); ++i) act[i] = host_swiglu(gate[i], up[i], limit);
    for (uint32_t g = 0; g < groups; ++g) {
      for (size_t r = 0; r < rows; ++r) {
        const size_t at = g * rows + r;
        ASSERT_NEAR(yf[at], ya[at], 1e-6f * std::abs(ya[at]) + 1e-6f) << "group " << g << " row " << r;
        const float* w = &down.w[(ids[g] * rows + r) * cols];
        // The CPU's exp may differ from the device's by an ulp or two: 1e-6 of each product more.
        const double exp_ulps = 1e-6 * magnitude(w, &act[g * cols], cols);
        ASSERT_NEAR(yf[at], dot(w, &act[g * cols], cols), tolerance(w, &act[g * cols], cols, int16) + exp_ulps)
            << "group " << g << " row " << r << " limit " << limit;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, DecodeFusionTest,
                         ::testing::Values(GgmlType::F32, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K,
                                           GgmlType::Q6_K, GgmlType::IQ4_XS, GgmlType::IQ3_S),
                         [](const auto& info) { return std::string(model::ggml_type_traits(info.param).name); });

}  // namespace
}  // namespace ferry::gpu
#endif
