// embed_rows into 16-byte aligned copies (float4 stores) and into unaligned ones (scalar stores): the
// same bits, in every copy, and the CPU's dequantised rows (to f32 rounding: the device's K-quant
// decode fuses its multiply-add), for the types a token embedding comes in.
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gpu/cuda_memory.hpp"
#include "gpu/kernels.hpp"
#include "model/formats/quant.hpp"
#include "tests/gpu/gpu_test_support.hpp"
#include "tests/gpu/quant_rows.hpp"

namespace ferry::gpu {
namespace {

using ferry::testing::have_device;
using model::GgmlType;

TEST(EmbedRows, AlignedAndUnalignedCopiesAreTheCpuRows) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  constexpr uint32_t kVocab = 50, kCols = 512, kRows = 21, kCopies = 4;
  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> tok(0, kVocab - 1);
  std::vector<int32_t> tokens(kRows);
  for (int32_t& t : tokens) t = tok(rng);
  DeviceBuffer d_tokens(kRows * 4);
  ASSERT_EQ(cudaMemcpy(d_tokens.get(), tokens.data(), kRows * 4, cudaMemcpyHostToDevice), cudaSuccess);
  for (GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K}) {
    SCOPED_TRACE(model::ggml_type_traits(type).name.data());
    const std::vector<uint8_t> bytes = testing::random_rows(type, kVocab, kCols, rng);
    const size_t row_bytes = bytes.size() / kVocab;
    std::vector<float> want(size_t{kVocab} * kCols);
    for (uint32_t r = 0; r < kVocab; ++r) model::dequantize_row(type, bytes.data() + r * row_bytes, &want[r * kCols], kCols);
    DeviceBuffer d_w(bytes.size()), d_out((size_t{kRows} * kCopies * kCols + 4) * 4);
    ASSERT_EQ(cudaMemcpy(d_w.get(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
    DevMatrix m;
    m.type = type;
    m.data = d_w.as<uint8_t>();
    m.rows = kVocab;
    m.cols = kCols;
    m.row_bytes = row_bytes;
    std::vector<float> first;
    for (uint32_t offset : {0u, 1u}) {  // 1: the copies are not 16-byte aligned
      ASSERT_EQ(cudaMemset(d_out.get(), 0xff, d_out.bytes()), cudaSuccess);
      embed_rows(m, d_tokens.as<int32_t>(), kRows, d_out.as<float>() + offset, kCopies, nullptr);
      std::vector<float> got(size_t{kRows} * kCopies * kCols);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(got.data(), d_out.as<float>() + offset, got.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      for (uint32_t r = 0; r < kRows; ++r) {
        for (uint32_t c = 0; c < kCopies; ++c) {
          const float* row = &got[(size_t{r} * kCopies + c) * kCols];
          ASSERT_EQ(std::memcmp(row, &got[size_t{r} * kCopies * kCols], kCols * 4), 0) << "row " << r << " copy " << c;
          for (uint32_t k = 0; k < kCols; ++k) {
            const float ref = want[size_t(tokens[r]) * kCols + k];
            ASSERT_NEAR(row[k], ref, 1e-6f * (1.0f + std::abs(ref))) << "row " << r << " column " << k;
          }
        }
      }
      if (offset == 0) {
        first = got;
      } else {
        EXPECT_EQ(std::memcmp(got.data(), first.data(), got.size() * 4), 0) << "aligned and unaligned copies differ";
      }
    }
  }
}

}  // namespace
}  // namespace ferry::gpu
#endif
