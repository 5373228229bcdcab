#include "model/cpu/mhc.hpp"

#include <algorithm>
#include <vector>

namespace ferry::model {

void sinkhorn(float* comb, uint32_t h, uint32_t iters, float eps) {
  auto normalise_columns = [&] {
    for (uint32_t j = 0; j < h; ++j) {
      float s = 0.0f;
      for (uint32_t i = 0; i < h; ++i) s += comb[i * h + j];
      const float d = s + eps;
      for (uint32_t i = 0; i < h; ++i) comb[i * h + j] /= d;
    }
  };
  auto normalise_rows = [&] {
    for (uint32_t i = 0; i < h; ++i) {
      float s = 0.0f;
      for (uint32_t j = 0; j < h; ++j) s += comb[i * h + j];
      const float d = s + eps;
      for (uint32_t j = 0; j < h; ++j) comb[i * h + j] /= d;
    }
  };
  normalise_columns();
  for (uint32_t it = 1; it < iters; ++it) {
    normalise_rows();
    normalise_columns();
  }
}

void mhc_coefficients(const MhcConfig& c, const float* m, const float* base, const float* scale, float* pre,
                      float* post, float* comb) {
  const uint32_t h = c.streams;
  for (uint32_t i = 0; i < h; ++i) {
    pre[i] = sigmoid(m[i] * scale[0] + base[i]) + c.eps;
    post[i] = 2.0f * sigmoid(m[h + i] * scale[1] + base[h + i]);
  }
  for (uint32_t i = 0; i < h; ++i) {
    float* row = comb + i * h;
    for (uint32_t j = 0; j < h; ++j) row[j] = m[2 * h + i * h + j] * scale[2] + base[2 * h + i * h + j];
    softmax(row, h);
    for (uint32_t j = 0; j < h; ++j) row[j] += c.eps;
  }
  sinkhorn(comb, h, c.sinkhorn_iters, c.eps);
}

void mhc_pre(const MhcConfig& c, const WeightMatrix& fn, const float* base, const float* scale, const float* streams,
             size_t tokens, size_t hidden, float* u, float* post, float* comb, ThreadPool& pool) {
  const uint32_t h = c.streams;
  const size_t width = h * hidden;
  const size_t mix = (2 + size_t{h}) * h;
  std::vector<float> flat(tokens * width), m(tokens * mix);
  pool.parallel_for(tokens, 1, [&](size_t t0, size_t t1) {
    for (size_t t = t0; t < t1; ++t) rms_norm(streams + t * width, nullptr, width, c.norm_eps, flat.data() + t * width);
  });
  matmul(fn, flat.data(), tokens, m.data(), pool);
  pool.parallel_for(tokens, 1, [&](size_t t0, size_t t1) {
    std::vector<float> pre(h);
    for (size_t t = t0; t < t1; ++t) {
      mhc_coefficients(c, m.data() + t * mix, base, scale, pre.data(), post + t * h, comb + t * h * h);
      float* ut = u + t * hidden;
      const float* rt = streams + t * width;
      std::fill(ut, ut + hidden, 0.0f);
      for (uint32_t s = 0; s < h; ++s) {
        const float p = pre[s];
        for (size_t d = 0; d < hidden; ++d) ut[d] += p * rt[s * hidden + d];
      }
    }
  });
}

void mhc_post(const MhcConfig& c, const float* y, const float* post, const float* comb, size_t tokens, size_t hidden,
              float* streams, ThreadPool& pool) {
  const uint32_t h = c.streams;
  pool.parallel_for(tokens, 1, [&](size_t t0, size_t t1) {
    std::vector<float> out(h * hidden);
    for (size_t t = t0; t < t1; ++t) {
      float* rt = streams + t * h * hidden;
      const float* ct = comb + t * h * h;
      const float* yt = y + t * hidden;
      for (uint32_t j = 0; j < h; ++j) {
        float* o = out.data() + j * hidden;
        const float pj = post[t * h + j];
        for (size_t d = 0; d < hidden; ++d) o[d] = pj * yt[d];
        for (uint32_t i = 0; i < h; ++i) {
          const float w = ct[i * h + j];
          const float* ri = rt + i * hidden;
          for (size_t d = 0; d < hidden; ++d) o[d] += w * ri[d];
        }
      }
      std::copy(out.begin(), out.end(), rt);
    }
  });
}

}  // namespace ferry::model
