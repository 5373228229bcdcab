// The prefill products' dequantisation to fp16 hi + lo (gpu/matvec.cu, dequantize_to_half; and
// dequantize_to_float): the 16-byte stores taken for aligned outputs give the bits of the element-wise
// stores taken otherwise (outputs one element off alignment), hi and lo alike, for every type the
// device reads; and hi + lo / 2^12 is the CPU's dequantised value to ~22 bits. Outputs are poisoned
// (NaN) before each run.
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu/cuda_memory.hpp"
#include "gpu/kernels.hpp"
#include "model/formats/half.hpp"
#include "model/formats/quant.hpp"
#include "tests/gpu/gpu_test_support.hpp"
#include "tests/gpu/quant_rows.hpp"

namespace ferry::gpu {
namespace {

using model::GgmlType;

class DequantStoreTest : public ::testing::TestWithParam<GgmlType> {
 protected:
  void SetUp() override {
    if (!testing::have_device()) GTEST_SKIP() << "no CUDA device";
    upload_quant_tables();
  }
};

template <class T>
std::vector<T> fetch(const DeviceBuffer& b, size_t offset, size_t n) {
  std::vector<T> v(n);
  EXPECT_EQ(cudaMemcpy(v.data(), b.as<T>() + offset, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

TEST_P(DequantStoreTest, VectorStoresGiveTheElementWiseBits) {
  const GgmlType type = GetParam();
  std::mt19937 rng(31 + static_cast<int>(type));
  const size_t cols = 768, rows = 7, row0 = 2, n = (rows - row0) * cols;
  const std::vector<uint8_t> data = testing::random_rows(type, rows, cols, rng);
  const std::vector<float> w = testing::dequant(type, data, rows * cols);
  DeviceBuffer blocks(data.size());
  ASSERT_EQ(cudaMemcpy(blocks.get(), data.data(), data.size(), cudaMemcpyHostToDevice), cudaSuccess);
  DevMatrix m;
  m.type = type;
  m.data = blocks.as<uint8_t>();
  m.rows = static_cast<uint32_t>(rows);
  m.cols = static_cast<uint32_t>(cols);
  m.row_bytes = *model::ggml_bytes(type, cols);

  // Aligned (offset 0: 16-byte stores) and one element off (element-wise stores).
  DeviceBuffer hi((n + 8) * 2), lo((n + 8) * 2), f((n + 4) * 4);
  std::vector<uint16_t> h_at[2], l_at[2];
  std::vector<float> f_at[2];
  for (int off = 0; off < 2; ++off) {
    ASSERT_EQ(cudaMemset(hi.get(), 0xff, hi.bytes()), cudaSuccess);
    ASSERT_EQ(cudaMemset(lo.get(), 0xff, lo.bytes()), cudaSuccess);
    ASSERT_EQ(cudaMemset(f.get(), 0xff, f.bytes()), cudaSuccess);
    dequantize_to_half(m, row0, rows - row0, hi.as<uint16_t>() + off, nullptr, lo.as<uint16_t>() + off);
    dequantize_to_float(m, row0, rows - row0, f.as<float>() + off, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    h_at[off] = fetch<uint16_t>(hi, off, n);
    l_at[off] = fetch<uint16_t>(lo, off, n);
    f_at[off] = fetch<float>(f, off, n);
  }
  const std::string name(model::ggml_type_traits(type).name);
  EXPECT_EQ(h_at[0], h_at[1]) << name << ": hi";
  EXPECT_EQ(l_at[0], l_at[1]) << name << ": lo";
  EXPECT_EQ(0, std::memcmp(f_at[0].data(), f_at[1].data(), n * sizeof(float))) << name << ": f32";
  for (size_t i = 0; i < n; ++i) {
    const float ref = w[row0 * cols + i];
    const double v = double(model::fp16_to_f32(h_at[0][i])) + double(model::fp16_to_f32(l_at[0][i])) / 4096.0;
    ASSERT_NEAR(v, ref, 1e-6 * std::abs(ref) + 1e-9) << name << " element " << i;
    ASSERT_NEAR(f_at[0][i], ref, 1e-6f * std::abs(ref) + 1e-7f) << name << " element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Types, DequantStoreTest,
                         ::testing::Values(GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0,
                                           GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_XS,
                                           GgmlType::IQ3_S),
                         [](const auto& info) { return std::string(model::ggml_type_traits(info.param).name); });

}  // namespace
}  // namespace ferry::gpu
#endif
