// The block-a-row MoE router (gpu/ops.cu moe_route) against the CPU's (model::route_token) on many
// random score rows: continuous logits, rows with repeated logits (exact ties of the choice score),
// and rows whose sigmoids are exact on both sides (0, 1/2, 1) with biases of a few exact values, so
// that ties are everywhere, within and between groups; rows whose best experts share one warp (the
// candidates rule). GLM's shape (288 experts, top 8, one group),
// DeepSeek's groups rule (256 in 8 groups, 4 kept) and the limits (1,024 experts, top 32, 64 groups).
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gpu/cuda_check.hpp"
#include "gpu/cuda_memory.hpp"
#include "gpu/kernels.hpp"
#include "model/cpu/moe.hpp"
#include "tests/gpu/gpu_test_support.hpp"

namespace ferry::gpu {
namespace {

using ferry::testing::have_device;

// one_warp: continuous rows whose k + 2 best experts all sit in one warp of 32 (the kernel's
// candidates rule: that warp alone holds the top k, the other warps' top k must all rank after it).
enum class RowKind { continuous, repeated, exact, one_warp };

struct RouteRun {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

RouteRun route_on_device(const model::RouterConfig& c, const std::vector<float>& logits, const std::vector<float>& bias,
                         uint32_t rows) {
  DeviceBuffer dl(logits.size() * 4), db(bias.size() * 4), di(size_t{rows} * c.n_used * 4),
      dw(size_t{rows} * c.n_used * 4);
  EXPECT_EQ(cudaMemcpy(dl.get(), logits.data(), logits.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(db.get(), bias.data(), bias.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemset(di.get(), 0xff, size_t{rows} * c.n_used * 4), cudaSuccess);
  EXPECT_EQ(cudaMemset(dw.get(), 0xff, size_t{rows} * c.n_used * 4), cudaSuccess);
  RouterArgs a;
  a.logits = dl.as<float>();
  a.bias = db.as<float>();
  a.rows = rows;
  a.E = c.n_experts;
  a.k = c.n_used;
  a.n_group = c.n_group;
  a.topk_group = c.topk_group;
  a.norm_topk_prob = c.norm_topk_prob;
  a.scaling = c.routed_scaling;
  a.ids = di.as<int32_t>();
  a.weights = dw.as<float>();
  moe_route(a, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  RouteRun r{std::vector<int32_t>(size_t{rows} * c.n_used), std::vector<float>(size_t{rows} * c.n_used)};
  EXPECT_EQ(cudaMemcpy(r.ids.data(), di.get(), r.ids.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(r.weights.data(), dw.get(), r.weights.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  return r;
}

void check_router(const model::RouterConfig& c, RowKind kind, uint32_t rows, std::mt19937& rng) {
  const uint32_t E = c.n_experts, k = c.n_used;
  std::normal_distribution<float> n(0.0f, 2.0f);
  std::uniform_int_distribution<uint32_t> pick(0, E - 1), three(0, 2);
  std::vector<float> bias(E), logits(size_t{rows} * E);
  // Exact rows: biases of a few exact values, so that equal sigmoids give equal choices.
  for (float& b : bias) b = kind == RowKind::continuous ? 0.1f * n(rng) : 0.125f * static_cast<float>(three(rng));
  for (uint32_t r = 0; r < rows; ++r) {
    float* l = &logits[size_t{r} * E];
    for (uint32_t e = 0; e < E; ++e) {
      // sigmoid(-200) = 0, sigmoid(0) = 1/2, sigmoid(200) = 1, exactly on both sides.
      l[e] = kind == RowKind::exact ? 200.0f * (static_cast<float>(three(rng)) - 1.0f) : n(rng);
    }
    if (kind == RowKind::repeated) {
      for (uint32_t i = 0; i < E / 2; ++i) l[pick(rng)] = l[pick(rng)];
    }
    if (kind == RowKind::one_warp && E >= 32) {
      const uint32_t w = std::uniform_int_distribution<uint32_t>(0, E / 32 - 1)(rng);
      for (uint32_t i = 0; i < std::min(k + 2, 32u); ++i) l[w * 32 + i * 7 % 32] += 8.0f;  // 7 and 32: coprime
    }
  }
  const RouteRun got = route_on_device(c, logits, bias, rows);
  uint32_t near_ties = 0;
  for (uint32_t r = 0; r < rows; ++r) {
    std::vector<uint32_t> ids(k);
    std::vector<float> w(k);
    model::route_token(c, &logits[size_t{r} * E], bias.data(), ids.data(), w.data());
    bool same = true;
    for (uint32_t j = 0; j < k; ++j) {
      const int32_t g = got.ids[size_t{r} * k + j];
      ASSERT_TRUE(g >= 0 && static_cast<uint32_t>(g) < E) << "row " << r << " place " << j << ": expert " << g;
      if (static_cast<uint32_t>(g) == ids[j]) continue;
      same = false;
      // Only a sigmoid's last bits (expf on the device, std::exp here) may reorder two experts.
      ASSERT_NE(kind, RowKind::exact) << "row " << r << " place " << j << ": " << g << " vs the CPU's " << ids[j];
      auto choice = [&](uint32_t e) { return 1.0 / (1.0 + std::exp(-double(logits[size_t{r} * E + e]))) + bias[e]; };
      ASSERT_NEAR(choice(static_cast<uint32_t>(g)), choice(ids[j]), 1e-6)
          << "row " << r << " place " << j << ": " << g << " vs the CPU's " << ids[j];
    }
    if (!same) {
      ++near_ties;
      continue;
    }
    for (uint32_t j = 0; j < k; ++j) {
      const float gw = got.weights[size_t{r} * k + j];
      if (kind == RowKind::exact) {
        ASSERT_EQ(gw, w[j]) << "row " << r << " place " << j;
      } else {
        ASSERT_NEAR(gw, w[j], 1e-6 * std::abs(w[j]) + 1e-9) << "row " << r << " place " << j;
      }
    }
  }
  EXPECT_LE(near_ties, rows / 100) << "rows ordered differently by a sigmoid's rounding";
}

model::RouterConfig config(uint32_t E, uint32_t k, uint32_t n_group, uint32_t topk_group, bool norm, float scaling) {
  model::RouterConfig c;
  c.n_experts = E;
  c.n_used = k;
  c.n_group = n_group;
  c.topk_group = topk_group;
  c.norm_topk_prob = norm;
  c.routed_scaling = scaling;
  return c;
}

TEST(MoeRoute, GlmShapeMatchesTheCpuRouter) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(288);
  const model::RouterConfig c = config(288, 8, 1, 1, true, 2.5f);
  for (RowKind kind : {RowKind::continuous, RowKind::repeated, RowKind::exact, RowKind::one_warp}) {
    check_router(c, kind, 600, rng);
  }
}

TEST(MoeRoute, GroupsRuleMatchesTheCpuRouter) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(256);
  for (const model::RouterConfig& c : {config(256, 8, 8, 4, true, 2.5f), config(6, 2, 3, 2, true, 2.5f),
                                       config(1024, 32, 64, 7, false, 1.0f), config(96, 5, 32, 31, true, 1.5f)}) {
    SCOPED_TRACE(std::to_string(c.n_experts) + " experts, top " + std::to_string(c.n_used) + ", " +
                 std::to_string(c.topk_group) + " of " + std::to_string(c.n_group) + " groups");
    for (RowKind kind : {RowKind::continuous, RowKind::repeated, RowKind::exact, RowKind::one_warp}) {
      check_router(c, kind, 300, rng);
    }
  }
}

TEST(MoeRoute, UnsupportedShapesAreNamed) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  RouterArgs a;
  a.rows = 1;
  a.E = 2048;
  a.k = 8;
  try {
    moe_route(a, nullptr);
    FAIL() << "2,048 experts accepted";
  } catch (const CudaError& e) {
    EXPECT_NE(std::string(e.what()).find("2048 experts"), std::string::npos) << e.what();
  }
  a.E = 4;
  a.k = 8;
  EXPECT_THROW(moe_route(a, nullptr), CudaError);  // top 8 of 4
}

// Event-timed median of the router at GLM's decode shape (printed, not asserted).
TEST(MoeRoute, TimingLine) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  for (uint32_t rows : {1u, 3u}) {
    DeviceBuffer dl(size_t{rows} * 288 * 4), db(288 * 4), di(size_t{rows} * 8 * 4), dw(size_t{rows} * 8 * 4);
    ASSERT_EQ(cudaMemset(dl.get(), 0, dl.bytes()), cudaSuccess);
    ASSERT_EQ(cudaMemset(db.get(), 0, db.bytes()), cudaSuccess);
    RouterArgs a;
    a.logits = dl.as<float>();
    a.bias = db.as<float>();
    a.rows = rows;
    a.E = 288;
    a.k = 8;
    a.ids = di.as<int32_t>();
    a.weights = dw.as<float>();
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    std::vector<float> t;
    for (int i = 0; i < 30; ++i) {
      cudaEventRecord(e0);
      moe_route(a, nullptr);
      cudaEventRecord(e1);
      cudaEventSynchronize(e1);
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      t.push_back(ms * 1000.0f);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    std::sort(t.begin(), t.end());
    std::printf("[ timing ] moe_route rows %u, 288 experts, top 8: %.1f us\n", rows, t[t.size() / 2]);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }
}

}  // namespace
}  // namespace ferry::gpu
#endif
