#include "model/formats/ggml_type.hpp"

#include <array>
#include <cctype>
#include <limits>

namespace ferry::model {
namespace {

// Block sizes as ggml-common.h lays the blocks out (gguf-py GGML_QUANT_SIZES agrees).
constexpr std::array kTypes = {
    GgmlTypeTraits{GgmlType::F32, "f32", 1, 4},         GgmlTypeTraits{GgmlType::F16, "f16", 1, 2},
    GgmlTypeTraits{GgmlType::Q4_0, "q4_0", 32, 18},     GgmlTypeTraits{GgmlType::Q4_1, "q4_1", 32, 20},
    GgmlTypeTraits{GgmlType::Q5_0, "q5_0", 32, 22},     GgmlTypeTraits{GgmlType::Q5_1, "q5_1", 32, 24},
    GgmlTypeTraits{GgmlType::Q8_0, "q8_0", 32, 34},     GgmlTypeTraits{GgmlType::Q8_1, "q8_1", 32, 40},
    GgmlTypeTraits{GgmlType::Q2_K, "q2_K", 256, 84},    GgmlTypeTraits{GgmlType::Q3_K, "q3_K", 256, 110},
    GgmlTypeTraits{GgmlType::Q4_K, "q4_K", 256, 144},   GgmlTypeTraits{GgmlType::Q5_K, "q5_K", 256, 176},
    GgmlTypeTraits{GgmlType::Q6_K, "q6_K", 256, 210},   GgmlTypeTraits{GgmlType::Q8_K, "q8_K", 256, 292},
    GgmlTypeTraits{GgmlType::IQ2_XXS, "iq2_xxs", 256, 66}, GgmlTypeTraits{GgmlType::IQ2_XS, "iq2_xs", 256, 74},
    GgmlTypeTraits{GgmlType::IQ3_XXS, "iq3_xxs", 256, 98}, GgmlTypeTraits{GgmlType::IQ1_S, "iq1_s", 256, 50},
    GgmlTypeTraits{GgmlType::IQ4_NL, "iq4_nl", 32, 18},    GgmlTypeTraits{GgmlType::IQ3_S, "iq3_s", 256, 110},
    GgmlTypeTraits{GgmlType::IQ2_S, "iq2_s", 256, 82},     GgmlTypeTraits{GgmlType::IQ4_XS, "iq4_xs", 256, 136},
    GgmlTypeTraits{GgmlType::I8, "i8", 1, 1},           GgmlTypeTraits{GgmlType::I16, "i16", 1, 2},
    GgmlTypeTraits{GgmlType::I32, "i32", 1, 4},         GgmlTypeTraits{GgmlType::I64, "i64", 1, 8},
    GgmlTypeTraits{GgmlType::F64, "f64", 1, 8},         GgmlTypeTraits{GgmlType::IQ1_M, "iq1_m", 256, 56},
    GgmlTypeTraits{GgmlType::BF16, "bf16", 1, 2},       GgmlTypeTraits{GgmlType::TQ1_0, "tq1_0", 256, 54},
    GgmlTypeTraits{GgmlType::TQ2_0, "tq2_0", 256, 66},  GgmlTypeTraits{GgmlType::MXFP4, "mxfp4", 32, 17},
};

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  }
  return true;
}

}  // namespace

std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t id) {
  for (const auto& t : kTypes) {
    if (static_cast<uint32_t>(t.type) == id) return t;
  }
  return std::nullopt;
}

std::optional<GgmlType> ggml_type_from_name(std::string_view name) {
  for (const auto& t : kTypes) {
    if (iequals(t.name, name)) return t.type;
  }
  return std::nullopt;
}

std::optional<uint64_t> ggml_bytes(GgmlType type, uint64_t elems) {
  const auto t = ggml_type_traits(type);
  if (elems % t.block_elems != 0) return std::nullopt;
  const uint64_t blocks = elems / t.block_elems;
  if (blocks > std::numeric_limits<uint64_t>::max() / t.block_bytes) return std::nullopt;
  return blocks * t.block_bytes;
}

}  // namespace ferry::model
