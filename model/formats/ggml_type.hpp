#pragma once
// The ggml tensor element types that GGUF files name by number, with their block geometry.
#include <cstdint>
#include <optional>
#include <string_view>

namespace ferry::model {

// Values are the on-disk ids of ggml's `enum ggml_type` (gguf-py `GGMLQuantizationType`).
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22, IQ4_XS = 23,
  I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30, TQ1_0 = 34, TQ2_0 = 35,
  MXFP4 = 39,
};

struct GgmlTypeTraits {
  GgmlType type;
  std::string_view name;  // as ggml prints it: "q4_K", "iq3_s", "f32"
  uint32_t block_elems;   // elements per block (1 for plain types)
  uint32_t block_bytes;   // bytes per block
};

// nullopt for an id ggml does not define (or has retired).
std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t id);
inline GgmlTypeTraits ggml_type_traits(GgmlType t) { return *ggml_type_traits(static_cast<uint32_t>(t)); }
// Case-insensitive: "Q4_K", "q4_k" and "q4_K" all name Q4_K.
std::optional<GgmlType> ggml_type_from_name(std::string_view name);
// Bytes of `elems` elements; nullopt when `elems` is not a whole number of blocks or the size overflows.
std::optional<uint64_t> ggml_bytes(GgmlType t, uint64_t elems);

}  // namespace ferry::model
