#include "model/formats/half.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

using namespace ferry::model;

namespace {

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }
float from_bits(uint32_t u) { return std::bit_cast<float>(u); }

// The value an IEEE binary16 code denotes, computed from the definition with double arithmetic.
double fp16_value(uint16_t h) {
  const int sign = (h & 0x8000) ? -1 : 1;
  const int exp = (h >> 10) & 0x1f;
  const int man = h & 0x3ff;
  if (exp == 0) return sign * std::ldexp(man, -24);
  if (exp == 31) return man ? std::numeric_limits<double>::quiet_NaN() : sign * HUGE_VAL;
  return sign * std::ldexp(1024 + man, exp - 25);
}

}  // namespace

TEST(Half, Fp16ToF32MatchesDefinitionForAllCodes) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = fp16_to_f32(static_cast<uint16_t>(h));
    const double want = fp16_value(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(f)) << h;
      // Payload and sign carry over, as numpy does.
      ASSERT_EQ(bits(f), ((h & 0x8000u) << 16) | 0x7f800000u | ((h & 0x3ffu) << 13)) << h;
    } else {
      ASSERT_EQ(static_cast<double>(f), want) << h;
      ASSERT_EQ(std::signbit(f), (h & 0x8000u) != 0) << h;
    }
  }
}

TEST(Half, F32ToFp16RoundTripsEveryCode) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    ASSERT_EQ(f32_to_fp16(fp16_to_f32(static_cast<uint16_t>(h))), h) << h;
  }
}

TEST(Half, F32ToFp16RoundsToNearestEven) {
  // Exact ties between neighbours go to the even code; anything past the tie goes up.
  EXPECT_EQ(f32_to_fp16(1.0f + 0x1p-11f), 0x3c00);               // tie, 1.0 is even
  EXPECT_EQ(f32_to_fp16(1.0f + 3 * 0x1p-11f), 0x3c02);           // tie, rounds up to even
  EXPECT_EQ(f32_to_fp16(std::nextafter(1.0f + 0x1p-11f, 2.0f)), 0x3c01);
  EXPECT_EQ(f32_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_fp16(65519.996f), 0x7bff);
  EXPECT_EQ(f32_to_fp16(65520.0f), 0x7c00);  // tie between max and 2^16 overflows
  EXPECT_EQ(f32_to_fp16(-1e10f), 0xfc00);
  EXPECT_EQ(f32_to_fp16(std::numeric_limits<float>::infinity()), 0x7c00);
  // Subnormal range: 2^-24 is the smallest subnormal, 2^-25 the tie with zero.
  EXPECT_EQ(f32_to_fp16(0x1p-24f), 0x0001);
  EXPECT_EQ(f32_to_fp16(0x1p-25f), 0x0000);
  EXPECT_EQ(f32_to_fp16(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
  EXPECT_EQ(f32_to_fp16(-0x1p-25f), 0x8000);
  EXPECT_EQ(f32_to_fp16(3 * 0x1p-25f), 0x0002);                  // 1.5 ulp: tie to even 2
  EXPECT_EQ(f32_to_fp16(5 * 0x1p-25f), 0x0002);                  // 2.5 ulp: tie to even 2
  EXPECT_EQ(f32_to_fp16(0x1p-14f - 0x1p-25f), 0x0400);           // tie rounds into the smallest normal
  EXPECT_EQ(f32_to_fp16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(f32_to_fp16(-0.0f), 0x8000);
}

TEST(Half, F32ToFp16NearestOverARange) {
  // Compare with a rounding computed from the fp16 value grid, for many f32 values around every binade.
  // (Positive finite results only: from just above 2^-25 to just below the overflow tie 65520.)
  for (uint32_t u = 0x33000001u; u < 0x477ff000u; u += 0x1357u) {
    const float f = from_bits(u);
    const uint16_t h = f32_to_fp16(f);
    ASSERT_GT(h, 0u) << std::hex << u;
    ASSERT_LT(h, 0x7c00u) << std::hex << u;
    const double err = std::abs(fp16_value(h) - f);
    ASSERT_LE(err, std::abs(fp16_value(static_cast<uint16_t>(h - 1)) - f)) << std::hex << u;
    if (h < 0x7bff) {
      ASSERT_LE(err, std::abs(fp16_value(static_cast<uint16_t>(h + 1)) - f)) << std::hex << u;
    }
  }
}

TEST(Half, F32ToFp16NaNKeepsPayloadLikeNumpy) {
  EXPECT_EQ(f32_to_fp16(from_bits(0x7fc00000u)), 0x7e00);
  EXPECT_EQ(f32_to_fp16(from_bits(0x7f800001u)), 0x7c01);  // payload lost in the shift: forced to 1
  EXPECT_EQ(f32_to_fp16(from_bits(0xff800100u)), 0xfc01);
  EXPECT_EQ(f32_to_fp16(from_bits(0x7fa00000u)), 0x7d00);
}

TEST(Half, Bf16) {
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  EXPECT_EQ(bits(bf16_to_f32(0x8001)), 0x80010000u);  // subnormal kept
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808000u)), 0x3f80);  // tie to even
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f818000u)), 0x3f82);  // tie to even, upwards
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808001u)), 0x3f81);
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f7fffffu)), 0x7f80);  // max float rounds to inf
  EXPECT_EQ(f32_to_bf16(from_bits(0xff800000u)), 0xff80);
  EXPECT_EQ(f32_to_bf16(from_bits(0x00018000u)), 0x0002);  // subnormals are rounded, not flushed
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f800001u)), 0x7fc0);  // signalling NaN made quiet
  EXPECT_EQ(f32_to_bf16(from_bits(0xffff0000u)), 0xffff);
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = bf16_to_f32(static_cast<uint16_t>(b));
    if (std::isnan(f)) {
      ASSERT_EQ(f32_to_bf16(f), b | 0x40u) << b;
    } else {
      ASSERT_EQ(f32_to_bf16(f), b) << b;
    }
  }
}

TEST(Half, Fp8E4m3AllCodes) {
  for (uint32_t v = 0; v < 256; ++v) {
    const float f = fp8_e4m3_to_f32(static_cast<uint8_t>(v));
    const int sign = (v & 0x80) ? -1 : 1;
    const int exp = (v >> 3) & 0xf;
    const int man = v & 7;
    if ((v & 0x7f) == 0x7f) {
      ASSERT_TRUE(std::isnan(f)) << v;
      continue;
    }
    const double want = exp == 0 ? sign * std::ldexp(man, -9) : sign * std::ldexp(8 + man, exp - 10);
    ASSERT_EQ(static_cast<double>(f), want) << v;
    ASSERT_EQ(std::signbit(f), sign < 0) << v;
  }
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0xfe), -448.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), 0x1p-9f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x78), 256.0f);  // exponent 15 is finite in e4m3fn
  EXPECT_EQ(fp8_e4m3_to_f32(0x38), 1.0f);
}
