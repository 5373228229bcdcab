// The e4m3 corrections' conversions (sm89+; skipped elsewhere): dequantize_to_e4m3_split's rows hold the fp16 hi
// values dequantize_to_half writes, then the e4m3 of each f32 value (dequantize_to_float's) and of its split's
// lo part (v - hi) * 2^12, times the power of two of the rows' largest |value|; half_split_to_e4m3 gives the e4m3
// of a staged split's lo and hi values times that of the largest |hi|. Every byte against the CPU (e4m3_host.hpp),
// and each descale the scale's inverse; with the largest |value| known from a previous call, the same bytes. Outputs are poisoned before each run.
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gpu/cuda_memory.hpp"
#include "gpu/kernels.hpp"
#include "model/formats/half.hpp"
#include "model/formats/quant.hpp"
#include "tests/gpu/e4m3_host.hpp"
#include "tests/gpu/gpu_test_support.hpp"
#include "tests/gpu/quant_rows.hpp"

namespace ferry::gpu {
namespace {

using model::GgmlType;

template <class T>
std::vector<T> fetch(const void* p, size_t n) {
  std::vector<T> v(n);
  EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

bool ready() {
  if (!testing::have_device()) return false;
  upload_quant_tables();
  return e4m3_split_ready();
}

class E4m3SplitWeights : public ::testing::TestWithParam<GgmlType> {};

TEST_P(E4m3SplitWeights, GiveTheCpuE4m3OfTheirValuesAndLoParts) {
  if (!ready()) GTEST_SKIP() << "no sm89+ device or code";
  const GgmlType type = GetParam();
  const std::string name(model::ggml_type_traits(type).name);
  for (const auto& [rows, cols, row0] : {std::tuple<size_t, size_t, size_t>{300, 256, 3}, {7, 4096, 0}, {64, 768, 5}}) {
    std::mt19937 rng(57 + static_cast<int>(type) + static_cast<int>(rows));
    const std::vector<uint8_t> data = testing::random_rows(type, rows, cols, rng);
    DeviceBuffer blocks(data.size());
    ASSERT_EQ(cudaMemcpy(blocks.get(), data.data(), data.size(), cudaMemcpyHostToDevice), cudaSuccess);
    DevMatrix m;
    m.type = type;
    m.data = blocks.as<uint8_t>();
    m.rows = static_cast<uint32_t>(rows);
    m.cols = static_cast<uint32_t>(cols);
    m.row_bytes = *model::ggml_bytes(type, cols);
    const size_t n = rows - row0;
    DeviceBuffer f(n * cols * 4), out(n * 2 * cols * 2), words(16);
    ASSERT_EQ(cudaMemset(out.get(), 0xff, out.bytes()), cudaSuccess);
    ASSERT_EQ(cudaMemset(words.get(), 0xff, words.bytes()), cudaSuccess);
    dequantize_to_float(m, row0, n, f.as<float>(), nullptr);
    ASSERT_TRUE(dequantize_to_e4m3_split(m, row0, n, out.get(), 2 * cols, words.as<uint32_t>(), words.as<float>() + 1,
                                         false, nullptr))
        << name;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> v = fetch<float>(f.get(), n * cols);
    const std::vector<uint16_t> row16 = fetch<uint16_t>(out.get(), n * 2 * cols);
    const std::vector<uint8_t> row8 = fetch<uint8_t>(out.get(), n * 4 * cols);
    const std::vector<float> descale = fetch<float>(words.as<float>() + 1, 1);
    float amax = 0.0f;
    for (float x : v) amax = std::max(amax, std::fabs(x));
    const float s = testing::e4m3_scale(amax);
    EXPECT_EQ(descale[0], 1.0f / s) << name;
    for (size_t r = 0; r < n; ++r) {
      for (size_t c = 0; c < cols; ++c) {
        const float x = v[r * cols + c];
        const uint16_t hi = model::f32_to_fp16(x);
        const float lo = (x - model::fp16_to_f32(hi)) * 4096.0f;
        ASSERT_EQ(row16[r * 2 * cols + c], hi) << name << " hi at " << r << ", " << c;
        ASSERT_EQ(row8[r * 4 * cols + 2 * cols + c], testing::f32_to_e4m3(x * s)) << name << " e4m3 at " << r << ", " << c;
        ASSERT_EQ(row8[r * 4 * cols + 3 * cols + c], testing::f32_to_e4m3(lo * s))
            << name << " e4m3 lo at " << r << ", " << c;
      }
    }
    // Again with the rows' largest |value| known (mm_staged's later products of the chunk): the same bytes.
    ASSERT_EQ(cudaMemset(out.get(), 0xff, out.bytes()), cudaSuccess);
    ASSERT_EQ(cudaMemset(words.as<float>() + 1, 0xff, sizeof(float)), cudaSuccess);
    ASSERT_TRUE(dequantize_to_e4m3_split(m, row0, n, out.get(), 2 * cols, words.as<uint32_t>(), words.as<float>() + 1,
                                         true, nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(fetch<uint8_t>(out.get(), n * 4 * cols), row8) << name << ": amax known";
    EXPECT_EQ(fetch<float>(words.as<float>() + 1, 1), descale) << name << ": amax known";
  }
}

INSTANTIATE_TEST_SUITE_P(Types, E4m3SplitWeights,
                         ::testing::Values(GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K),
                         [](const auto& info) { return std::string(model::ggml_type_traits(info.param).name); });

// Types without the pieces kernel say so and launch nothing.
TEST(E4m3Split, TypesWithoutPiecesAreRefused) {
  if (!ready()) GTEST_SKIP() << "no sm89+ device or code";
  std::mt19937 rng(5);
  const std::vector<uint8_t> data = testing::random_rows(GgmlType::IQ4_XS, 4, 256, rng);
  DeviceBuffer blocks(data.size()), out(4 * 2 * 256 * 2), words(16);
  ASSERT_EQ(cudaMemcpy(blocks.get(), data.data(), data.size(), cudaMemcpyHostToDevice), cudaSuccess);
  DevMatrix m;
  m.type = GgmlType::IQ4_XS;
  m.data = blocks.as<uint8_t>();
  m.rows = 4;
  m.cols = 256;
  m.row_bytes = *model::ggml_bytes(m.type, 256);
  EXPECT_FALSE(dequantize_to_e4m3_split(m, 0, 4, out.get(), 512, words.as<uint32_t>(), words.as<float>() + 1, false,
                                         nullptr));
}

// An input split by float_to_half into mm_staged's [lo | hi] rows, then to e4m3; values across a wide range
// (the scale follows the largest), zeros and signs.
TEST(E4m3Split, InputGivesTheCpuE4m3OfItsSplit) {
  if (!ready()) GTEST_SKIP() << "no sm89+ device or code";
  std::mt19937 rng(61);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-12, 6);
  for (const auto& [rows, cols] : {std::pair<size_t, size_t>{37, 4096}, {300, 128}, {9, 16384}}) {
    std::vector<float> x(rows * cols);
    for (float& v : x) v = std::ldexp(nd(rng), expo(rng));
    x[0] = 0.0f, x[1] = -0.0f, x[2] = 300.0f;
    DeviceBuffer d_x(x.size() * 4), staged(rows * 2 * cols * 2), out(rows * 2 * cols), words(16);
    ASSERT_EQ(cudaMemcpy(d_x.get(), x.data(), x.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemset(out.get(), 0xff, out.bytes()), cudaSuccess);
    uint16_t* st = staged.as<uint16_t>();
    float_to_half(d_x.as<float>(), cols, rows, cols, st + cols, nullptr, st, 2 * cols);
    half_split_to_e4m3(st, 2 * cols, rows, cols, out.get(), words.as<uint32_t>(), words.as<float>() + 1, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint16_t> split = fetch<uint16_t>(st, rows * 2 * cols);
    const std::vector<uint8_t> e = fetch<uint8_t>(out.get(), rows * 2 * cols);
    const std::vector<float> descale = fetch<float>(words.as<float>() + 1, 1);
    float amax = 0.0f;
    for (size_t r = 0; r < rows; ++r) {
      for (size_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(model::fp16_to_f32(split[r * 2 * cols + cols + c])));
    }
    const float s = testing::e4m3_scale(amax);
    EXPECT_EQ(descale[0], 1.0f / s);
    for (size_t r = 0; r < rows; ++r) {
      for (size_t c = 0; c < cols; ++c) {
        const float lo = model::fp16_to_f32(split[r * 2 * cols + c]), hi = model::fp16_to_f32(split[r * 2 * cols + cols + c]);
        ASSERT_EQ(e[r * 2 * cols + c], testing::f32_to_e4m3(lo * s)) << "lo at " << r << ", " << c;
        ASSERT_EQ(e[r * 2 * cols + cols + c], testing::f32_to_e4m3(hi * s)) << "hi at " << r << ", " << c;
      }
    }
  }
}

}  // namespace
}  // namespace ferry::gpu
#endif
