#include "model/cpu/cpu_ops.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "model/formats/quant.hpp"

namespace ferry::model {

float dot(const float* a, const float* b, size_t n) {
  // Eight independent partial sums: the compiler vectorises them without reassociating one chain.
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (size_t j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  float tail = 0.0f;
  for (; i < n; ++i) tail += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
}

namespace {

constexpr size_t kTileRows = 4;

// Output rows [r0, r1): each tile of weight rows is made f32 once and used for every token.
void matmul_rows(const WeightMatrix& w, const float* x, size_t tokens, float* y, size_t r0, size_t r1) {
  thread_local std::vector<float> buf;
  const bool in_place = w.type == GgmlType::F32;
  if (!in_place && buf.size() < kTileRows * w.cols) buf.resize(kTileRows * w.cols);
  const float* rows[kTileRows];
  for (size_t r = r0; r < r1; r += kTileRows) {
    const size_t nr = std::min(kTileRows, r1 - r);
    for (size_t i = 0; i < nr; ++i) {
      if (in_place) {
        rows[i] = reinterpret_cast<const float*>(w.data + (r + i) * w.row_bytes);
      } else {
        w.row(r + i, buf.data() + i * w.cols);
        rows[i] = buf.data() + i * w.cols;
      }
    }
    for (size_t t = 0; t < tokens; ++t) {
      const float* xt = x + t * w.cols;
      float* yt = y + t * w.rows + r;
      for (size_t i = 0; i < nr; ++i) yt[i] = dot(rows[i], xt, w.cols);
    }
  }
}

}  // namespace

void matmul_serial(const WeightMatrix& w, const float* x, size_t tokens, float* y) {
  matmul_rows(w, x, tokens, y, 0, w.rows);
}

void matmul(const WeightMatrix& w, const float* x, size_t tokens, float* y, ThreadPool& pool) {
  if (tokens == 0 || w.rows == 0) return;
  // Pieces of at least ~64K multiply-adds, in whole tiles, so that dispatch does not dominate.
  const size_t work_per_row = std::max<size_t>(1, w.cols * tokens);
  size_t grain = std::max<size_t>(1, (size_t{1} << 16) / work_per_row);
  grain = (grain + kTileRows - 1) / kTileRows * kTileRows;
  pool.parallel_for(w.rows, grain, [&](size_t r0, size_t r1) { matmul_rows(w, x, tokens, y, r0, r1); });
}

void rms_norm(const float* x, const float* w, size_t n, float eps, float* out) {
  double ss = 0.0;
  for (size_t i = 0; i < n; ++i) ss += double(x[i]) * double(x[i]);
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / double(n) + double(eps)));
  if (w == nullptr) {
    for (size_t i = 0; i < n; ++i) out[i] = x[i] * inv;
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = x[i] * inv * w[i];
  }
}

void layer_norm(const float* x, const float* w, const float* b, size_t n, float eps, float* out) {
  double mean = 0.0;
  for (size_t i = 0; i < n; ++i) mean += x[i];
  mean /= double(n);
  double var = 0.0;
  for (size_t i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
  var /= double(n);
  const double inv = 1.0 / std::sqrt(var + double(eps));
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>((x[i] - mean) * inv) * w[i] + b[i];
}

void l2_norm(float* x, size_t n, float eps) {
  double ss = 0.0;
  for (size_t i = 0; i < n; ++i) ss += double(x[i]) * double(x[i]);
  const float inv = static_cast<float>(1.0 / std::sqrt(ss + double(eps)));
  for (size_t i = 0; i < n; ++i) x[i] *= inv;
}

void softmax(float* x, size_t n) {
  if (n == 0) return;
  const float mx = *std::max_element(x, x + n);
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (size_t i = 0; i < n; ++i) x[i] *= inv;
}

void swiglu_clamped(float* gate, const float* up, size_t n, float limit) {
  for (size_t i = 0; i < n; ++i) {
    const float g = std::min(gate[i], limit);
    const float u = std::clamp(up[i], -limit, limit);
    gate[i] = silu(g) * u;
  }
}

}  // namespace ferry::model
