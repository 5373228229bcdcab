// swiglu() over rows laid end to end (the four-values-a-thread kernel) against rows apart (the element
// kernel): the same bits, over values inside and past the clamp and a row count whose values do not
// fill the last block. swiglu_split: the CPU's split (half_split.cuh) of swiglu()'s values, in
// LayerRunner::mm_staged's layout.
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gpu/cuda_memory.hpp"
#include "gpu/kernels.hpp"
#include "model/formats/half.hpp"
#include "tests/gpu/gpu_test_support.hpp"

namespace ferry::gpu {
namespace {

using ferry::testing::have_device;

TEST(Swiglu, RowsEndToEndGiveTheElementKernelsBits) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  constexpr uint32_t kRows = 37, kN = 1000, kPad = 4;
  constexpr float kLimit = 10.0f;
  std::mt19937 rng(9);
  std::normal_distribution<float> n(0.0f, 8.0f);
  std::vector<float> gate(size_t{kRows} * kN), up(gate.size());
  for (float& v : gate) v = n(rng);
  for (float& v : up) v = n(rng);
  // The same rows kPad floats apart: the element kernel.
  std::vector<float> gate_apart(size_t{kRows} * (kN + kPad)), up_apart(gate_apart.size());
  for (uint32_t r = 0; r < kRows; ++r) {
    std::memcpy(&gate_apart[size_t{r} * (kN + kPad)], &gate[size_t{r} * kN], kN * 4);
    std::memcpy(&up_apart[size_t{r} * (kN + kPad)], &up[size_t{r} * kN], kN * 4);
  }
  DeviceBuffer d_gate(gate.size() * 4), d_up(up.size() * 4), d_gate_apart(gate_apart.size() * 4),
      d_up_apart(up_apart.size() * 4);
  ASSERT_EQ(cudaMemcpy(d_gate.get(), gate.data(), gate.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_up.get(), up.data(), up.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_gate_apart.get(), gate_apart.data(), gate_apart.size() * 4, cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_up_apart.get(), up_apart.data(), up_apart.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  swiglu(d_gate.as<float>(), d_up.as<float>(), kN, kRows, kN, kLimit, nullptr);
  swiglu(d_gate_apart.as<float>(), d_up_apart.as<float>(), kN + kPad, kRows, kN, kLimit, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(gate.data(), d_gate.get(), gate.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(gate_apart.data(), d_gate_apart.get(), gate_apart.size() * 4, cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (uint32_t r = 0; r < kRows; ++r) {
    ASSERT_EQ(std::memcmp(&gate[size_t{r} * kN], &gate_apart[size_t{r} * (kN + kPad)], kN * 4), 0) << "row " << r;
  }
}

TEST(Swiglu, SplitGivesTheCpuSplitOfTheValues) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  constexpr uint32_t kRows = 37, kN = 1000;
  constexpr float kLimit = 10.0f;
  std::mt19937 rng(11);
  std::normal_distribution<float> n(0.0f, 8.0f);
  std::vector<float> gate(size_t{kRows} * kN), up(gate.size());
  for (float& v : gate) v = n(rng);
  for (float& v : up) v = n(rng);
  DeviceBuffer d_gate(gate.size() * 4), d_up(up.size() * 4), d_split(gate.size() * 2 * 2);
  ASSERT_EQ(cudaMemcpy(d_gate.get(), gate.data(), gate.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_up.get(), up.data(), up.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(d_split.get(), 0xff, d_split.bytes()), cudaSuccess);
  ASSERT_TRUE(swiglu_split(d_gate.as<float>(), d_up.as<float>(), kRows, kN, kLimit, d_split.get(), nullptr));
  EXPECT_FALSE(swiglu_split(d_gate.as<float>(), d_up.as<float>(), kRows, kN - 4, kLimit, d_split.get(), nullptr));
  swiglu(d_gate.as<float>(), d_up.as<float>(), kN, kRows, kN, kLimit, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint16_t> split(gate.size() * 2);
  ASSERT_EQ(cudaMemcpy(gate.data(), d_gate.get(), gate.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(split.data(), d_split.get(), split.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  for (uint32_t r = 0; r < kRows; ++r) {
    for (uint32_t c = 0; c < kN; ++c) {
      const float v = gate[size_t{r} * kN + c];
      const uint16_t hi = model::f32_to_fp16(v), lo = model::f32_to_fp16((v - model::fp16_to_f32(hi)) * 4096.0f);
      ASSERT_EQ(split[size_t{r} * 2 * kN + c], lo) << "row " << r << ", column " << c;
      ASSERT_EQ(split[size_t{r} * 2 * kN + kN + c], hi) << "row " << r << ", column " << c;
    }
  }
}

}  // namespace
}  // namespace ferry::gpu
#endif
