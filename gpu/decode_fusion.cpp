#include "gpu/decode_fusion.hpp"

namespace ferry::gpu {

bool same_matrix_shape(const DevMatrix& a, const DevMatrix& b) {
  return a.type == b.type && a.rows == b.rows && a.cols == b.cols && a.row_bytes == b.row_bytes;
}

bool same_row_format(const DevMatrix& a, const DevMatrix& b) {
  return a.type == b.type && a.cols == b.cols && a.row_bytes == b.row_bytes;
}

bool matvec_products(const MatvecProduct* ps, uint32_t count, const float* x, size_t ldx, uint32_t n, size_t ldy,
                       cudaStream_t stream) {
  if (count == 0 || count > kMaxMatvecParts || n == 0 || n > kMaxMatvecTokens) return false;
  for (uint32_t i = 1; i < count; ++i) {
    if (!same_row_format(*ps[i].m, *ps[0].m) || ps[i].m->rows == 0) return false;
  }
  if (ps[0].m->rows == 0) return false;
  MatvecArgs a;
  a.w = *ps[0].m;
  a.x_tok_stride = ldx;
  a.y = ps[0].y;
  a.y_tok_stride = ps[0].ldy != 0 ? ps[0].ldy : ldy;
  a.tokens = n;
  a.parts = count;
  a.x = ps[0].x != nullptr ? ps[0].x : x;
  for (uint32_t i = 1; i < count; ++i) {
    a.more[i - 1] = {ps[i].m->data, nullptr, ps[i].y, ps[i].x, ps[i].m->rows, ps[i].ldy != 0 ? ps[i].ldy : ldy};
  }
  matvec(a, stream);
  return true;
}

void matvec_swiglu(MatvecArgs a, float* gate, const float* up, size_t stride, uint32_t rows, uint32_t cols,
                   float limit, cudaStream_t stream) {
  a.x = gate;
  a.x_up = up;
  a.swiglu_limit = limit;
  if (!matvec_quantizes_activations(a)) {
    swiglu(gate, up, stride, rows, cols, limit, stream);
    a.x_up = nullptr;
  }
  matvec(a, stream);
}

}  // namespace ferry::gpu
