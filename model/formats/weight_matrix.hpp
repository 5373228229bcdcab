#pragma once
// A weight matrix as the model file stores it: rows of any ggml type, read in place from the mapping.
#include <cstddef>
#include <cstdint>

#include "model/formats/ggml_type.hpp"

namespace ferry::model {

// A row-major matrix [rows][cols] stored in any ggml type, rows whole blocks (GGUF dims {cols, rows}).
// It points into the model file's mapping: F32 rows are used in place, other types are dequantized
// one row at a time when a product needs them, so a quantized model costs no more memory than its file.
struct WeightMatrix {
  GgmlType type = GgmlType::F32;
  const uint8_t* data = nullptr;
  size_t rows = 0;
  size_t cols = 0;
  size_t row_bytes = 0;

  bool empty() const { return data == nullptr; }
  // Rows [first, first + count) as a matrix of their own (one expert of a stacked tensor, one head).
  WeightMatrix slice_rows(size_t first, size_t count) const;
  // Row r as f32 into out[0, cols).
  void row(size_t r, float* out) const;
};

}  // namespace ferry::model
