// The block-reading kernels against the CPU reference dequantizer (model/formats/quant.hpp): for every type
// the device reads, fresh random blocks, every token count the matvec kernels take (and 2-4 rows of
// one launch against the 1-row kernel per row), grouped launches (per head / per expert), and the
// fp16/f32 dequantisers. Outputs are poisoned (NaN) before each run.
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gpu/cuda_memory.hpp"
#include "gpu/kernels.hpp"
#include "model/formats/half.hpp"
#include "model/formats/quant.hpp"
#include "tests/gpu/gpu_test_support.hpp"
#include "tests/gpu/quant_rows.hpp"

namespace ferry::gpu {
namespace {

using ferry::testing::dequant;
using ferry::testing::have_device;
using ferry::testing::random_rows;
using model::GgmlType;

struct Uploaded {
  DeviceBuffer buf;
  DevMatrix m;
};
Uploaded upload(GgmlType type, const std::vector<uint8_t>& data, size_t rows, size_t cols) {
  Uploaded u{DeviceBuffer(data.size()), {}};
  EXPECT_EQ(cudaMemcpy(u.buf.get(), data.data(), data.size(), cudaMemcpyHostToDevice), cudaSuccess);
  u.m.type = type;
  u.m.data = u.buf.as<uint8_t>();
  u.m.rows = static_cast<uint32_t>(rows);
  u.m.cols = static_cast<uint32_t>(cols);
  u.m.row_bytes = *model::ggml_bytes(type, cols);
  return u;
}

class MatvecTest : public ::testing::TestWithParam<GgmlType> {
 protected:
  void SetUp() override {
    if (!have_device()) GTEST_SKIP() << "no CUDA device";
    upload_quant_tables();
  }
};

// The types matvec() reads with int16 activations (gpu/matvec_int16.cu) where rows are whole 256-blocks.
bool int16_type(GgmlType t) {
  return t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q6_K || t == GgmlType::IQ4_XS ||
         t == GgmlType::IQ3_S;
}

// Largest error the int16 activation path may add to W[r] . x: every x rounded by at most half a
// step of its 32-value block (amax / 32767), times |w|.
double int16_rounding_bound(const float* w, const float* x, size_t cols) {
  double bound = 0;
  for (size_t b = 0; b < cols; b += 32) {
    float amax = 0;
    for (size_t c = b; c < b + 32; ++c) amax = std::max(amax, std::abs(x[c]));
    for (size_t c = b; c < b + 32; ++c) bound += std::abs(double(w[c])) * amax / 32767.0 * 0.5;
  }
  return bound;
}

// Runs W x for every token count 1..8 and checks each output against a double-precision dot product:
// to f32 rounding, plus the int16 rounding bound where matvec() quantizes x (expected for token
// counts up to int16_max_tokens).
void check_every_token_count(GgmlType type, size_t rows, size_t cols, bool f32_activations, uint32_t int16_max_tokens,
                             std::mt19937& rng) {
  const auto data = random_rows(type, rows, cols, rng);
  const auto w = dequant(type, data, rows * cols);
  Uploaded u = upload(type, data, rows, cols);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (uint32_t tokens = 1; tokens <= kMaxMatvecTokens; ++tokens) {
    std::vector<float> x(tokens * cols);
    for (float& v : x) v = n(rng);
    DeviceBuffer dx(x.size() * 4), dy(tokens * rows * 4);
    ASSERT_EQ(cudaMemcpy(dx.get(), x.data(), x.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemset(dy.get(), 0xff, tokens * rows * 4), cudaSuccess);  // NaN
    MatvecArgs a;
    a.w = u.m;
    a.x = dx.as<float>();
    a.x_tok_stride = cols;
    a.y = dy.as<float>();
    a.y_tok_stride = rows;
    a.tokens = tokens;
    a.f32_activations = f32_activations;
    const bool expect_int16 = tokens <= int16_max_tokens;
    ASSERT_EQ(matvec_quantizes_activations(a), expect_int16) << tokens << " tokens";
    matvec(a, nullptr);
    std::vector<float> y(tokens * rows);
    ASSERT_EQ(cudaMemcpy(y.data(), dy.get(), y.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    for (uint32_t t = 0; t < tokens; ++t) {
      for (size_t r = 0; r < rows; ++r) {
        double ref = 0, mag = 0;
        for (size_t c = 0; c < cols; ++c) {
          ref += double(w[r * cols + c]) * x[t * cols + c];
          mag += std::abs(double(w[r * cols + c]) * x[t * cols + c]);
        }
        const double rounding = expect_int16 ? int16_rounding_bound(&w[r * cols], &x[t * cols], cols) : 0.0;
        ASSERT_NEAR(y[t * rows + r], ref, 1e-5 * mag + 1e-6 + rounding) << "token " << t << " row " << r << " of " << tokens;
      }
    }
  }
}

TEST_P(MatvecTest, MatchesTheCpuDotProductForEveryTokenCount) {
  const GgmlType type = GetParam();
  std::mt19937 rng(1234 + static_cast<int>(type));
  const size_t cols = model::ggml_type_traits(type).block_elems == 1 ? 520 : 768;
  const bool int16 = int16_type(type);
  check_every_token_count(type, 75, cols, false, int16 ? kMaxMatvecTokens : 0, rng);
  if (int16) {
    check_every_token_count(type, 75, cols, true, 0, rng);
    // Rows of 152 units (several rounds of loads per lane); 8 tokens no longer fit in shared memory,
    // nor 4 beside IQ3_S's 2 KiB grid.
    check_every_token_count(type, 75, 4864, false, type == GgmlType::IQ3_S ? 2 : 4, rng);
  }
}

// Rows of fewer than 32 units share a warp (and rows of exactly one 256-block use 8 lanes in the int16 path).
TEST_P(MatvecTest, NarrowRowsShareAWarp) {
  const GgmlType type = GetParam();
  std::mt19937 rng(4321 + static_cast<int>(type));
  const size_t block = model::ggml_type_traits(type).block_elems;
  for (size_t cols : {block == 1 ? size_t{8} : block, block == 1 ? size_t{96} : 3 * block}) {
    check_every_token_count(type, 37, cols, false, int16_type(type) ? kMaxMatvecTokens : 0, rng);
  }
}

TEST_P(MatvecTest, GroupedLaunchReadsEachGroupsMatrixAndInput) {
  const GgmlType type = GetParam();
  std::mt19937 rng(99 + static_cast<int>(type));
  const size_t cols = 256 * (model::ggml_type_traits(type).block_elems == 1 ? 1 : 2), rows_per = 24, mats = 5;
  const auto data = random_rows(type, rows_per * mats, cols, rng);
  const auto w = dequant(type, data, rows_per * mats * cols);
  Uploaded u = upload(type, data, rows_per * mats, cols);
  // MoE-style: 3 tokens x 2 chosen experts each; expert ids from a device array.
  const std::vector<int32_t> ids = {4, 1, 0, 4, 2, 3};
  const uint32_t k = 2, tokens = 3, groups = tokens * k;
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(tokens * cols);
  for (float& v : x) v = n(rng);
  DeviceBuffer dx(x.size() * 4), dy(groups * rows_per * 4), dids(ids.size() * 4);
  ASSERT_EQ(cudaMemcpy(dx.get(), x.data(), x.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dids.get(), ids.data(), ids.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(dy.get(), 0xff, groups * rows_per * 4), cudaSuccess);
  MatvecArgs a;
  a.w = u.m.slice_rows(0, rows_per);
  a.w_group_bytes = u.m.row_bytes * rows_per;
  a.w_group_index = dids.as<int32_t>();
  a.x = dx.as<float>();
  a.x_group_stride = cols;
  a.x_group_div = k;
  a.y = dy.as<float>();
  a.y_group_stride = rows_per;
  a.groups = groups;
  const bool int16 = matvec_quantizes_activations(a);
  EXPECT_EQ(int16, int16_type(type));
  matvec(a, nullptr);
  std::vector<float> y(groups * rows_per);
  ASSERT_EQ(cudaMemcpy(y.data(), dy.get(), y.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  for (uint32_t g = 0; g < groups; ++g) {
    for (size_t r = 0; r < rows_per; ++r) {
      double ref = 0, mag = 0;
      for (size_t c = 0; c < cols; ++c) {
        const double p = double(w[(ids[g] * rows_per + r) * cols + c]) * x[(g / k) * cols + c];
        ref += p;
        mag += std::abs(p);
      }
      const double rounding =
          int16 ? int16_rounding_bound(&w[(ids[g] * rows_per + r) * cols], &x[(g / k) * cols], cols) : 0.0;
      ASSERT_NEAR(y[g * rows_per + r], ref, 1e-5 * mag + 1e-6 + rounding) << "group " << g << " row " << r;
    }
  }
}

// A verify step's products (a token and up to 3 drafts of one slot in one launch, each weight read
// once for all rows) equal the 1-row decode kernel's on each row alone, to a few f32 roundings: what
// lets greedy tokens with MTP drafts equal those of plain decoding.
TEST_P(MatvecTest, RowsOfOneLaunchGiveTheOneRowProducts) {
  const GgmlType type = GetParam();
  const size_t rows = 96, cols = 512;
  std::mt19937 rng(23);
  const auto data = random_rows(type, rows, cols, rng);
  Uploaded u = upload(type, data, rows, cols);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (uint32_t tokens = 2; tokens <= 4; ++tokens) {
    std::vector<float> x(tokens * cols);
    for (float& v : x) v = n(rng);
    DeviceBuffer dx(x.size() * 4), dy(tokens * rows * 4), d1(tokens * rows * 4);
    ASSERT_EQ(cudaMemcpy(dx.get(), x.data(), x.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemset(dy.get(), 0xff, tokens * rows * 4), cudaSuccess);  // NaN
    ASSERT_EQ(cudaMemset(d1.get(), 0xff, tokens * rows * 4), cudaSuccess);
    MatvecArgs a;
    a.w = u.m;
    a.x = dx.as<float>();
    a.x_tok_stride = cols;
    a.y = dy.as<float>();
    a.y_tok_stride = rows;
    a.tokens = tokens;
    matvec(a, nullptr);
    for (uint32_t t = 0; t < tokens; ++t) {
      MatvecArgs one = a;
      one.x = dx.as<float>() + t * cols;
      one.y = d1.as<float>() + t * rows;
      one.tokens = 1;
      ASSERT_EQ(matvec_quantizes_activations(one), matvec_quantizes_activations(a));
      matvec(one, nullptr);
    }
    std::vector<float> y(tokens * rows), y1(tokens * rows);
    ASSERT_EQ(cudaMemcpy(y.data(), dy.get(), y.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(y1.data(), d1.get(), y1.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < y.size(); ++i) {
      ASSERT_NEAR(y[i], y1[i], 1e-6f * std::abs(y1[i]) + 1e-6f) << "token " << i / rows << " row " << i % rows << " of "
                                                               << tokens;
    }
  }
}

// On the int16 path the rows of one launch have the 1-row kernel's bits exactly (a unit's weights are
// made ready once for all tokens, then each token's product is the 1-row expression): rows of 8, 16
// and 32 lanes, row counts off the blocks' multiples, every token count that fits shared memory; at
// 2,048 and 4,096 columns the 1-row IQ3_S launch stages whole rows in shared memory (gpu/matvec_int16.cu).
TEST_P(MatvecTest, Int16RowsOfOneLaunchHaveTheOneRowBits) {
  const GgmlType type = GetParam();
  if (!int16_type(type)) GTEST_SKIP() << "not an int16-path type";
  std::mt19937 rng(41);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (const size_t cols : {256u, 512u, 2048u, 4096u}) {
    const size_t rows = 301;
    const auto data = random_rows(type, rows, cols, rng);
    Uploaded u = upload(type, data, rows, cols);
    for (uint32_t tokens = 2; tokens <= kMaxMatvecTokens; ++tokens) {
      std::vector<float> x(tokens * cols);
      for (float& v : x) v = n(rng);
      DeviceBuffer dx(x.size() * 4), dy(tokens * rows * 4), d1(tokens * rows * 4);
      ASSERT_EQ(cudaMemcpy(dx.get(), x.data(), x.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemset(dy.get(), 0xff, tokens * rows * 4), cudaSuccess);  // NaN
      ASSERT_EQ(cudaMemset(d1.get(), 0xff, tokens * rows * 4), cudaSuccess);
      MatvecArgs a;
      a.w = u.m;
      a.x = dx.as<float>();
      a.x_tok_stride = cols;
      a.y = dy.as<float>();
      a.y_tok_stride = rows;
      a.tokens = tokens;
      if (!matvec_quantizes_activations(a)) continue;  // x no longer fits shared memory
      matvec(a, nullptr);
      for (uint32_t t = 0; t < tokens; ++t) {
        MatvecArgs one = a;
        one.x = dx.as<float>() + t * cols;
        one.y = d1.as<float>() + t * rows;
        one.tokens = 1;
        ASSERT_TRUE(matvec_quantizes_activations(one));
        matvec(one, nullptr);
      }
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<float> y(tokens * rows), y1(tokens * rows);
      ASSERT_EQ(cudaMemcpy(y.data(), dy.get(), y.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(y1.data(), d1.get(), y1.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      for (size_t i = 0; i < y.size(); ++i) {
        ASSERT_FALSE(std::isnan(y1[i])) << "row " << i % rows << " not written";
        uint32_t b, b1;
        std::memcpy(&b, &y[i], 4);
        std::memcpy(&b1, &y1[i], 4);
        ASSERT_EQ(b, b1) << cols << " cols, token " << i / rows << " row " << i % rows << " of " << tokens << ": "
                         << y[i] << " vs " << y1[i];
      }
    }
  }
}

TEST_P(MatvecTest, DequantisersMatchTheCpuReference) {
  const GgmlType type = GetParam();
  std::mt19937 rng(7 + static_cast<int>(type));
  const size_t cols = 512, rows = 9;
  const auto data = random_rows(type, rows, cols, rng);
  const auto w = dequant(type, data, rows * cols);
  Uploaded u = upload(type, data, rows, cols);
  DeviceBuffer df((rows - 2) * cols * 4), dh((rows - 2) * cols * 2);
  ASSERT_EQ(cudaMemset(df.get(), 0xff, df.bytes()), cudaSuccess);
  ASSERT_EQ(cudaMemset(dh.get(), 0xff, dh.bytes()), cudaSuccess);
  dequantize_to_float(u.m, 2, rows - 2, df.as<float>(), nullptr);
  dequantize_to_half(u.m, 2, rows - 2, dh.get(), nullptr);
  std::vector<float> f((rows - 2) * cols);
  std::vector<uint16_t> h((rows - 2) * cols);
  ASSERT_EQ(cudaMemcpy(f.data(), df.get(), df.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(h.data(), dh.get(), dh.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t i = 0; i < f.size(); ++i) {
    const float ref = w[2 * cols + i];
    ASSERT_NEAR(f[i], ref, 1e-6f * std::abs(ref) + 1e-7f) << i;
    ASSERT_NEAR(model::fp16_to_f32(h[i]), ref, 1e-3f * std::abs(ref) + 1e-6f) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Types, MatvecTest,
                         ::testing::Values(GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0,
                                           GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_XS,
                                           GgmlType::IQ3_S),
                         [](const auto& info) { return std::string(model::ggml_type_traits(info.param).name); });

}  // namespace
}  // namespace ferry::gpu
#endif
