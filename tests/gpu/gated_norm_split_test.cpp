// The prefill gated RMSNorm written as the output projection's fp16 split (gated_rms_norm_split) against
// gated_rms_norm's f32 rows: every lo and hi is half_split.cuh's split (on the CPU here) of the f32 value, in
// LayerRunner::mm_staged's layout (row i's lo values, then its hi values, rows 2 * heads * head_dim apart), at
// head dims of a lane a channel (16), two (64) and four (128). Outputs are poisoned (0xffff) first.
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "gpu/cuda_memory.hpp"
#include "gpu/kernels.hpp"
#include "model/formats/half.hpp"
#include "tests/gpu/gpu_test_support.hpp"

namespace ferry::gpu {
namespace {

template <class V>
DeviceBuffer up(const std::vector<V>& v) {
  DeviceBuffer b(v.size() * sizeof(V));
  EXPECT_EQ(cudaMemcpy(b.get(), v.data(), v.size() * sizeof(V), cudaMemcpyHostToDevice), cudaSuccess);
  return b;
}
template <class V>
std::vector<V> down(const DeviceBuffer& b) {
  std::vector<V> v(b.bytes() / sizeof(V));
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(v.data(), b.get(), b.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

TEST(GatedNormSplit, GivesTheSplitOfTheNormsF32Values) {
  if (!testing::have_device()) GTEST_SKIP() << "no CUDA device";
  constexpr uint32_t kRows = 37, kHeads = 3;
  for (const uint32_t head_dim : {16u, 64u, 128u}) {
    const uint32_t C = kHeads * head_dim;
    std::mt19937 rng(head_dim);
    std::normal_distribution<float> nd(0.0f, 2.0f);
    auto random = [&](size_t count) {
      std::vector<float> v(count);
      for (float& x : v) x = nd(rng);
      return v;
    };
    const DeviceBuffer o = up(random(size_t{kRows} * C)), gate = up(random(size_t{kRows} * C)),
                       w = up(random(head_dim));
    DeviceBuffer out(size_t{kRows} * C * 4), split(size_t{kRows} * 2 * C * 2);
    ASSERT_EQ(cudaMemset(split.get(), 0xff, split.bytes()), cudaSuccess);
    gated_rms_norm(o.as<float>(), gate.as<float>(), w.as<float>(), kRows, kHeads, head_dim, 1e-6f, out.as<float>(),
                   nullptr);
    gated_rms_norm_split(o.as<float>(), gate.as<float>(), w.as<float>(), kRows, kHeads, head_dim, 1e-6f, split.get(),
                         nullptr);
    const std::vector<float> f = down<float>(out);
    const std::vector<uint16_t> s = down<uint16_t>(split);
    for (uint32_t r = 0; r < kRows; ++r) {
      for (uint32_t c = 0; c < C; ++c) {
        const float v = f[size_t{r} * C + c];
        const uint16_t hi = model::f32_to_fp16(v), lo = model::f32_to_fp16((v - model::fp16_to_f32(hi)) * 4096.0f);
        ASSERT_EQ(s[size_t{r} * 2 * C + c], lo) << "head dim " << head_dim << ", row " << r << ", column " << c;
        ASSERT_EQ(s[size_t{r} * 2 * C + C + c], hi) << "head dim " << head_dim << ", row " << r << ", column " << c;
      }
    }
  }
}

}  // namespace
}  // namespace ferry::gpu
#endif
