#include "config/kv_type.hpp"

namespace ferry::config {

Expected<KvType> parse_kv_type(std::string_view text) {
  if (text == "f32") return KvType::f32;
  if (text == "f16") return KvType::f16;
  if (text == "int8") return KvType::int8;
  return Error(ErrorCode::invalid_input, "KV type '" + std::string(text) + "' is not one of f32, f16, int8");
}

std::string_view kv_type_name(KvType type) {
  switch (type) {
    case KvType::f32: return "f32";
    case KvType::f16: return "f16";
    case KvType::int8: return "int8";
  }
  return "?";
}

}  // namespace ferry::config
