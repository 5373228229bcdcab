#pragma once
// Decode products launched together (issue 15): matrices of one shape (KDA q/k/v, the gate and up of
// an FFN or of the routed experts, KDA's f_b and g_b) as the parts of one matvec launch, and
// the down projection reading SwiGLU(gate, up) itself. Fewer, fuller kernels a token; each output is
// the bits the separate launches gave (the same lanes sum the same units).
#include <cstdint>

#include "gpu/kernels.hpp"

namespace ferry::gpu {

struct MatvecProduct {
  const DevMatrix* m;
  float* y;
  const float* x = nullptr;  // null: the call's x
  size_t ldy = 0;            // 0: the call's ldy
};

// y_i[t][ldy_i] = M_i x_i[t] for t < n as one launch (x_i rows ldx apart), when n <= kMaxMatvecTokens,
// count <= kMaxMatvecParts and every M_i has M_0's type, columns and row bytes (rows may differ);
// returns false (and launches nothing) otherwise, for the caller's per-matrix path.
bool matvec_products(const MatvecProduct* ps, uint32_t count, const float* x, size_t ldx, uint32_t n, size_t ldy,
                       cudaStream_t stream);

// Whether gate and up (of an FFN or of every expert) can be the parts of one launch.
bool same_matrix_shape(const DevMatrix& a, const DevMatrix& b);
// Whether two matrices can be parts of one launch with their own rows.
bool same_row_format(const DevMatrix& a, const DevMatrix& b);

// The down projection `a` (its x the gate products) over SwiGLU(x, up) clamped at `limit`: made in the
// matvec's input quantization where the int16 path applies, else by swiglu() into x first (x then
// holds the activations, as before). rows x cols of gate / up, rows `stride` apart, as swiglu() takes.
void matvec_swiglu(MatvecArgs a, float* gate, const float* up, size_t stride, uint32_t rows, uint32_t cols,
                   float limit, cudaStream_t stream);

}  // namespace ferry::gpu
