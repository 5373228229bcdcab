// The decode router in one launch (gpu/moe_route_decode.hpp) against its two launches, matvec() and
// moe_route(): the same logits, ids and weights bit for bit, at GLM's shape (288 experts of 4,096,
// top 8), DeepSeek's groups rule and the widths the launch takes, for one row; again (the block
// counter left zero) and replayed from a graph captured with PDL where the device has it. Outputs are
// poisoned first. Shapes it does not take (more rows among them) are refused, launching nothing.
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu/cuda_memory.hpp"
#include "gpu/kernels.hpp"
#include "gpu/moe_route_decode.hpp"
#include "gpu/pdl.hpp"
#include "tests/gpu/gpu_test_support.hpp"

namespace ferry::gpu {
namespace {

using ferry::testing::have_device;
using ferry::testing::random_buffer;

struct RouterCase {
  uint32_t E, D, rows;
  DeviceBuffer w, x, bias, logits, ids, weights, done;
  DevMatrix m;
  RouterArgs a;

  RouterCase(uint32_t E_, uint32_t D_, uint32_t rows_, uint32_t k, uint32_t n_group, uint32_t topk_group,
             std::mt19937& rng)
      : E(E_), D(D_), rows(rows_), w(random_buffer(size_t{E_} * D_, 0.02f, rng)),
        x(random_buffer(size_t{rows_} * D_, 1.0f, rng)), bias(random_buffer(E_, 0.01f, rng)),
        logits(size_t{rows_} * E_ * 4), ids(size_t{rows_} * k * 4), weights(size_t{rows_} * k * 4), done(4) {
    m = DevMatrix{model::GgmlType::F32, w.as<uint8_t>(), E, D, size_t{D} * 4};
    a.logits = logits.as<float>(), a.bias = bias.as<float>(), a.rows = rows, a.E = E, a.k = k;
    a.n_group = n_group, a.topk_group = topk_group, a.scaling = 2.5f;
    a.ids = ids.as<int32_t>(), a.weights = weights.as<float>();
    EXPECT_EQ(cudaMemset(done.get(), 0, 4), cudaSuccess);
  }
  void poison() {
    cudaMemset(logits.get(), 0xff, logits.bytes());
    cudaMemset(ids.get(), 0xff, ids.bytes());
    cudaMemset(weights.get(), 0xff, weights.bytes());
  }
  // The two launches the fused one stands in for.
  void apart(cudaStream_t s) {
    MatvecArgs v;
    v.w = m, v.x = x.as<float>(), v.x_tok_stride = D, v.y = logits.as<float>(), v.y_tok_stride = E, v.tokens = rows;
    matvec(v, s);
    moe_route(a, s);
  }
  bool fused(cudaStream_t s) { return moe_route_decode(m, x.as<float>(), logits.as<float>(), a, done.as<uint32_t>(), s); }
  std::vector<uint8_t> read() {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint8_t> out(logits.bytes() + ids.bytes() + weights.bytes() + 4);
    EXPECT_EQ(cudaMemcpy(out.data(), logits.get(), logits.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(out.data() + logits.bytes(), ids.get(), ids.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(out.data() + logits.bytes() + ids.bytes(), weights.get(), weights.bytes(),
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    // The counter, after the outputs: zero once a launch is done.
    EXPECT_EQ(cudaMemcpy(out.data() + out.size() - 4, done.get(), 4, cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }
};

void expect_same(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, const RouterCase& c,
                 const char* what) {
  ASSERT_EQ(got.size(), want.size());
  const size_t logits = c.logits.bytes(), ids = c.ids.bytes();
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == want[i]) continue;
    const char* part = i < logits ? "logits" : i < logits + ids ? "ids" : i < got.size() - 4 ? "weights" : "counter";
    FAIL() << what << ": " << part << " differ first at byte " << i;
  }
}

void check(uint32_t E, uint32_t D, uint32_t rows, uint32_t k, uint32_t n_group, uint32_t topk_group, std::mt19937& rng) {
  SCOPED_TRACE(std::to_string(E) + " experts of " + std::to_string(D) + ", " + std::to_string(rows) + " rows, top " +
               std::to_string(k) + ", " + std::to_string(topk_group) + " of " + std::to_string(n_group) + " groups");
  RouterCase c(E, D, rows, k, n_group, topk_group, rng);
  c.poison();
  c.apart(nullptr);
  const std::vector<uint8_t> want = c.read();
  c.poison();
  ASSERT_TRUE(c.fused(nullptr)) << "the fused router refused a shape it takes";
  expect_same(c.read(), want, c, "fused");
  c.poison();
  ASSERT_TRUE(c.fused(nullptr));
  expect_same(c.read(), want, c, "fused again");
  Stream s;
  GraphExec g;
  ASSERT_EQ(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
  {
    const PdlScope pdl(pdl_device_ready());
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(c.fused(s.get()));  // three in a row share the counter
  }
  g.end_capture(s.get());
  for (int replay = 0; replay < 2; ++replay) {
    c.poison();
    g.launch(s.get());
    s.synchronize();
    expect_same(c.read(), want, c, "graph");
  }
}

TEST(MoeRouteDecode, OneLaunchGivesTheProductAndRouteBits) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(83);
  for (int i = 0; i < 4; ++i) check(288, 4096, 1, 8, 1, 1, rng);
  check(256, 4096, 1, 8, 8, 4, rng);   // the groups rule
  check(288, 2048, 1, 8, 1, 1, rng);   // the narrowest rows it takes
  check(288, 8192, 1, 8, 1, 1, rng);   // the widest
  check(512, 4104, 1, 32, 1, 1, rng);  // the most experts, a last unit short of a warp's round
}

TEST(MoeRouteDecode, OtherShapesAreLeftToTheTwoLaunches) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(84);
  RouterCase c(288, 4096, 1, 8, 1, 1, rng);
  float* const x = c.x.as<float>();
  float* const logits = c.logits.as<float>();
  uint32_t* const done = c.done.as<uint32_t>();
  EXPECT_FALSE(moe_route_decode(c.m, x, logits, c.a, nullptr, nullptr));  // no counter
  DevMatrix half = c.m;
  half.type = model::GgmlType::F16;
  EXPECT_FALSE(moe_route_decode(half, x, logits, c.a, done, nullptr));
  DevMatrix narrow = c.m;
  narrow.cols = 1024;
  EXPECT_FALSE(moe_route_decode(narrow, x, logits, c.a, done, nullptr));
  RouterArgs two = c.a;
  two.rows = 2;
  EXPECT_FALSE(moe_route_decode(c.m, x, logits, two, done, nullptr));
  RouterCase wide(1024, 2048, 1, 8, 1, 1, rng);  // a thread an expert: more than the launch's 512
  EXPECT_FALSE(wide.fused(nullptr));
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace ferry::gpu
#endif
