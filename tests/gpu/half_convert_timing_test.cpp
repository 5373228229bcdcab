// Timing lines (printed, not asserted) of the prefill products' fp16 conversions at the 12-layer GLM
// shapes, as LayerRunner::mm calls them over a 2,048-row chunk: the weights dequantised to fp16 hi + lo
// in the workspace's 2^25-value chunks (KDA q/k/v and output, the dense FFN's down, the shared expert,
// DSA's q_b, the KDA gate's f_b in Q8_0), and the activations split by float_to_half; into dense rows
// and into mm's layout (hi and lo of a row side by side). Each line: the median of 7 event-timed runs of
// 10 back-to-back calls (the first run a warm-up), bytes read + written, and that against the copy
// bandwidth; on sm89+ the same for the e4m3 corrections' conversions (dequantize_to_e4m3_split, half_split_to_e4m3).
// The bits are DequantStoreTest's, FloatToHalf's and E4m3Split's concern.
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "gpu/bandwidth.hpp"
#include "gpu/cuda_memory.hpp"
#include "gpu/kernels.hpp"
#include "model/formats/quant.hpp"
#include "tests/gpu/gpu_test_support.hpp"
#include "tests/gpu/graph_timing.hpp"
#include "tests/gpu/quant_rows.hpp"

namespace ferry::gpu {
namespace {

using ferry::testing::copy_gbs;
using model::GgmlType;

double median_us(const std::function<void(cudaStream_t)>& call) {
  Stream s;
  Event e0, e1;
  std::vector<double> t;
  for (int run = 0; run < 8; ++run) {
    e0.record(s.get());
    for (int i = 0; i < 10; ++i) call(s.get());
    e1.record(s.get());
    s.synchronize();
    if (run > 0) t.push_back(e1.since(e0) * 1000.0 / 10.0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Random blocks of `type` (small finite scales), `rows` x `cols`, filled on the device from one row.
DeviceBuffer random_matrix(GgmlType type, size_t rows, size_t cols) {
  std::mt19937 rng(71);
  const std::vector<uint8_t> one = ferry::testing::random_rows(type, 1, cols, rng);
  DeviceBuffer b(one.size() * rows);
  for (size_t r = 0; r < rows; ++r) {
    EXPECT_EQ(cudaMemcpy(b.as<uint8_t>() + r * one.size(), one.data(), one.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  return b;
}

std::string type_name(GgmlType t) { return std::string(model::ggml_type_traits(t).name); }

TEST(HalfConvertTiming, GlmShapes) {
  if (!testing::have_device()) GTEST_SKIP() << "no CUDA device";
  upload_quant_tables();
  const double copy = copy_gbs();
  // Both halves in one buffer, as the workspace holds them.
  const size_t staging = size_t{32} << 20;
  DeviceBuffer both(staging * 2 * 2), words(16), x8(2048 * 16384 * 2);
  uint16_t* hi = both.as<uint16_t>();
  struct Shape {
    const char* what;
    GgmlType type;
    size_t rows, cols;
  };
  const Shape weights[] = {{"KDA q/k/v", GgmlType::Q4_K, 8192, 4096},
                           {"KDA out", GgmlType::Q4_K, 4096, 8192},
                           {"dense down chunk", GgmlType::Q4_K, 2730, 12288},
                           {"shared gate", GgmlType::Q4_K, 2048, 4096},
                           {"DSA q_b", GgmlType::Q4_K, 16384, 1536},
                           {"KDA f_b", GgmlType::Q8_0, 8192, 128},
                           {"Q6_K", GgmlType::Q6_K, 8192, 4096}};
  for (const Shape& w : weights) {
    const size_t row_bytes = *model::ggml_bytes(w.type, w.cols);
    const DeviceBuffer data = random_matrix(w.type, w.rows, w.cols);
    const DevMatrix m{w.type, data.as<uint8_t>(), static_cast<uint32_t>(w.rows), static_cast<uint32_t>(w.cols),
                      row_bytes};
    const double dense = median_us([&](cudaStream_t s) { dequantize_to_half(m, 0, w.rows, hi, s, hi + staging); });
    const double side =
        median_us([&](cudaStream_t s) { dequantize_to_half(m, 0, w.rows, hi, s, hi + w.cols, 2 * w.cols); });
    const double bytes = double(w.rows) * (row_bytes + 4.0 * w.cols);
    std::printf("[ timing ] dequantize_to_half %s (%s %zu x %zu): %.1f us, %.0f GB/s, %.0f%% of copy (%.0f GB/s); "
                "rows hi | lo side by side %.1f us, %.0f%%\n",
                w.what, type_name(w.type).c_str(), w.rows, w.cols, dense, bytes / dense / 1e3,
                100.0 * bytes / dense / 1e3 / copy, copy, side, 100.0 * bytes / side / 1e3 / copy);
    if (e4m3_split_ready()) {
      // Two passes over the blocks (the largest |value|, then the values): bytes read twice.
      const double e4m3 = median_us([&](cudaStream_t s) {
        dequantize_to_e4m3_split(m, 0, w.rows, hi, 2 * w.cols, words.as<uint32_t>(), words.as<float>() + 1, false, s);
      });
      const double known = median_us([&](cudaStream_t s) {
        dequantize_to_e4m3_split(m, 0, w.rows, hi, 2 * w.cols, words.as<uint32_t>(), words.as<float>() + 1, true, s);
      });
      const double b8 = double(w.rows) * (2.0 * row_bytes + 4.0 * w.cols);
      std::printf("[ timing ] dequantize_to_e4m3_split %s: %.1f us, %.0f%% of copy; amax known %.1f us, %.0f%%\n",
                  w.what, e4m3, 100.0 * b8 / e4m3 / 1e3 / copy, known, 100.0 * bytes / known / 1e3 / copy);
    }
  }
  for (const size_t cols : {size_t{4096}, size_t{8192}, size_t{12288}, size_t{16384}, size_t{128}}) {
    const size_t rows = 2048;
    DeviceBuffer x(rows * cols * 4);
    ASSERT_EQ(cudaMemset(x.get(), 0x3c, x.bytes()), cudaSuccess);
    const float* src = x.as<float>();
    const double dense = median_us([&](cudaStream_t s) { float_to_half(src, cols, rows, cols, hi, s, hi + staging); });
    const double side =
        median_us([&](cudaStream_t s) { float_to_half(src, cols, rows, cols, hi + cols, s, hi, 2 * cols); });
    const double bytes = double(rows) * cols * 8.0;
    std::printf("[ timing ] float_to_half %zu x %zu: %.1f us, %.0f GB/s, %.0f%% of copy; rows lo | hi side by side "
                "%.1f us, %.0f%%\n",
                rows, cols, dense, bytes / dense / 1e3, 100.0 * bytes / dense / 1e3 / copy, side,
                100.0 * bytes / side / 1e3 / copy);
    if (e4m3_split_ready()) {
      // The hi values read for their largest |value|, then both halves read and written as e4m3.
      const double e4m3 = median_us([&](cudaStream_t s) {
        half_split_to_e4m3(hi, 2 * cols, rows, cols, x8.get(), words.as<uint32_t>(), words.as<float>() + 1, s);
      });
      const double b8 = double(rows) * cols * 8.0;
      std::printf("[ timing ] half_split_to_e4m3 %zu x %zu: %.1f us, %.0f%% of copy\n", rows, cols, e4m3,
                  100.0 * b8 / e4m3 / 1e3 / copy);
    }
  }
}

}  // namespace
}  // namespace ferry::gpu
#endif
