#pragma once
// Where group g of part blockIdx.z of a matvec launch reads its weights and input and writes its
// output, and its rows (MatvecArgs::parts): shared by the matvec kernels.
#include <cuda_runtime.h>

#include "gpu/kernels.hpp"

namespace ferry::gpu {

struct MatvecPartView {
  const uint8_t* w;  // the group's matrix
  const float* x;    // the group's first token
  float* y;          // the part's output (group and row offsets still to add)
  uint32_t rows;
  size_t y_tok_stride;
};

__device__ __forceinline__ MatvecPartView matvec_part_view(const MatvecArgs& a, uint32_t g) {
  const uint32_t part = blockIdx.z;
  const MatvecPart& more = a.more[part > 0 ? part - 1 : 0];
  const size_t mat = a.w_group_index ? static_cast<size_t>(a.w_group_index[g]) : g;
  const uint8_t* const* group_ptrs = part == 0 ? a.w_group_ptrs : more.group_ptrs;
  const uint8_t* data = part == 0 ? a.w.data : more.data;
  const float* x = part == 0 || more.x == nullptr ? a.x : more.x;
  return {group_ptrs ? group_ptrs[mat] : data + mat * a.w_group_bytes,
          x + static_cast<size_t>(g / a.x_group_div) * a.x_group_stride, part == 0 ? a.y : more.y,
          part == 0 || more.rows == 0 ? a.w.rows : more.rows,
          part == 0 || more.y_tok_stride == 0 ? a.y_tok_stride : more.y_tok_stride};
}

// The most rows of any part (the launch's grid covers them) and the rows of all parts together.
inline uint32_t matvec_max_rows(const MatvecArgs& a) {
  uint32_t m = a.w.rows;
  for (uint32_t p = 1; p < a.parts && p < kMaxMatvecParts; ++p) m = a.more[p - 1].rows > m ? a.more[p - 1].rows : m;
  return m;
}
inline uint64_t matvec_total_rows(const MatvecArgs& a) {
  uint64_t n = a.w.rows;
  for (uint32_t p = 1; p < a.parts && p < kMaxMatvecParts; ++p) n += a.more[p - 1].rows ? a.more[p - 1].rows : a.w.rows;
  return n;
}

}  // namespace ferry::gpu
