// The prefill products' conversions to fp16 hi + lo (gpu/matvec.cu: dequantize_to_half, with
// dequantize_to_float, and float_to_half): the vector kernels taken for aligned outputs give the bits of
// the element-wise ones taken otherwise (outputs one element off alignment), hi and lo alike, for every
// type the device reads; both are the split of half_split.cuh applied to the f32 values (the device's
// dequantised f32, or the input), computed here on the CPU, so every path gives the same bits; and
// hi + lo / 2^12 is the CPU's dequantised value to ~22 bits. Outputs are poisoned (NaN) before each run.
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <tuple>
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

// half_split.cuh's split on the CPU: hi = fp16(v), lo = fp16((v - hi) * 2^12), both rounded to nearest even.
void cpu_split(float v, uint16_t& hi, uint16_t& lo) {
  hi = model::f32_to_fp16(v);
  lo = model::f32_to_fp16((v - model::fp16_to_f32(hi)) * 4096.0f);
}

template <class T>
std::vector<T> fetch(const DeviceBuffer& b, size_t offset, size_t n) {
  std::vector<T> v(n);
  EXPECT_EQ(cudaMemcpy(v.data(), b.as<T>() + offset, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

// Rows of 768 and of 256 columns, the last warp of units partial in the first two calls; and into rows
// of hi then lo values side by side, which give the same bits.
void check_vector_stores(GgmlType type, size_t cols, size_t rows, size_t row0) {
  std::mt19937 rng(31 + static_cast<int>(type) + static_cast<int>(rows));
  const size_t n = (rows - row0) * cols;
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
    uint16_t hi = 0, lo = 0;
    cpu_split(f_at[0][i], hi, lo);
    ASSERT_EQ(h_at[0][i], hi) << name << " element " << i << ": hi is not the split of the f32 value";
    ASSERT_EQ(l_at[0][i], lo) << name << " element " << i << ": lo is not the split of the f32 value";
  }
  // LayerRunner::mm's layout: each row its hi then its lo values, rows 2 * cols apart.
  const size_t out_rows = rows - row0;
  DeviceBuffer both(out_rows * 2 * cols * 2);
  ASSERT_EQ(cudaMemset(both.get(), 0xff, both.bytes()), cudaSuccess);
  dequantize_to_half(m, row0, out_rows, both.as<uint16_t>(), nullptr, both.as<uint16_t>() + cols, 2 * cols);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint16_t> side = fetch<uint16_t>(both, 0, out_rows * 2 * cols);
  for (size_t r = 0; r < out_rows; ++r) {
    for (size_t c = 0; c < cols; ++c) {
      ASSERT_EQ(side[r * 2 * cols + c], h_at[0][r * cols + c]) << name << " side by side: hi at " << r << ", " << c;
      ASSERT_EQ(side[r * 2 * cols + cols + c], l_at[0][r * cols + c]) << name << " side by side: lo at " << r;
    }
  }
}

TEST_P(DequantStoreTest, VectorStoresGiveTheElementWiseBits) {
  check_vector_stores(GetParam(), 768, 7, 2);
  check_vector_stores(GetParam(), 256, 300, 3);
  check_vector_stores(GetParam(), 256, 64, 0);
}

// float_to_half over rows `stride` apart: the vector kernel (aligned rows of a multiple of 8 values)
// and the element-wise one (a source one float off alignment, rows of 8k + 3 values) against the CPU's
// split, values across fp16's range: subnormal, overflowing, ties, signed zeros; into dense rows, and
// into LayerRunner::mm's layout (each row its lo then its hi values, rows 2 * cols apart).
TEST(FloatToHalf, BothKernelsGiveTheCpuSplit) {
  if (!testing::have_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(41);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-30, 17);
  for (const auto& [rows, cols, stride, off] : {std::tuple<size_t, size_t, size_t, size_t>{37, 4096, 4096, 0},
                                                {300, 128, 160, 0}, {19, 131, 140, 1}, {5, 2051, 2051, 1}}) {
    std::vector<float> src(rows * stride + off);
    for (float& v : src) v = std::ldexp(nd(rng), expo(rng));
    const float edges[] = {0.0f, -0.0f, 65504.0f, 65520.0f, -70000.0f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f, 0x1p-14f,
                           1.0f + 0x1p-11f, 1.0f + 0x3p-11f, 2049.0f / 4096.0f, std::nextafter(1.0f, 2.0f)};
    for (size_t i = 0; i < std::size(edges); ++i) src[off + i] = edges[i];
    DeviceBuffer d_src(src.size() * 4), hi(rows * cols * 2), lo(rows * cols * 2), both(rows * 2 * cols * 2);
    ASSERT_EQ(cudaMemcpy(d_src.get(), src.data(), src.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemset(hi.get(), 0xff, hi.bytes()), cudaSuccess);
    ASSERT_EQ(cudaMemset(lo.get(), 0xff, lo.bytes()), cudaSuccess);
    ASSERT_EQ(cudaMemset(both.get(), 0xff, both.bytes()), cudaSuccess);
    float_to_half(d_src.as<float>() + off, stride, rows, cols, hi.get(), nullptr, lo.get());
    float_to_half(d_src.as<float>() + off, stride, rows, cols, both.as<uint16_t>() + cols, nullptr, both.get(),
                  2 * cols);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint16_t> h = fetch<uint16_t>(hi, 0, rows * cols), l = fetch<uint16_t>(lo, 0, rows * cols);
    const std::vector<uint16_t> side = fetch<uint16_t>(both, 0, rows * 2 * cols);
    for (size_t r = 0; r < rows; ++r) {
      for (size_t c = 0; c < cols; ++c) {
        uint16_t want_hi = 0, want_lo = 0;
        cpu_split(src[off + r * stride + c], want_hi, want_lo);
        ASSERT_EQ(h[r * cols + c], want_hi) << rows << " x " << cols << " at " << r << ", " << c;
        ASSERT_EQ(l[r * cols + c], want_lo) << rows << " x " << cols << " at " << r << ", " << c;
        ASSERT_EQ(side[r * 2 * cols + cols + c], want_hi) << rows << " x " << cols << " side by side at " << r;
        ASSERT_EQ(side[r * 2 * cols + c], want_lo) << rows << " x " << cols << " side by side at " << r;
      }
    }
  }
}

// float_to_half_groups: each (row, group) block of a source row its own output row, both kernels (blocks of
// 8k values 16-byte aligned; of 8k + 5 values), against the CPU's split; into mm_grouped's layout (each output
// row its lo then its hi values).
TEST(FloatToHalf, GroupsGiveTheCpuSplitOfEachBlock) {
  if (!testing::have_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(43);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const auto& [rows, groups, cols, xg] : {std::tuple<size_t, uint32_t, size_t, size_t>{37, 5, 64, 72},
                                               {9, 3, 13, 16}}) {
    const size_t stride = groups * xg + 4;
    std::vector<float> src(rows * stride);
    for (float& v : src) v = nd(rng);
    const size_t out_rows = rows * groups;
    DeviceBuffer d_src(src.size() * 4), both(out_rows * 2 * cols * 2);
    ASSERT_EQ(cudaMemcpy(d_src.get(), src.data(), src.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemset(both.get(), 0xff, both.bytes()), cudaSuccess);
    float_to_half_groups(d_src.as<float>(), stride, xg, rows, groups, cols, both.as<uint16_t>() + cols, nullptr,
                         both.get(), 2 * cols);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint16_t> side = fetch<uint16_t>(both, 0, out_rows * 2 * cols);
    for (size_t r = 0; r < rows; ++r) {
      for (uint32_t g = 0; g < groups; ++g) {
        for (size_t c = 0; c < cols; ++c) {
          uint16_t want_hi = 0, want_lo = 0;
          cpu_split(src[r * stride + g * xg + c], want_hi, want_lo);
          const size_t at = (r * groups + g) * 2 * cols;
          ASSERT_EQ(side[at + c], want_lo) << cols << " columns, row " << r << " group " << g << " at " << c;
          ASSERT_EQ(side[at + cols + c], want_hi) << cols << " columns, row " << r << " group " << g << " at " << c;
        }
      }
    }
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
