// Block dequantizers, bit-exact with gguf-py's numpy dequantizers (and ggml's dequantize_row_*).
//
// Exactness rests on doing the same f32 operations in the same order as numpy does: every product
// below is rounded to f32 on its own, e.g. Q4_K is (d*sc)*q - (dmin*m), never a fused multiply-add.
// The build uses -std=c++20 (CMAKE_CXX_EXTENSIONS OFF), under which GCC does not contract a*b+c into
// an FMA (-ffp-contract=off is the ISO default), so the plain expressions below are exact as written.
#include <bit>
#include <cstddef>
#include <cstdint>

#include "model/formats/half.hpp"
#include "model/formats/iq_grids.hpp"
#include "model/formats/quant_kernels.hpp"

namespace ferry::model::quant_detail {
namespace {

// Negates v when `negative` is 1 by flipping the sign bit: the same result as -v (or v * -1.0f for
// any non-NaN v), without a data-dependent branch on random sign bits.
inline float with_sign(float v, uint32_t negative) {
  return std::bit_cast<float>(std::bit_cast<uint32_t>(v) ^ (negative << 31));
}

}  // namespace

void dequantize_f16(const uint8_t* src, float* dst, size_t n) {
  // fp16_to_f32 with bit masks instead of branches, so that the loop vectorizes; same bits for
  // every code (the Python tests check all 65536).
  for (size_t i = 0; i < n; ++i) {
    const uint32_t h = load_u16(src + 2 * i);
    const uint32_t exp = h & 0x7c00u;
    const float subnormal = static_cast<float>(static_cast<int32_t>(h & 0x3ffu)) * 0x1p-24f;  // exact
    const uint32_t is_special = 0u - static_cast<uint32_t>(exp == 0x7c00u);                  // inf/NaN
    const uint32_t is_subnormal = 0u - static_cast<uint32_t>(exp == 0);
    const uint32_t normal = ((h & 0x7fffu) << 13) + (112u << 23) + (is_special & (112u << 23));
    const uint32_t magnitude = (std::bit_cast<uint32_t>(subnormal) & is_subnormal) | (normal & ~is_subnormal);
    dst[i] = std::bit_cast<float>(magnitude | ((h & 0x8000u) << 16));
  }
}

void dequantize_q4_0(const uint8_t* src, float* dst, size_t blocks) {
  // f16 d; u8 qs[16]: element j is the low nibble of qs[j], element j+16 the high one; value (q-8)*d.
  for (size_t b = 0; b < blocks; ++b, src += 18, dst += 32) {
    const float d = fp16_to_f32(load_u16(src));
    const uint8_t* qs = src + 2;
    for (int j = 0; j < 16; ++j) {
      dst[j] = static_cast<float>((qs[j] & 0xf) - 8) * d;
      dst[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
    }
  }
}

void dequantize_q8_0(const uint8_t* src, float* dst, size_t blocks) {
  // f16 d; i8 qs[32].
  for (size_t b = 0; b < blocks; ++b, src += 34, dst += 32) {
    const float d = fp16_to_f32(load_u16(src));
    const auto* qs = reinterpret_cast<const int8_t*>(src + 2);
    for (int j = 0; j < 32; ++j) dst[j] = static_cast<float>(qs[j]) * d;
  }
}

void dequantize_q4_k(const uint8_t* src, float* dst, size_t blocks) {
  // f16 d, dmin; u8 scales[12]; u8 qs[128]. Each 32 bytes of qs hold two sub-blocks of 32: the low
  // nibbles the first, the high nibbles the second.
  for (size_t b = 0; b < blocks; ++b, src += 144, dst += 256) {
    const float d = fp16_to_f32(load_u16(src));
    const float dmin = fp16_to_f32(load_u16(src + 2));
    const uint8_t* scales = src + 4;
    const uint8_t* qs = src + 16;
    for (int pair = 0; pair < 4; ++pair) {
      uint8_t sc, m;
      k4_scale_min(scales, 2 * pair, sc, m);
      const float d1 = d * static_cast<float>(sc);
      const float m1 = dmin * static_cast<float>(m);
      k4_scale_min(scales, 2 * pair + 1, sc, m);
      const float d2 = d * static_cast<float>(sc);
      const float m2 = dmin * static_cast<float>(m);
      const uint8_t* q = qs + 32 * pair;
      float* y = dst + 64 * pair;
      for (int l = 0; l < 32; ++l) {
        y[l] = d1 * static_cast<float>(q[l] & 0xf) - m1;
        y[l + 32] = d2 * static_cast<float>(q[l] >> 4) - m2;
      }
    }
  }
}

void dequantize_q5_k(const uint8_t* src, float* dst, size_t blocks) {
  // f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]. As Q4_K, plus a fifth bit: bit s of qh[l] is
  // the high bit of element l of sub-block s.
  for (size_t b = 0; b < blocks; ++b, src += 176, dst += 256) {
    const float d = fp16_to_f32(load_u16(src));
    const float dmin = fp16_to_f32(load_u16(src + 2));
    const uint8_t* scales = src + 4;
    const uint8_t* qh = src + 16;
    const uint8_t* qs = src + 48;
    for (int pair = 0; pair < 4; ++pair) {
      uint8_t sc, m;
      k4_scale_min(scales, 2 * pair, sc, m);
      const float d1 = d * static_cast<float>(sc);
      const float m1 = dmin * static_cast<float>(m);
      k4_scale_min(scales, 2 * pair + 1, sc, m);
      const float d2 = d * static_cast<float>(sc);
      const float m2 = dmin * static_cast<float>(m);
      const uint8_t* q = qs + 32 * pair;
      const int lo_bit = 2 * pair;
      const int hi_bit = 2 * pair + 1;
      float* y = dst + 64 * pair;
      for (int l = 0; l < 32; ++l) {
        const int q1 = (q[l] & 0xf) | (((qh[l] >> lo_bit) & 1) << 4);
        const int q2 = (q[l] >> 4) | (((qh[l] >> hi_bit) & 1) << 4);
        y[l] = d1 * static_cast<float>(q1) - m1;
        y[l + 32] = d2 * static_cast<float>(q2) - m2;
      }
    }
  }
}

void dequantize_q6_k(const uint8_t* src, float* dst, size_t blocks) {
  // u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d (last). Per half of 128 elements: ql[0..64) and
  // qh[0..32) of that half; element l + 32g takes nibble (g/2) of ql[l + 32(g%2)] and bits 2g..2g+1
  // of qh[l]; value (q - 32) * (d * scales[element/16]).
  for (size_t b = 0; b < blocks; ++b, src += 210, dst += 256) {
    const float d = fp16_to_f32(load_u16(src + 208));
    const auto* scales = reinterpret_cast<const int8_t*>(src + 192);
    float ds[16];
    for (int s = 0; s < 16; ++s) ds[s] = d * static_cast<float>(scales[s]);
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = src + 64 * half;
      const uint8_t* qh = src + 128 + 32 * half;
      const float* dh = ds + 8 * half;
      float* y = dst + 128 * half;
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = dh[is] * static_cast<float>(q1);
        y[l + 32] = dh[is + 2] * static_cast<float>(q2);
        y[l + 64] = dh[is + 4] * static_cast<float>(q3);
        y[l + 96] = dh[is + 6] * static_cast<float>(q4);
      }
    }
  }
}

void dequantize_iq4_xs(const uint8_t* src, float* dst, size_t blocks) {
  // f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]. Sub-block ib has a 6-bit scale (low 4 bits in
  // a nibble of scales_l, high 2 in scales_h), value d*(scale-32)*kvalues[nibble]; its 16 bytes of
  // qs give elements 0..15 (low nibbles) and 16..31 (high nibbles).
  for (size_t b = 0; b < blocks; ++b, src += 136, dst += 256) {
    const float d = fp16_to_f32(load_u16(src));
    const uint16_t scales_h = load_u16(src + 2);
    const uint8_t* scales_l = src + 4;
    const uint8_t* qs = src + 8;
    for (int ib = 0; ib < 8; ++ib) {
      const int ls = ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf) | (((scales_h >> (2 * ib)) & 3) << 4);
      const float dl = d * static_cast<float>(ls - 32);
      const uint8_t* q = qs + 16 * ib;
      float* y = dst + 32 * ib;
      for (int j = 0; j < 16; ++j) {
        y[j] = dl * static_cast<float>(kIq4nlValues[q[j] & 0xf]);
        y[j + 16] = dl * static_cast<float>(kIq4nlValues[q[j] >> 4]);
      }
    }
  }
}

void dequantize_iq3_s(const uint8_t* src, float* dst, size_t blocks) {
  // f16 d; u8 qs[64]; u8 qh[8]; u8 signs[32]; u8 scales[4]. Grid index k (0..63) is qs[k] plus bit
  // k%8 of qh[k/8] as bit 8; it gives elements 4k..4k+3. Element e is negated when bit e%8 of
  // signs[e/8] is set. Sub-block ib (32 elements) is scaled by d*(1 + 2*nibble ib of scales).
  for (size_t b = 0; b < blocks; ++b, src += 110, dst += 256) {
    const float d = fp16_to_f32(load_u16(src));
    const uint8_t* qs = src + 2;
    const uint8_t* qh = src + 66;
    const uint8_t* signs = src + 74;
    const uint8_t* scales = src + 106;
    for (int ib = 0; ib < 8; ++ib) {
      const float db = d * static_cast<float>(1 + 2 * ((scales[ib / 2] >> (4 * (ib % 2))) & 0xf));
      for (int g = 0; g < 8; ++g) {
        const int k = 8 * ib + g;
        const uint32_t entry = kIq3sGrid[qs[k] | (((qh[ib] >> g) & 1) << 8)];
        const uint32_t sign_bits = signs[k / 2] >> (4 * (k % 2));
        float* y = dst + 4 * k;
        for (int j = 0; j < 4; ++j) {
          y[j] = with_sign(db * static_cast<float>((entry >> (8 * j)) & 0xff), (sign_bits >> j) & 1);
        }
      }
    }
  }
}

void dequantize_iq2_xxs(const uint8_t* src, float* dst, size_t blocks) {
  // f16 d; then 8 groups of 32 elements, each two u32: the first holds 4 grid indices (bytes), the
  // second 4 seven-bit sign-pattern indices (bits 0..27) and a 4-bit scale (bits 28..31);
  // group scale d*(0.5+scale)*0.25.
  for (size_t b = 0; b < blocks; ++b, src += 66, dst += 256) {
    const float d = fp16_to_f32(load_u16(src));
    for (int ib = 0; ib < 8; ++ib) {
      const uint32_t grid_ids = load_u32(src + 2 + 8 * ib);
      const uint32_t aux = load_u32(src + 2 + 8 * ib + 4);
      const float db = d * (0.5f + static_cast<float>(aux >> 28)) * 0.25f;
      for (int l = 0; l < 4; ++l) {
        const uint64_t entry = kIq2xxsGrid[(grid_ids >> (8 * l)) & 0xff];
        const uint32_t sign_bits = kIq2xsSigns[(aux >> (7 * l)) & 127];
        float* y = dst + 32 * ib + 8 * l;
        for (int j = 0; j < 8; ++j) {
          y[j] = with_sign(db * static_cast<float>((entry >> (8 * j)) & 0xff), (sign_bits >> j) & 1);
        }
      }
    }
  }
}

}  // namespace ferry::model::quant_detail
