#include "model/formats/quant.hpp"

#include <bit>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "model/formats/half.hpp"
#include "model/formats/quant_kernels.hpp"

namespace ferry::model {
namespace {

static_assert(std::endian::native == std::endian::little, "block decoding assumes a little-endian host");

size_t checked_blocks(GgmlType type, size_t n, const char* what) {
  const auto traits = ggml_type_traits(static_cast<uint32_t>(type));
  if (!traits) {
    throw std::invalid_argument(std::string(what) + ": unknown ggml type id " +
                                std::to_string(static_cast<uint32_t>(type)));
  }
  if (n % traits->block_elems != 0) {
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(n) + " elements is not a whole number of " +
                                std::string(traits->name) + " blocks of " + std::to_string(traits->block_elems));
  }
  return n / traits->block_elems;
}

[[noreturn]] void unsupported(GgmlType type, const char* what) {
  const auto traits = ggml_type_traits(static_cast<uint32_t>(type));
  throw std::invalid_argument(std::string(what) + ": type " +
                              (traits ? std::string(traits->name) : std::to_string(static_cast<uint32_t>(type))) +
                              " is not supported");
}

}  // namespace

bool can_dequantize(GgmlType type) {
  switch (type) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16:
    case GgmlType::Q4_0:
    case GgmlType::Q8_0:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K:
    case GgmlType::IQ4_XS:
    case GgmlType::IQ3_S:
    case GgmlType::IQ2_XXS:
      return true;
    default:
      return false;
  }
}

bool can_quantize(GgmlType type) {
  switch (type) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16:
    case GgmlType::Q8_0:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K:
    case GgmlType::IQ4_XS:
    case GgmlType::IQ3_S:
      return true;
    default:
      return false;
  }
}

bool quantize_takes_importance(GgmlType type) { return type == GgmlType::IQ4_XS || type == GgmlType::IQ3_S; }

void dequantize_row(GgmlType type, const void* src, float* dst, size_t n) {
  const char* what = "dequantize_row";
  const size_t blocks = checked_blocks(type, n, what);
  const auto* in = static_cast<const uint8_t*>(src);
  switch (type) {
    case GgmlType::F32:
      std::memcpy(dst, in, n * sizeof(float));
      return;
    case GgmlType::F16:
      return quant_detail::dequantize_f16(in, dst, n);
    case GgmlType::BF16:
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(quant_detail::load_u16(in + 2 * i));
      return;
    case GgmlType::Q4_0:
      return quant_detail::dequantize_q4_0(in, dst, blocks);
    case GgmlType::Q8_0:
      return quant_detail::dequantize_q8_0(in, dst, blocks);
    case GgmlType::Q4_K:
      return quant_detail::dequantize_q4_k(in, dst, blocks);
    case GgmlType::Q5_K:
      return quant_detail::dequantize_q5_k(in, dst, blocks);
    case GgmlType::Q6_K:
      return quant_detail::dequantize_q6_k(in, dst, blocks);
    case GgmlType::IQ4_XS:
      return quant_detail::dequantize_iq4_xs(in, dst, blocks);
    case GgmlType::IQ3_S:
      return quant_detail::dequantize_iq3_s(in, dst, blocks);
    case GgmlType::IQ2_XXS:
      return quant_detail::dequantize_iq2_xxs(in, dst, blocks);
    default:
      unsupported(type, what);
  }
}

void quantize_row(GgmlType type, const float* src, void* dst, size_t n) { quantize_row(type, src, dst, n, nullptr); }

void quantize_row(GgmlType type, const float* src, void* dst, size_t n, const float* importance) {
  const char* what = "quantize_row";
  if (importance != nullptr && !quantize_takes_importance(type)) {
    const auto traits = ggml_type_traits(static_cast<uint32_t>(type));
    throw std::invalid_argument(std::string(what) + ": type " +
                                (traits ? std::string(traits->name) : std::to_string(static_cast<uint32_t>(type))) +
                                " has no importance-weighted quantizer");
  }
  const size_t blocks = checked_blocks(type, n, what);
  auto* out = static_cast<uint8_t*>(dst);
  switch (type) {
    case GgmlType::F32:
      std::memcpy(out, src, n * sizeof(float));
      return;
    case GgmlType::F16:
      for (size_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_fp16(src[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case GgmlType::BF16:
      for (size_t i = 0; i < n; ++i) {
        const uint16_t b = f32_to_bf16(src[i]);
        std::memcpy(out + 2 * i, &b, 2);
      }
      return;
    case GgmlType::Q8_0:
      return quant_detail::quantize_q8_0(src, out, blocks);
    case GgmlType::Q4_K:
      return quant_detail::quantize_q4_k(src, out, blocks);
    case GgmlType::Q5_K:
      return quant_detail::quantize_q5_k(src, out, blocks);
    case GgmlType::Q6_K:
      return quant_detail::quantize_q6_k(src, out, blocks);
    case GgmlType::IQ4_XS:
      return quant_detail::quantize_iq4_xs(src, out, blocks, importance);
    case GgmlType::IQ3_S:
      return quant_detail::quantize_iq3_s(src, out, blocks, importance);
    default:
      unsupported(type, what);
  }
}

}  // namespace ferry::model
