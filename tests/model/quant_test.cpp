// Hand-built blocks with known values for every dequantizer, plus the API's preconditions. The
// bit-exact comparison with gguf-py on random blocks is in tests/python/test_quants.py.
#include "model/formats/quant.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "model/formats/ggml_type.hpp"
#include "model/formats/half.hpp"
#include "model/formats/iq_grids.hpp"

using namespace ferry::model;

namespace {

std::vector<uint8_t> zero_block(GgmlType t) { return std::vector<uint8_t>(ggml_type_traits(t).block_bytes, 0); }

void put_f16(std::vector<uint8_t>& b, size_t off, float v) {
  const uint16_t h = f32_to_fp16(v);
  std::memcpy(b.data() + off, &h, 2);
}
void put_f16_bits(std::vector<uint8_t>& b, size_t off, uint16_t h) { std::memcpy(b.data() + off, &h, 2); }

std::vector<float> dequant(GgmlType t, const std::vector<uint8_t>& b) {
  const size_t n = b.size() / ggml_type_traits(t).block_bytes * ggml_type_traits(t).block_elems;
  std::vector<float> out(n, -12345.0f);
  dequantize_row(t, b.data(), out.data(), n);
  return out;
}

}  // namespace

TEST(Quant, SupportedTypes) {
  for (auto t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_K,
                 GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_XS, GgmlType::IQ3_S, GgmlType::IQ2_XXS}) {
    EXPECT_TRUE(can_dequantize(t)) << ggml_type_traits(t).name;
  }
  EXPECT_FALSE(can_dequantize(GgmlType::Q2_K));
  EXPECT_FALSE(can_dequantize(GgmlType::IQ1_S));
  EXPECT_FALSE(can_quantize(GgmlType::IQ2_XXS));
  EXPECT_FALSE(can_quantize(GgmlType::Q4_0));
  for (auto t : {GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::BF16, GgmlType::F16,
                 GgmlType::IQ4_XS, GgmlType::IQ3_S}) {
    EXPECT_TRUE(can_quantize(t)) << ggml_type_traits(t).name;
  }
  EXPECT_TRUE(quantize_takes_importance(GgmlType::IQ3_S));
  EXPECT_FALSE(quantize_takes_importance(GgmlType::Q4_K));
}

TEST(Quant, PreconditionsThrow) {
  std::vector<uint8_t> buf(1024);
  std::vector<float> out(512);
  EXPECT_THROW(dequantize_row(GgmlType::Q4_K, buf.data(), out.data(), 255), std::invalid_argument);
  EXPECT_THROW(dequantize_row(GgmlType::Q2_K, buf.data(), out.data(), 256), std::invalid_argument);
  EXPECT_THROW(dequantize_row(static_cast<GgmlType>(4), buf.data(), out.data(), 32), std::invalid_argument);
  EXPECT_THROW(quantize_row(GgmlType::Q8_0, out.data(), buf.data(), 31), std::invalid_argument);
  EXPECT_THROW(quantize_row(GgmlType::IQ2_XXS, out.data(), buf.data(), 256), std::invalid_argument);
  std::vector<float> importance(256, 1.0f);
  EXPECT_THROW(quantize_row(GgmlType::Q4_K, out.data(), buf.data(), 256, importance.data()), std::invalid_argument);
  EXPECT_NO_THROW(quantize_row(GgmlType::IQ4_XS, out.data(), buf.data(), 256, importance.data()));
  try {
    dequantize_row(GgmlType::Q8_0, buf.data(), out.data(), 33);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "dequantize_row: 33 elements is not a whole number of q8_0 blocks of 32");
  }
}

TEST(Quant, Q8_0) {
  auto b = zero_block(GgmlType::Q8_0);
  put_f16(b, 0, 0.5f);
  for (int j = 0; j < 32; ++j) b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(j * 8 - 128));
  const auto y = dequant(GgmlType::Q8_0, b);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], 0.5f * static_cast<float>(j * 8 - 128)) << j;
}

TEST(Quant, ZeroScaleGivesZerosOfTheRightSign) {
  auto b = zero_block(GgmlType::Q8_0);
  for (int j = 0; j < 32; ++j) b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(j - 16));
  auto y = dequant(GgmlType::Q8_0, b);
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(y[j], 0.0f);
    EXPECT_EQ(std::signbit(y[j]), j < 16) << j;  // (-q) * +0 = -0, as numpy computes it
  }
}

TEST(Quant, NonFiniteScalesPropagateLikeIeee) {
  auto b = zero_block(GgmlType::Q8_0);
  b[2] = 0;     // 0 * inf = NaN
  b[3] = 1;     // 1 * inf = inf
  b[4] = 0xff;  // -1 * inf = -inf
  put_f16_bits(b, 0, 0x7c00);
  auto y = dequant(GgmlType::Q8_0, b);
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_EQ(y[1], std::numeric_limits<float>::infinity());
  EXPECT_EQ(y[2], -std::numeric_limits<float>::infinity());
  put_f16_bits(b, 0, 0x7e00);
  y = dequant(GgmlType::Q8_0, b);
  for (float v : y) EXPECT_TRUE(std::isnan(v));
}

TEST(Quant, SubnormalFp16Scale) {
  auto b = zero_block(GgmlType::Q4_0);
  put_f16_bits(b, 0, 0x0001);  // 2^-24
  for (int j = 0; j < 16; ++j) b[2 + j] = 0xf0;  // low nibble 0 -> -8, high 15 -> 7
  const auto y = dequant(GgmlType::Q4_0, b);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], -8 * 0x1p-24f);
    EXPECT_EQ(y[j + 16], 7 * 0x1p-24f);
  }
}

TEST(Quant, Q4_KMaxNibblesAndSixBitScales) {
  auto b = zero_block(GgmlType::Q4_K);
  put_f16(b, 0, 0.25f);
  put_f16(b, 2, 0.5f);
  std::memset(b.data() + 4, 0xff, 12);  // every scale and min 63
  b[4 + 0] = 0x01;                      // sub-block 0: scale 1 (and its top bits feed sub-block 4's scale: 0)
  b[4 + 4] = 0x02;                      // sub-block 0: min 2 (top bits feed sub-block 4's min: 0)
  std::memset(b.data() + 16, 0xff, 128);
  const auto y = dequant(GgmlType::Q4_K, b);
  EXPECT_EQ(y[0], 0.25f * 1 * 15 - 0.5f * 2);
  EXPECT_EQ(y[32], 0.25f * 63 * 15 - 0.5f * 63);      // sub-block 1, high nibbles of qs[0..32)
  EXPECT_EQ(y[4 * 32], 0.25f * 15 * 15 - 0.5f * 15);  // sub-block 4: low 4 bits of scale byte 8 only
  EXPECT_EQ(y[255], 0.25f * 63 * 15 - 0.5f * 63);
}

TEST(Quant, Q5_KHighBitAddsSixteen) {
  auto b = zero_block(GgmlType::Q5_K);
  put_f16(b, 0, 1.0f);
  put_f16(b, 2, 0.0f);
  for (int j = 0; j < 8; ++j) b[4 + j] = 1;  // scales of sub-blocks 0..3 = 1, mins 1; 4..7 take bytes 8..11
  b[4 + 8] = 0x01;                           // sub-block 4: scale 1, min 0
  b[16 + 3] = 0x11;                          // qh[3]: bit 0 (sub-block 0) and bit 4 (sub-block 4)
  b[48 + 3] = 0x05;                          // qs[3]: low nibble 5 (sub-block 0), high 0 (sub-block 1)
  b[48 + 64 + 3] = 0x07;                     // sub-block 4, element 3
  const auto y = dequant(GgmlType::Q5_K, b);
  EXPECT_EQ(y[3], 21.0f);        // 5 + 16
  EXPECT_EQ(y[32 + 3], 0.0f);    // sub-block 1 had no high bit
  EXPECT_EQ(y[128 + 3], 23.0f);  // 7 + 16
  EXPECT_EQ(y[4], 0.0f);
}

TEST(Quant, Q6_KExtremes) {
  auto b = zero_block(GgmlType::Q6_K);
  put_f16(b, 208, 2.0f);
  for (int s = 0; s < 16; ++s) b[192 + s] = static_cast<uint8_t>(static_cast<int8_t>(s % 2 ? 127 : -128));
  std::memset(b.data(), 0xff, 192);  // every q = 63 -> +31
  auto y = dequant(GgmlType::Q6_K, b);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], 2.0f * ((e / 16) % 2 ? 127 : -128) * 31) << e;
  std::memset(b.data(), 0, 192);  // every q = 0 -> -32
  y = dequant(GgmlType::Q6_K, b);
  EXPECT_EQ(y[0], 2.0f * -128 * -32);
}

TEST(Quant, Iq4XsScalesAndLevels) {
  auto b = zero_block(GgmlType::IQ4_XS);
  put_f16(b, 0, 0.5f);
  const uint16_t scales_h = 0b11'00'00'00'00'00'00'10;  // sub-block 0: high bits 2; sub-block 7: 3
  std::memcpy(b.data() + 2, &scales_h, 2);
  b[4 + 0] = 0x05;  // sub-block 0 low bits 5 -> ls = 5 | 2<<4 = 37
  b[4 + 3] = 0xf0;  // sub-block 7 low bits 15 -> ls = 63
  b[8 + 0] = 0xf0;  // element 0: level 0, element 16: level 15
  const auto y = dequant(GgmlType::IQ4_XS, b);
  EXPECT_EQ(y[0], 0.5f * 5 * kIq4nlValues[0]);
  EXPECT_EQ(y[16], 0.5f * 5 * kIq4nlValues[15]);
  EXPECT_EQ(y[255], 0.5f * 31 * kIq4nlValues[0]);
  EXPECT_EQ(y[32], 0.5f * -32 * kIq4nlValues[0]);  // sub-block 1: ls 0
}

TEST(Quant, Iq3SGridIndexHighBitAndSigns) {
  auto b = zero_block(GgmlType::IQ3_S);
  put_f16(b, 0, 1.0f);
  b[2 + 9] = 7;             // index 9 (sub-block 1, entry 1): low byte 7
  b[66 + 1] = 0x02;         // qh[1] bit 1 -> index 9 becomes 256 + 7
  b[74 + 4] = 0x30;         // signs[4]: elements 36 and 37 negative (index 9 covers 36..39)
  b[106 + 0] = 0x50;        // sub-block 1 scale nibble 5 -> db = 11
  const auto y = dequant(GgmlType::IQ3_S, b);
  const uint32_t entry = kIq3sGrid[256 + 7];
  for (int j = 0; j < 4; ++j) {
    const float mag = 11.0f * static_cast<float>((entry >> (8 * j)) & 0xff);
    EXPECT_EQ(y[36 + j], j < 2 ? -mag : mag) << j;
  }
  // Sub-block 0, index 0: grid entry 0 (all ones), scale 1 + 2*0 = 1.
  for (int j = 0; j < 4; ++j) EXPECT_EQ(y[j], 1.0f);
}

TEST(Quant, Iq2XxsScaleAndSignPatterns) {
  auto b = zero_block(GgmlType::IQ2_XXS);
  put_f16(b, 0, 1.0f);
  const uint32_t grid_ids = 0x00000100;                       // entries 0, 1, 0, 0
  const uint32_t aux = (15u << 28) | (1u << 7) | 3u;          // scale 15; sign patterns 3, 1, 0, 0
  std::memcpy(b.data() + 2, &grid_ids, 4);
  std::memcpy(b.data() + 6, &aux, 4);
  const auto y = dequant(GgmlType::IQ2_XXS, b);
  const float db = 1.0f * (0.5f + 15.0f) * 0.25f;
  // Pattern 3 = 0b0000011: two negatives, even already -> ksigns 0x03.
  for (int j = 0; j < 8; ++j) EXPECT_EQ(y[j], (j < 2 ? -db : db) * 8.0f) << j;
  // Entry 1 = 0x080808080808082b; pattern 1 -> ksigns 0x81: elements 0 and 7 negative.
  EXPECT_EQ(y[8], -db * 43.0f);
  for (int j = 1; j < 7; ++j) EXPECT_EQ(y[8 + j], db * 8.0f) << j;
  EXPECT_EQ(y[15], -db * 8.0f);
  // Group 1 (all zero bytes): scale 0 -> d*0.5*0.25, entry 0, no signs.
  EXPECT_EQ(y[32], 1.0f * 0.5f * 0.25f * 8.0f);
}

TEST(Quant, PlainTypesRoundTrip) {
  const std::array<float, 4> x = {1.0f, -2.5f, 65504.0f, 0x1p-24f};
  std::array<uint8_t, 16> buf{};
  std::array<float, 4> back{};
  for (auto t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16}) {
    quantize_row(t, x.data(), buf.data(), x.size());
    dequantize_row(t, buf.data(), back.data(), x.size());
    EXPECT_EQ(back[0], 1.0f);
    EXPECT_EQ(back[1], -2.5f);
  }
  quantize_row(GgmlType::F16, x.data(), buf.data(), x.size());
  dequantize_row(GgmlType::F16, buf.data(), back.data(), x.size());
  EXPECT_EQ(back[2], 65504.0f);
  EXPECT_EQ(back[3], 0x1p-24f);
}

TEST(Quant, QuantizeQ8_0RoundsHalfAwayFromZero) {
  std::array<float, 32> x{};
  x[0] = 127.0f;  // amax 127: d = 1, so every x.5 below is an exact tie
  for (int j = 1; j < 32; ++j) x[j] = static_cast<float>(j - 16) + 0.5f;
  auto b = zero_block(GgmlType::Q8_0);
  quantize_row(GgmlType::Q8_0, x.data(), b.data(), 32);
  EXPECT_EQ(b[0] | (b[1] << 8), 0x3c00);  // fp16 1.0
  EXPECT_EQ(static_cast<int8_t>(b[2]), 127);
  for (int j = 1; j < 32; ++j) {
    const int want = j - 16 >= 0 ? j - 15 : j - 16;  // -15.5 -> -16, 0.5 -> 1
    EXPECT_EQ(static_cast<int8_t>(b[2 + j]), want) << j;
  }
}

TEST(Quant, QuantizeQ8_0NaNPoisonsOnlyItsBlock) {
  std::vector<float> x(64, 127.0f);  // d = 1 exactly
  x[5] = std::numeric_limits<float>::quiet_NaN();
  std::vector<uint8_t> b(68);
  quantize_row(GgmlType::Q8_0, x.data(), b.data(), 64);
  std::vector<float> y(64);
  dequantize_row(GgmlType::Q8_0, b.data(), y.data(), 64);
  for (int j = 0; j < 32; ++j) EXPECT_TRUE(std::isnan(y[j])) << j;
  for (int j = 32; j < 64; ++j) EXPECT_EQ(y[j], 127.0f) << j;
}

TEST(Quant, QuantizeZerosGivesZeroBlocks) {
  const std::vector<float> x(256, 0.0f);
  for (auto t : {GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_XS, GgmlType::IQ3_S}) {
    std::vector<uint8_t> b(*ggml_bytes(t, 256), 0xaa);
    quantize_row(t, x.data(), b.data(), 256);
    std::vector<float> y(256, 1.0f);
    dequantize_row(t, b.data(), y.data(), 256);
    for (float v : y) ASSERT_EQ(v, 0.0f) << ggml_type_traits(t).name;
  }
}

TEST(Quant, QuantizeRoundTripOnASmoothSignal) {
  // A deterministic signal with varied magnitude; bounds are loose versions of the Python tests'.
  std::vector<float> x(4096);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = std::sin(0.37f * static_cast<float>(i)) * (1.0f + static_cast<float>(i % 97) / 10.0f);
  }
  const std::array<std::pair<GgmlType, double>, 6> bounds = {
      std::pair{GgmlType::Q8_0, 0.01}, std::pair{GgmlType::Q6_K, 0.03}, std::pair{GgmlType::Q5_K, 0.06},
      std::pair{GgmlType::Q4_K, 0.12}, std::pair{GgmlType::IQ4_XS, 0.12}, std::pair{GgmlType::IQ3_S, 0.2}};
  for (const auto& [t, bound] : bounds) {
    std::vector<uint8_t> b(*ggml_bytes(t, x.size()));
    quantize_row(t, x.data(), b.data(), x.size());
    std::vector<float> y(x.size());
    dequantize_row(t, b.data(), y.data(), y.size());
    double err = 0, ref = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      err += (static_cast<double>(y[i]) - x[i]) * (static_cast<double>(y[i]) - x[i]);
      ref += static_cast<double>(x[i]) * x[i];
    }
    EXPECT_LT(std::sqrt(err / ref), bound) << ggml_type_traits(t).name;
  }
}

TEST(Quant, Iq3sAllZeroSubBlockLeavesTheOthersInPlace) {
  // ggml's IQ3_S quantizer does not advance its output past an all-zero sub-block, so the following
  // sub-blocks would decode from the wrong grid indices; ferry writes each in its own slot.
  std::vector<float> x(256);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (i / 32 == 2) ? 0.0f : std::cos(0.9f * static_cast<float>(i)) + 0.2f;
  std::vector<uint8_t> b(110);
  quantize_row(GgmlType::IQ3_S, x.data(), b.data(), x.size());
  std::vector<float> y(x.size());
  dequantize_row(GgmlType::IQ3_S, b.data(), y.data(), y.size());
  for (int ib = 0; ib < 8; ++ib) {
    if (ib == 2) continue;  // the zero sub-block decodes to +-d: IQ3_S has no zero scale
    double err = 0, ref = 0;
    for (int i = 32 * ib; i < 32 * ib + 32; ++i) {
      err += (static_cast<double>(y[i]) - x[i]) * (static_cast<double>(y[i]) - x[i]);
      ref += static_cast<double>(x[i]) * x[i];
    }
    EXPECT_LT(std::sqrt(err / ref), 0.25) << "sub-block " << ib;
  }
}

TEST(Quant, ImportanceWeightsLowerTheWeightedError) {
  std::vector<float> x(1024), w(1024);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = std::sin(1.7f * static_cast<float>(i)) * (1.0f + static_cast<float>(i % 13));
    w[i] = i % 8 == 0 ? 50.0f : 0.1f;  // a few columns matter much more
  }
  for (GgmlType t : {GgmlType::IQ4_XS, GgmlType::IQ3_S}) {
    auto weighted_error = [&](const float* importance) {
      std::vector<uint8_t> b(*ggml_bytes(t, x.size()));
      quantize_row(t, x.data(), b.data(), x.size(), importance);
      std::vector<float> y(x.size());
      dequantize_row(t, b.data(), y.data(), y.size());
      double e = 0;
      for (size_t i = 0; i < x.size(); ++i) e += w[i] * (static_cast<double>(y[i]) - x[i]) * (y[i] - x[i]);
      return e;
    };
    EXPECT_LT(weighted_error(w.data()), 0.8 * weighted_error(nullptr)) << ggml_type_traits(t).name;
  }
}
