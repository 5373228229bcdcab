#pragma once
// Where group g of part blockIdx.z of a matvec launch reads its weights and input and writes its
// output, and its rows (MatvecArgs::parts): shared by the matvec kernels.
#include <cuda_runtime.h>

#include "gpu/kernels.hpp"

namespace ferry::gpu {

struct MatvecPartView {
  const uint8_t* w;    // the group's matrix
  const float* x;      // the group's first token
  float* y;            // the part's output (group and row offsets still to add)
  uint32_t rows;
  size_t y_tok_stride;
};

// Whether part `part` is one matrix over the blocks of every group (MatvecPart::single).
__host__ __device__ __forceinline__ bool matvec_part_single(const MatvecArgs& a, uint32_t part) {
  return part > 0 && a.more[part - 1].single;
}
// Whether the block's part is.
__device__ __forceinline__ bool matvec_single_part(const MatvecArgs& a) { return matvec_part_single(a, blockIdx.z); }

// Whether part `part` has its own row format (MatvecPart::type).
__host__ __device__ __forceinline__ bool matvec_part_own_format(const MatvecArgs& a, uint32_t part) {
  return part > 0 && a.more[part - 1].row_bytes != 0;
}

// The type of the launch's parts of their own row format (MatvecPart::type), else w's.
inline model::GgmlType matvec_second_type(const MatvecArgs& a) {
  for (uint32_t p = 1; p < a.parts && p < kMaxMatvecParts; ++p) {
    if (matvec_part_own_format(a, p)) return a.more[p - 1].type;
  }
  return a.w.type;
}

// The rows of part `part`.
__host__ __device__ __forceinline__ uint32_t matvec_part_rows(const MatvecArgs& a, uint32_t part) {
  return part == 0 || a.more[part - 1].rows == 0 ? a.w.rows : a.more[part - 1].rows;
}

// Group g of part `part` (g is 0 for a single part: matvec_block_take).
__device__ __forceinline__ MatvecPartView matvec_part_view(const MatvecArgs& a, uint32_t g, uint32_t part) {
  const MatvecPart& more = a.more[part > 0 ? part - 1 : 0];
  const bool single = matvec_part_single(a, part);
  const size_t mat = single ? 0 : a.w_group_index ? static_cast<size_t>(a.w_group_index[g]) : g;
  const uint8_t* const* group_ptrs = part == 0 ? a.w_group_ptrs : more.group_ptrs;
  const uint8_t* data = part == 0 ? a.w.data : more.data;
  const float* x = part == 0 || more.x == nullptr ? a.x : more.x;
  return {group_ptrs && !single ? group_ptrs[mat] : data + mat * a.w_group_bytes,
          x + static_cast<size_t>(g / a.x_group_div) * a.x_group_stride, part == 0 ? a.y : more.y,
          matvec_part_rows(a, part),
          part == 0 || more.y_tok_stride == 0 ? a.y_tok_stride : more.y_tok_stride};
}
// Group g of the block's part.
__device__ __forceinline__ MatvecPartView matvec_part_view(const MatvecArgs& a, uint32_t g) {
  return matvec_part_view(a, g, blockIdx.z);
}

// SwiGLU's up input of group g's first token in part `part` (null: none), at x's offsets.
__device__ __forceinline__ const float* matvec_part_x_up(const MatvecArgs& a, uint32_t g, uint32_t part) {
  const MatvecPart& more = a.more[part > 0 ? part - 1 : 0];
  const float* x_up = part == 0 || more.x_up == nullptr ? a.x_up : more.x_up;
  return x_up != nullptr ? x_up + static_cast<size_t>(g / a.x_group_div) * a.x_group_stride : nullptr;
}
// In the block's part.
__device__ __forceinline__ const float* matvec_part_x_up(const MatvecArgs& a, uint32_t g) {
  return matvec_part_x_up(a, g, blockIdx.z);
}

// Whether no earlier kernel picks part `part`'s weights (no router ids, pool tables or groups named
// on the device, or a single part's one matrix): under PDL (gpu/pdl.hpp) only such weights may be
// requested before the wait.
__device__ __forceinline__ bool matvec_part_fixed_weights(const MatvecArgs& a, uint32_t part) {
  if (matvec_part_single(a, part)) return true;
  bool fixed = a.w_group_index == nullptr && a.w_group_ptrs == nullptr && a.group_count == nullptr;
  for (uint32_t p = 1; p < a.parts && p < kMaxMatvecParts; ++p) fixed = fixed && a.more[p - 1].group_ptrs == nullptr;
  return fixed;
}
// Of the block's part.
__device__ __forceinline__ bool matvec_fixed_weights(const MatvecArgs& a) {
  return matvec_part_fixed_weights(a, blockIdx.z);
}

// What one block of a launch works on: group g as its bx-th block of nb, over ntok tokens (named by
// tok_x / tok_y when the groups are named on the device).
struct MatvecBlockTake {
  uint32_t g, bx, nb, ntok;
  const int32_t* tok_x;
  const int32_t* tok_y;
};

// With `named` (groups named on the device, MatvecArgs::group_count) the groups share the launch's
// blocks by blockIdx.x: block b works on group b % G as its (b / G)-th block of nb; otherwise
// blockIdx.y is the group. False: the block has nothing to do (no groups, no tokens, or a skipped
// group). Named groups and skipped groups read what earlier kernels write, so a kernel under PDL
// calls this after its wait whenever matvec_fixed_weights does not hold (both do).
__device__ __forceinline__ bool matvec_block_take(const MatvecArgs& a, bool named, MatvecBlockTake& t) {
  t = {blockIdx.y, blockIdx.x, gridDim.x, a.tokens, nullptr, nullptr};
  if (matvec_single_part(a)) {
    t = {0, blockIdx.y * gridDim.x + blockIdx.x, gridDim.x * gridDim.y, a.tokens, nullptr, nullptr};
    return true;
  }
  if (named) {
    const uint32_t groups = min(static_cast<uint32_t>(max(*a.group_count, 0)), a.groups);
    if (groups == 0) return false;
    t.g = blockIdx.x % groups;
    t.bx = blockIdx.x / groups;
    t.nb = gridDim.x / groups + (t.g < gridDim.x % groups ? 1 : 0);
    t.ntok = min(static_cast<uint32_t>(max(a.tok_count[t.g], 0)), a.tokens);
    if (t.ntok == 0) return false;
    t.tok_x = a.tok_x + static_cast<size_t>(t.g) * a.tokens;
    t.tok_y = a.tok_y + static_cast<size_t>(t.g) * a.tokens;
  }
  return !(a.skip_negative_index && a.w_group_index[t.g] < 0);
}

// The parts that are not single (each takes gridDim.x blocks of every group).
inline uint32_t matvec_grouped_parts(const MatvecArgs& a) {
  uint32_t n = 1;
  for (uint32_t p = 1; p < a.parts && p < kMaxMatvecParts; ++p) n += matvec_part_single(a, p) ? 0 : 1;
  return n;
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
