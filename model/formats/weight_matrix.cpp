#include "model/formats/weight_matrix.hpp"

#include <algorithm>
#include <stdexcept>

#include "model/formats/quant.hpp"

namespace ferry::model {

WeightMatrix WeightMatrix::slice_rows(size_t first, size_t count) const {
  if (first + count > rows) throw std::out_of_range("WeightMatrix::slice_rows past the last row");
  WeightMatrix m = *this;
  m.data = data + first * row_bytes;
  m.rows = count;
  return m;
}

void WeightMatrix::row(size_t r, float* out) const {
  const uint8_t* src = data + r * row_bytes;
  if (type == GgmlType::F32) {
    std::copy_n(reinterpret_cast<const float*>(src), cols, out);
  } else {
    dequantize_row(type, src, out, cols);
  }
}

}  // namespace ferry::model
