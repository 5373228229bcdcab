#pragma once
// The CPU forward pass's building blocks: the row-parallel matrix product over weights read in place
// (model/formats/weight_matrix.hpp), and the element-wise ops of glm5_next (norms, activations, softmax).
// All compute is f32; sums of squares and softmax denominators accumulate in double.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "model/cpu/thread_pool.hpp"
#include "model/formats/weight_matrix.hpp"

namespace ferry::model {

// Y[t][o] = sum_i W[o][i] * X[t][i] for t < tokens; X is tokens x W.cols, Y is tokens x W.rows.
// Parallel over output rows.
void matmul(const WeightMatrix& w, const float* x, size_t tokens, float* y, ThreadPool& pool);
// The same on the calling thread only (inside an op that is itself parallel).
void matmul_serial(const WeightMatrix& w, const float* x, size_t tokens, float* y);

float dot(const float* a, const float* b, size_t n);

// x * rsqrt(mean(x^2) + eps) * w (w may be null: the unweighted norm of the mHC input).
void rms_norm(const float* x, const float* w, size_t n, float eps, float* out);
// (x - mean) * rsqrt(var + eps) * w + b, the population variance (torch's LayerNorm).
void layer_norm(const float* x, const float* w, const float* b, size_t n, float eps, float* out);
// x / sqrt(sum x^2 + eps) (the KDA q/k norm, FLA's variant: eps inside the root, no max).
void l2_norm(float* x, size_t n, float eps);

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
// In place over x[0, n): exp(x - max) / sum.
void softmax(float* x, size_t n);

// Clamped SwiGLU: silu(min(gate, limit)) * clamp(up, -limit, limit), into gate.
void swiglu_clamped(float* gate, const float* up, size_t n, float limit);

// The tie rule of every top-k in ferry (DSA pools, MoE experts and groups, sampling): the higher value
// first, then the lower index. A strict total order, so every selection is deterministic.
struct HigherValueFirst {
  const float* values;
  bool operator()(uint32_t a, uint32_t b) const {
    return values[a] > values[b] || (values[a] == values[b] && a < b);
  }
};

}  // namespace ferry::model
