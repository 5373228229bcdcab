#pragma once
// Scalar conversions between f32 and the 16- and 8-bit float formats that model files store.
// Pure bit manipulation, so results do not depend on the CPU's F16C support or rounding mode and are
// bit-identical to numpy (`astype(np.float16)` / `astype(np.float32)`, NaN payloads included) and to
// gguf-py's BF16 quantizer.
#include <bit>
#include <cstdint>

namespace ferry::model {

// IEEE binary16 -> binary32, exact for every code (subnormals, ±0, ±inf; a NaN keeps its payload).
constexpr float fp16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: man * 2^-24 is exact in f32.
    const float mag = static_cast<float>(man) * 0x1p-24f;
    return std::bit_cast<float>(std::bit_cast<uint32_t>(mag) | sign);
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (man << 13));
}

// binary32 -> binary16 with round-to-nearest-even; overflow gives ±inf; a NaN keeps the top 10 bits
// of its payload, or becomes payload 1 when those are all zero (numpy's rule).
constexpr uint16_t f32_to_fp16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) {
    const uint32_t payload = (a >> 13) & 0x3ffu;
    return static_cast<uint16_t>(sign | 0x7c00u | (payload == 0 ? 1u : payload));
  }
  // 65520 (0x477ff000) is the tie between 65504 and 2^16; ties go to the even side, i.e. infinity.
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (a < 0x38800000u) {
    // Result is subnormal (or rounds up to the smallest normal, whose encoding follows on naturally).
    if (a <= 0x33000000u) return sign;  // at most 2^-25: rounds to zero (2^-25 itself is a tie to even 0)
    const uint32_t e = a >> 23;
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e;  // 14..24: value * 2^24 = m >> shift
    const uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    const uint32_t rounded = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
    return static_cast<uint16_t>(sign | rounded);
  }
  // Normal: rebias the exponent and round the 13 dropped bits; a mantissa carry bumps the exponent.
  const uint32_t r = (a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13;
  return static_cast<uint16_t>(sign | r);
}

// bfloat16 is the top half of a binary32.
constexpr float bf16_to_f32(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

// binary32 -> bfloat16 with round-to-nearest-even (overflow gives ±inf, subnormals are kept); a NaN
// is truncated and forced quiet. Same rule as gguf-py's BF16.quantize_blocks and ggml's
// ggml_compute_fp32_to_bf16.
constexpr uint16_t f32_to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  // No overflow in 32 bits: the largest non-NaN pattern is 0xff800000.
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// float8_e4m3fn (the FP8 checkpoints' weight format): bias 7, 3 mantissa bits, no infinity;
// 0x7f and 0xff are NaN; largest finite ±448; subnormals are m * 2^-9.
constexpr float fp8_e4m3_to_f32(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  const uint32_t exp = (v >> 3) & 0xfu;
  const uint32_t man = v & 0x7u;
  if ((v & 0x7fu) == 0x7fu) return std::bit_cast<float>(sign | 0x7fc00000u);
  if (exp == 0) {
    const float mag = static_cast<float>(man) * 0x1p-9f;
    return std::bit_cast<float>(std::bit_cast<uint32_t>(mag) | sign);
  }
  return std::bit_cast<float>(sign | ((exp + 120u) << 23) | (man << 20));
}

}  // namespace ferry::model
