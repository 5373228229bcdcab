#include "kv/kv_rows.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kv/kv_codec.hpp"

namespace ferry::kv {
namespace {

using config::KvType;

std::vector<float> random_rows(size_t n, size_t w, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> x(n * w);
  for (float& v : x) v = d(rng);
  return x;
}

// The integer f16 codec against the compiler's binary16 (GCC's _Float16: IEEE round to nearest even).
TEST(KvCodec, HalfMatchesCompilerBinary16) {
#if defined(__FLT16_MAX__)
  for (uint32_t h = 0; h < 65536; ++h) {
    _Float16 f;
    const auto bits = static_cast<uint16_t>(h);
    std::memcpy(&f, &bits, 2);
    const float want = static_cast<float>(f);
    const float got = f16_to_f32(bits);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << h;
    } else {
      EXPECT_EQ(float_bits(got), float_bits(want)) << h;
    }
  }
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> any;
  for (int i = 0; i < 2000000; ++i) {
    const float x = bits_float(any(rng));
    if (std::isnan(x)) continue;
    const _Float16 want = static_cast<_Float16>(x);
    uint16_t wb;
    std::memcpy(&wb, &want, 2);
    ASSERT_EQ(f32_to_f16(x), wb) << x;
  }
  // Halfway cases: ties go to the even mantissa; the largest half and the overflow boundary.
  EXPECT_EQ(f32_to_f16(1.0f + 1.0f / 2048), 0x3c00);         // 1 + half an ulp: to 1
  EXPECT_EQ(f32_to_f16(1.0f + 3.0f / 2048), 0x3c02);         // 1 + 1.5 ulp: to the even 1 + 2 ulp
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);       // halfway to the smallest subnormal: even
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -25)), 0x0001);
#else
  GTEST_SKIP() << "no _Float16 in this compiler to compare with";
#endif
}

TEST(KvCodec, Int8RowsKeepTheirMaxExactlyAndErrorWithinHalfAStep) {
  const size_t w = 512;
  const std::vector<float> x = random_rows(8, w, 3, 2.5f);
  KvRows rows(KvType::int8, w);
  rows.append(x.data(), 8, w);
  std::vector<float> buf(w);
  for (size_t r = 0; r < 8; ++r) {
    const float* v = rows.row(r, buf.data());
    float m = 0.0f;
    for (size_t c = 0; c < w; ++c) m = std::max(m, std::fabs(x[r * w + c]));
    const float step = m / 127.0f;
    for (size_t c = 0; c < w; ++c) EXPECT_LE(std::fabs(v[c] - x[r * w + c]), 0.5f * step * 1.0001f) << r << "," << c;
  }
  // An all-zero row: scale 0, decodes to zeros.
  const std::vector<float> zero(w, 0.0f);
  rows.append(zero.data(), 1, w);
  const float* z = rows.row(8, buf.data());
  for (size_t c = 0; c < w; ++c) EXPECT_EQ(z[c], 0.0f);
  EXPECT_EQ(rows.bytes(), 9 * (w + 4));
}

TEST(KvRows, F32IsInPlaceAndExact) {
  const size_t w = 16;
  const std::vector<float> x = random_rows(5, w, 1);
  KvRows rows(KvType::f32, w);
  rows.append(x.data(), 5, w);
  for (size_t r = 0; r < 5; ++r) {
    const float* v = rows.row(r, nullptr);
    for (size_t c = 0; c < w; ++c) EXPECT_EQ(v[c], x[r * w + c]);
  }
}

// Append with a stride, truncate, and the image round trip: every format comes back bit for bit, and
// the image has kv_image_width floats per row.
TEST(KvRows, ImageRoundTripIsLosslessInEveryFormat) {
  const size_t w = 12, n = 7;
  const std::vector<float> x = random_rows(n, w + 3, 11, 4.0f);  // stride w + 3
  for (KvType t : {KvType::f32, KvType::f16, KvType::int8}) {
    KvRows a(t, w);
    a.append(x.data(), n, w + 3);
    ASSERT_EQ(a.rows(), n);
    std::vector<float> image(n * config::kv_image_width(t, w));
    a.to_image(0, n, image.data());
    KvRows b(t, w);
    ASSERT_FALSE(b.from_image(image.data(), n).has_value());
    std::vector<float> ba(w), bb(w);
    for (size_t r = 0; r < n; ++r) {
      const float* ra = a.row(r, ba.data());
      const float* rb = b.row(r, bb.data());
      for (size_t c = 0; c < w; ++c) EXPECT_EQ(float_bits(ra[c]), float_bits(rb[c])) << config::kv_type_name(t);
    }
    // Truncation keeps exactly the first rows.
    b.truncate(3);
    EXPECT_EQ(b.rows(), 3u);
    EXPECT_EQ(b.bytes(), 3 * config::kv_row_bytes(t, w));
    std::vector<float> image3(3 * config::kv_image_width(t, w));
    b.to_image(0, 3, image3.data());
    for (size_t i = 0; i < image3.size(); ++i) EXPECT_EQ(float_bits(image3[i]), float_bits(image[i]));
  }
}

TEST(KvRows, RefusesAnImageTheFormatCannotHold) {
  const size_t w = 4;
  KvRows i8(KvType::int8, w);
  const std::vector<float> ok{1, -127, 127, 0, 0.5f};
  ASSERT_FALSE(i8.from_image(ok.data(), 1).has_value());
  const std::vector<float> fraction{1.5f, 0, 0, 0, 0.5f};
  const auto e = i8.from_image(fraction.data(), 1);
  ASSERT_TRUE(e.has_value());
  EXPECT_NE(e->message.find("row 0"), std::string::npos) << e->message;
  EXPECT_EQ(i8.rows(), 1u);  // a refused image leaves the rows as they were
  const std::vector<float> big{128, 0, 0, 0, 0.5f};
  EXPECT_TRUE(i8.from_image(big.data(), 1).has_value());
  const std::vector<float> bad_scale{1, 0, 0, 0, -1.0f};
  EXPECT_TRUE(i8.from_image(bad_scale.data(), 1).has_value());
  KvRows h(KvType::f16, w);
  const std::vector<float> not_half{1.0f + 1.0f / 4096, 0, 0, 0};
  EXPECT_TRUE(h.from_image(not_half.data(), 1).has_value());
}

TEST(KvType, ParsesAndNames) {
  for (KvType t : {KvType::f32, KvType::f16, KvType::int8}) {
    auto p = config::parse_kv_type(config::kv_type_name(t));
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(p.value(), t);
  }
  auto bad = config::parse_kv_type("q4");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("'q4'"), std::string::npos);
  EXPECT_EQ(config::kv_row_bytes(KvType::int8, 512), 516u);
  EXPECT_EQ(config::kv_image_width(KvType::int8, 512), 513u);
}

}  // namespace
}  // namespace ferry::kv
