#pragma once
// How a DSA layer's cached rows are stored (`--kv-type`): f32, f16, or int8 codes with one f32 scale
// per row (kv/kv_rows.hpp has the codecs). The latent rows and the indexer's cached keys and gates
// each have a format; a slot state image (model/slot_state.hpp) holds the rows as stored, losslessly:
// f32 and f16 rows as their values, an int8 row as its codes (exact integers) then its scale.
#include <cstdint>
#include <string>
#include <string_view>

#include "config/expected.hpp"

namespace ferry::config {

enum class KvType : uint8_t { f32, f16, int8 };

struct KvFormats {
  KvType latent = KvType::f32;
  KvType index = KvType::f32;  // the indexer's cached keys and gates (pool keys are always f32)
};

// "f32", "f16" or "int8"; the error names the text and the choices.
Expected<KvType> parse_kv_type(std::string_view text);
std::string_view kv_type_name(KvType type);

// Floats one row of `width` values takes in a slot state image.
constexpr uint64_t kv_image_width(KvType type, uint64_t width) { return type == KvType::int8 ? width + 1 : width; }
// Bytes one row of `width` values takes where it is kept (host or device).
constexpr uint64_t kv_row_bytes(KvType type, uint64_t width) {
  switch (type) {
    case KvType::f32: return 4 * width;
    case KvType::f16: return 2 * width;
    case KvType::int8: return width + 4;
  }
  return 4 * width;
}

}  // namespace ferry::config
