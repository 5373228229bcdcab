// Block quantizers: ggml's reference algorithms (quantize_row_{q8_0,q4_K,q5_K,q6_K}_ref in
// ggml-quants.c), written for ferry. They are what `llama-quantize` does without an importance
// matrix, so files we write decode like theirs. Float operations keep ggml's order and rounding
// (each product rounded on its own; see quant_dequant.cpp on contraction); Q8_0 is byte-identical
// with gguf-py's quantizer, which the Python tests check.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "model/formats/half.hpp"
#include "model/formats/quant_kernels.hpp"

namespace ferry::model::quant_detail {
namespace {


// Fits x[i] ~ scale * L[i] - min with L[i] in [0, nmax] and min >= 0 (returned through the_min),
// minimising the weighted squared error: a first guess from the range, then `nstep` + 1 trial
// inverse scales (rmin + rdelta*is + nmax) / range, each refined by weighted least squares.
float fit_scale_min(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* the_min, float rmin,
                    float rdelta, int nstep) {
  float min = x[0];
  float max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    std::fill(L, L + n, uint8_t{0});
    *the_min = -min;
    return 0.0f;
  }
  float iscale = static_cast<float>(nmax) / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = static_cast<uint8_t>(std::clamp(l, 0, nmax));
    const float diff = scale * L[i] + min - x[i];
    best_error += weights[i] * (diff * diff);
  }
  uint8_t trial[32];
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * static_cast<float>(is) + static_cast<float>(nmax)) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest_int(iscale * (x[i] - min)), 0, nmax);
      trial[i] = static_cast<uint8_t>(l);
      const float w = weights[i];
      const float fl = static_cast<float>(l);
      sum_l += w * fl;
      sum_l2 += w * fl * fl;
      sum_xl += w * fl * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (det > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float error = 0;
      for (int i = 0; i < n; ++i) {
        const float diff = this_scale * trial[i] + this_min - x[i];
        error += weights[i] * (diff * diff);
      }
      if (error < best_error) {
        std::copy(trial, trial + n, L);
        best_error = error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

// Fits x[i] ~ scale * (L[i] - nmax) with L[i] - nmax in [-nmax, nmax-1], weights x^2: a first guess
// that maps the largest |x| to -nmax, then 18 trial scales around it, keeping the best least-squares
// fit (ggml's make_qx_quants with rmse_type 1 and no importance weights).
float fit_symmetric_scale(int n, int nmax, const float* x, int8_t* L) {
  float max = 0;
  float amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    std::fill(L, L + n, int8_t{0});
    return 0.0f;
  }
  const auto level = [nmax](float v) { return std::clamp(nearest_int(v), -nmax, nmax - 1); };
  float iscale = static_cast<float>(-nmax) / max;
  float sumlx = 0;
  float suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = level(iscale * x[i]);
    L[i] = static_cast<int8_t>(l + nmax);
    const float w = x[i] * x[i];
    const float fl = static_cast<float>(l);
    sumlx += w * x[i] * fl;
    suml2 += w * fl * fl;
  }
  float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(is)) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const float fl = static_cast<float>(level(iscale * x[i]));
      const float w = x[i] * x[i];
      sumlx += w * x[i] * fl;
      suml2 += w * fl * fl;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(level(iscale * x[i]) + nmax);
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Q4_K and Q5_K share everything but the level count and the search range of the scale fit.
// Fills d, dmin and the 12 packed scale bytes at `block`, and the 256 levels in L.
void quantize_k_scales(const float* x, int nmax, float rmin, int nstep, uint8_t* block, uint8_t* L) {
  float scales[8];
  float mins[8];
  float weights[32];
  float max_scale = 0;
  float max_min = 0;
  for (int j = 0; j < 8; ++j) {
    const float* xs = x + 32 * j;
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xs[l]);
    scales[j] = fit_scale_min(32, nmax, xs, weights, L + 32 * j, &mins[j], rmin, 0.1f, nstep);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }

  // The sub-block scales and mins are themselves quantized to 6 bits against the largest of each.
  uint8_t* packed = block + 4;
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  for (int j = 0; j < 8; ++j) {
    const auto ls = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_scale * scales[j])));
    const auto lm = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_min * mins[j])));
    if (j < 4) {
      packed[j] = ls;
      packed[j + 4] = lm;
    } else {
      packed[j + 4] = static_cast<uint8_t>((ls & 0xf) | ((lm & 0xf) << 4));
      packed[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      packed[j] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
  const uint16_t d16 = f32_to_fp16(max_scale / 63.0f);
  const uint16_t dmin16 = f32_to_fp16(max_min / 63.0f);
  store_u16(block, d16);
  store_u16(block + 2, dmin16);

  // Requantize against the scales as stored, so the levels fit what a reader will decode. A
  // sub-block whose stored scale is 0 keeps the levels of its fit (they decode to -min anyway).
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    k4_scale_min(packed, j, sc, m);
    const float d = fp16_to_f32(d16) * sc;
    if (d == 0) continue;
    const float dm = fp16_to_f32(dmin16) * m;
    for (int i = 0; i < 32; ++i) {
      L[32 * j + i] = static_cast<uint8_t>(std::clamp(nearest_int((x[32 * j + i] + dm) / d), 0, nmax));
    }
  }
}

}  // namespace

void quantize_q8_0(const float* src, uint8_t* dst, size_t blocks) {
  for (size_t b = 0; b < blocks; ++b, src += 32, dst += 34) {
    // A NaN anywhere makes the block's scale NaN (as numpy's max does), so it cannot pass unseen.
    float amax = 0;
    for (int j = 0; j < 32; ++j) {
      const float a = std::fabs(src[j]);
      if (a > amax || std::isnan(a)) amax = a;
    }
    const float d = amax / 127;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    store_u16(dst, f32_to_fp16(d));
    for (int j = 0; j < 32; ++j) {
      // Round half away from zero; |src*id| <= 127 for finite input (NaN stores 0).
      const float q = std::round(src[j] * id);
      dst[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(q >= -128.0f && q <= 127.0f ? q : 0.0f));
    }
  }
}

void quantize_q4_k(const float* src, uint8_t* dst, size_t blocks) {
  uint8_t L[256];
  for (size_t b = 0; b < blocks; ++b, src += 256, dst += 144) {
    quantize_k_scales(src, 15, -1.0f, 20, dst, L);
    uint8_t* qs = dst + 16;
    for (int pair = 0; pair < 4; ++pair) {
      for (int l = 0; l < 32; ++l) {
        qs[32 * pair + l] = static_cast<uint8_t>(L[64 * pair + l] | (L[64 * pair + 32 + l] << 4));
      }
    }
  }
}

void quantize_q5_k(const float* src, uint8_t* dst, size_t blocks) {
  uint8_t L[256];
  for (size_t b = 0; b < blocks; ++b, src += 256, dst += 176) {
    quantize_k_scales(src, 31, -0.5f, 15, dst, L);
    uint8_t* qh = dst + 16;
    uint8_t* qs = dst + 48;
    std::memset(qh, 0, 32);
    for (int pair = 0; pair < 4; ++pair) {
      for (int l = 0; l < 32; ++l) {
        const int q1 = L[64 * pair + l];
        const int q2 = L[64 * pair + 32 + l];
        qh[l] |= static_cast<uint8_t>(((q1 >> 4) << (2 * pair)) | ((q2 >> 4) << (2 * pair + 1)));
        qs[32 * pair + l] = static_cast<uint8_t>((q1 & 0xf) | ((q2 & 0xf) << 4));
      }
    }
  }
}

void quantize_q6_k(const float* src, uint8_t* dst, size_t blocks) {
  int8_t L[256];
  float scales[16];
  for (size_t b = 0; b < blocks; ++b, src += 256, dst += 210) {
    float max_scale = 0;
    float max_abs_scale = 0;
    for (int ib = 0; ib < 16; ++ib) {
      scales[ib] = fit_symmetric_scale(16, 32, src + 16 * ib, L + 16 * ib);
      const float abs_scale = std::fabs(scales[ib]);
      if (abs_scale > max_abs_scale) {
        max_abs_scale = abs_scale;
        max_scale = scales[ib];
      }
    }
    if (max_abs_scale < kGroupMaxEps) {
      std::memset(dst, 0, 210);
      continue;
    }

    // 8-bit sub-block scales against the largest; the sign of max_scale makes the largest -128.
    const float iscale = -128.0f / max_scale;
    const uint16_t d16 = f32_to_fp16(1 / iscale);
    store_u16(dst + 208, d16);
    auto* stored_scales = reinterpret_cast<int8_t*>(dst + 192);
    for (int ib = 0; ib < 16; ++ib) {
      stored_scales[ib] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[ib])));
    }
    for (int j = 0; j < 16; ++j) {
      const float d = fp16_to_f32(d16) * stored_scales[j];
      if (d == 0) continue;
      for (int i = 0; i < 16; ++i) {
        L[16 * j + i] = static_cast<int8_t>(std::clamp(nearest_int(src[16 * j + i] / d), -32, 31) + 32);
      }
    }

    for (int half = 0; half < 2; ++half) {
      uint8_t* ql = dst + 64 * half;
      uint8_t* qh = dst + 128 + 32 * half;
      const int8_t* Lh = L + 128 * half;
      for (int l = 0; l < 32; ++l) {
        const int q1 = Lh[l], q2 = Lh[l + 32], q3 = Lh[l + 64], q4 = Lh[l + 96];
        ql[l] = static_cast<uint8_t>((q1 & 0xf) | ((q3 & 0xf) << 4));
        ql[l + 32] = static_cast<uint8_t>((q2 & 0xf) | ((q4 & 0xf) << 4));
        qh[l] = static_cast<uint8_t>((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
      }
    }
  }
}

}  // namespace ferry::model::quant_detail
