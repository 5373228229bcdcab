#pragma once
// One cache's rows in one KV format (config/kv_type.hpp) in host memory: what the CPU backend's DSA
// caches keep, and the unit the host KV tier (kv/host_kv_tier.hpp) holds per slot and layer. Rows are
// encoded once when appended (kv/kv_codec.hpp) and decoded when read; f32 rows are read in place.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "config/expected.hpp"
#include "config/kv_type.hpp"

namespace ferry::kv {

// One row of `width` floats in `type`, on the host: into `data` (width values of the format's element:
// f32, f16 bits, int8 codes) and, for int8, its scale into *scale; and back.
void encode_row(config::KvType type, const float* x, uint32_t width, void* data, float* scale);
void decode_row(config::KvType type, const void* data, float scale, uint32_t width, float* out);
// Bytes of one element of the format's data (the int8 scale apart).
constexpr uint64_t kv_element_bytes(config::KvType type) {
  return type == config::KvType::f32 ? 4 : type == config::KvType::f16 ? 2 : 1;
}

class KvRows {
 public:
  KvRows() = default;
  KvRows(config::KvType type, uint32_t width) : type_(type), width_(width) {}

  config::KvType type() const { return type_; }
  uint32_t width() const { return width_; }
  size_t rows() const { return rows_; }
  // Bytes the rows take as stored.
  uint64_t bytes() const { return rows_ * config::kv_row_bytes(type_, width_); }

  // Appends `n` rows, row i at src + i * stride.
  void append(const float* src, size_t n, size_t stride);
  // Row `row` as floats: in place for f32, else decoded into `scratch` (width floats).
  const float* row(size_t row, float* scratch) const;
  // Keeps the first `n` rows (n <= rows()).
  void truncate(size_t n);
  void clear() { truncate(0); }

  // Rows [row0, row0 + n) in the state image encoding: kv_image_width(type, width) floats per row.
  void to_image(size_t row0, size_t n, float* out) const;
  // Replaces the rows by `n` rows of an image; refuses a code or value the format cannot hold (an
  // int8 code outside [-127, 127] or not an integer, a negative or non-finite scale, an f16 value
  // that is not exactly a half), naming the row.
  Status from_image(const float* in, size_t n);

  // The stored arrays (for copying to a device): f32 values, f16 bits, int8 codes and their scales.
  const float* f32_data() const { return f32_.data(); }
  const uint16_t* f16_data() const { return f16_.data(); }
  const int8_t* codes() const { return codes_.data(); }
  const float* scales() const { return scales_.data(); }

 private:
  config::KvType type_ = config::KvType::f32;
  uint32_t width_ = 0;
  size_t rows_ = 0;
  std::vector<float> f32_;
  std::vector<uint16_t> f16_;
  std::vector<int8_t> codes_;
  std::vector<float> scales_;
};

}  // namespace ferry::kv
