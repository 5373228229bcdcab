// The IQ4_XS and IQ3_S quantizers: ggml's algorithms (quantize_row_iq4_nl_impl as IQ4_XS uses it,
// quantize_row_iq3_s_impl with its grid map and neighbour search, in ggml-quants.c), written for
// ferry. gguf-py has no IQ quantizers, so these are checked by decoding their blocks with gguf-py's
// dequantizers (equal to ours bit for bit) and by the round-trip error (tests/python/test_quants.py).
//
// An importance matrix row (one weight per element, what llama-quantize's --imatrix gives) is
// optional: without it every element is weighted by x^2, as ggml does; with it by
// importance * sqrt(sigma^2 + x^2), sigma^2 being twice the block's mean square.
//
// One deliberate difference: ggml's IQ3_S skips an all-zero 32-element sub-block without advancing
// its output pointers, so the sub-blocks after it land in the wrong slots. Here every sub-block is
// written at its own offset (an all-zero sub-block keeps zero grid indices and signs).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "model/formats/half.hpp"
#include "model/formats/iq_grids.hpp"
#include "model/formats/quant_kernels.hpp"

namespace ferry::model::quant_detail {
namespace {

// The index of the level in the ascending table `values` nearest to x (the lower one on a tie).
int nearest_level(const int8_t* values, int n, float x) {
  if (x <= values[0]) return 0;
  if (x >= values[n - 1]) return n - 1;
  int lo = 0, hi = n - 1;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (x < values[mid]) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  return x - values[hi - 1] < values[hi] - x ? hi - 1 : hi;
}

void element_weights(const float* x, const float* importance, float sigma2, float* w, int n) {
  for (int j = 0; j < n; ++j) {
    w[j] = importance != nullptr ? importance[j] * std::sqrt(sigma2 + x[j] * x[j]) : x[j] * x[j];
  }
}

// ---- IQ4_XS ------------------------------------------------------------------------------------

// Weighted least-squares scale of one 32-element sub-block on the non-linear levels: a first guess
// mapping the largest |x| to the outermost level, then 15 trial inverse scales around it.
float iq4_sub_block_scale(const float* x, const float* w) {
  float amax = 0, max = 0;
  for (int j = 0; j < 32; ++j) {
    const float ax = std::fabs(x[j]);
    if (ax > amax) {
      amax = ax;
      max = x[j];
    }
  }
  if (amax < kGroupMaxEps) return 0.0f;
  const int8_t* values = kIq4nlValues;
  auto fit = [&](float inv_scale, float& sum_qx, float& sum_q2) {
    sum_qx = sum_q2 = 0;
    for (int j = 0; j < 32; ++j) {
      const float q = values[nearest_level(values, 16, inv_scale * x[j])];
      sum_qx += w[j] * q * x[j];
      sum_q2 += w[j] * q * q;
    }
  };
  float sum_qx, sum_q2;
  fit(1 / (-max / values[0]), sum_qx, sum_q2);
  float d = sum_q2 > 0 ? sum_qx / sum_q2 : 0.0f;
  float best = d * sum_qx;
  for (int step = -7; step <= 7; ++step) {
    fit((static_cast<float>(step) + values[0]) / max, sum_qx, sum_q2);
    if (sum_q2 > 0 && sum_qx * sum_qx > best * sum_q2) {
      d = sum_qx / sum_q2;
      best = d * sum_qx;
    }
  }
  return d;
}

// f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128] (see dequantize_iq4_xs).
void iq4_xs_block(const float* x, const float* importance, uint8_t* out) {
  float sigma2 = 0;
  for (int j = 0; j < 256; ++j) sigma2 += x[j] * x[j];
  sigma2 *= 2.0f / 256;
  float scales[8];
  float w[32];
  float max_scale = 0, amax_scale = 0;
  for (int ib = 0; ib < 8; ++ib) {
    element_weights(x + 32 * ib, importance ? importance + 32 * ib : nullptr, sigma2, w, 32);
    scales[ib] = iq4_sub_block_scale(x + 32 * ib, w);
    if (std::fabs(scales[ib]) > amax_scale) {
      amax_scale = std::fabs(scales[ib]);
      max_scale = scales[ib];
    }
  }

  // Sub-block scales as 6-bit integers (-32..31) of a block scale that makes the largest -32.
  const float d = -max_scale / 32;
  store_u16(out, f32_to_fp16(d));
  const float inv_d = d != 0 ? 1 / d : 0.0f;
  uint16_t scales_h = 0;
  uint8_t* scales_l = out + 4;
  uint8_t* qs = out + 8;
  std::memset(scales_l, 0, 4);
  uint8_t L[256];
  for (int ib = 0; ib < 8; ++ib) {
    const int l = std::clamp(nearest_int(inv_d * scales[ib]), -32, 31);
    const float dl = d * static_cast<float>(l);
    const float inv_dl = dl != 0 ? 1 / dl : 0.0f;
    for (int j = 0; j < 32; ++j) L[32 * ib + j] = static_cast<uint8_t>(nearest_level(kIq4nlValues, 16, inv_dl * x[32 * ib + j]));
    const int stored = l + 32;
    scales_l[ib / 2] |= static_cast<uint8_t>((stored & 0xf) << (4 * (ib % 2)));
    scales_h |= static_cast<uint16_t>((stored >> 4) << (2 * ib));
  }
  store_u16(out + 2, scales_h);
  for (int ib = 0; ib < 8; ++ib) {
    for (int j = 0; j < 16; ++j) qs[16 * ib + j] = static_cast<uint8_t>(L[32 * ib + j] | (L[32 * ib + 16 + j] << 4));
  }
}

// ---- IQ3_S -------------------------------------------------------------------------------------

// The 512 grid points as 3-bit levels (element value 2*level + 1), and for every 12-bit combination of
// four levels that is not on the grid, its nearest grid points (those at the 3 smallest squared
// distances), as ggml's iq3xs_init_impl builds them.
class Iq3sGrid {
 public:
  Iq3sGrid() : map_(4096, -1) {
    for (int i = 0; i < 512; ++i) map_[key_of_grid(i)] = i;
    // Squared distances are at most 4 * 14^2: bucket them instead of sorting (the order is the same:
    // by distance, then by grid index).
    std::vector<int> dist(512);
    for (int u = 0; u < 4096; ++u) {
      if (map_[u] >= 0) continue;
      std::array<bool, 4 * 14 * 14 + 1> present{};
      for (int j = 0; j < 512; ++j) {
        int d2 = 0;
        for (int k = 0; k < 4; ++k) {
          const int diff = element(j, k) - (2 * ((u >> (3 * k)) & 7) + 1);
          d2 += diff * diff;
        }
        dist[j] = d2;
        present[d2] = true;
      }
      map_[u] = -static_cast<int>(neighbours_.size()) - 1;
      const size_t count_at = neighbours_.size();
      neighbours_.push_back(0);
      int distinct = 0;
      for (int d2 = 0; d2 < static_cast<int>(present.size()) && distinct < 3; ++d2) {
        if (!present[d2]) continue;
        ++distinct;
        for (int j = 0; j < 512; ++j) {
          if (dist[j] == d2) neighbours_.push_back(static_cast<uint16_t>(j));
        }
      }
      neighbours_[count_at] = static_cast<uint16_t>(neighbours_.size() - count_at - 1);
    }
  }

  static int element(int index, int k) { return static_cast<int>((kIq3sGrid[index] >> (8 * k)) & 0xff); }
  // The grid index of four levels, or -1 when they are not on the grid.
  int index_of(const int8_t* levels) const {
    const int m = map_[key(levels)];
    return m >= 0 ? m : -1;
  }
  // For four levels off the grid: the grid point nearest to xval (weighted, at `scale`); its levels
  // are written back to `levels`.
  int nearest(int8_t* levels, const float* xval, const float* w, float scale) const {
    const uint16_t* n = neighbours_.data() + (-map_[key(levels)] - 1);
    float best = std::numeric_limits<float>::max();
    int index = n[1];
    for (int j = 1; j <= n[0]; ++j) {
      float d2 = 0;
      for (int i = 0; i < 4; ++i) {
        const float diff = scale * static_cast<float>(element(n[j], i)) - xval[i];
        d2 += w[i] * diff * diff;
      }
      if (d2 < best) {
        best = d2;
        index = n[j];
      }
    }
    for (int i = 0; i < 4; ++i) levels[i] = static_cast<int8_t>((element(index, i) - 1) / 2);
    return index;
  }

 private:
  static int key(const int8_t* levels) {
    int u = 0;
    for (int i = 0; i < 4; ++i) u |= levels[i] << (3 * i);
    return u;
  }
  static int key_of_grid(int index) {
    int u = 0;
    for (int k = 0; k < 4; ++k) u |= ((element(index, k) - 1) / 2) << (3 * k);
    return u;
  }

  std::vector<int> map_;
  std::vector<uint16_t> neighbours_;
};

const Iq3sGrid& iq3s_grid() {
  static const Iq3sGrid grid;  // built once, on first use (thread-safe static init)
  return grid;
}

constexpr int kIq3MaxLevel = 8;

// Levels (0..7) of the 32 magnitudes in xval at inverse scale `inv`, each group of four moved to the
// grid (to the nearest grid point at `scale` when off it); on_grid[k] says whether group k was.
void iq3_levels(const Iq3sGrid& grid, const float* xval, const float* waux, float inv, float scale, int8_t* L,
                bool* on_grid) {
  for (int k = 0; k < 8; ++k) {
    for (int i = 0; i < 4; ++i) {
      L[4 * k + i] = static_cast<int8_t>(
          std::clamp(nearest_int(0.5f * (inv * xval[4 * k + i] - 1)), 0, kIq3MaxLevel - 1));
    }
    on_grid[k] = grid.index_of(L + 4 * k) >= 0;
    if (!on_grid[k]) grid.nearest(L + 4 * k, xval + 4 * k, waux + 4 * k, scale);
  }
}

// One 32-element sub-block: its magnitudes' grid levels in L, sign bits in signs[4]; returns its
// scale (>= 0; 0 for an all-zero sub-block).
float iq3_sub_block(const Iq3sGrid& grid, const float* x, const float* w, int8_t* L, uint8_t* signs) {
  float xval[32], waux[32];
  for (int i = 0; i < 32; ++i) waux[i] = std::sqrt(w[i]);
  for (int k = 0; k < 4; ++k) {
    uint8_t s = 0;
    for (int i = 0; i < 8; ++i) {
      const float v = x[8 * k + i];
      xval[8 * k + i] = v >= 0 ? v : -v;
      if (!(v >= 0)) s |= static_cast<uint8_t>(1u << i);
    }
    signs[k] = s;
  }
  float max = xval[0];
  for (int i = 1; i < 32; ++i) max = std::max(max, xval[i]);
  std::memset(L, 0, 32);
  if (!(max > 0)) return 0.0f;

  auto fit = [&](const int8_t* levels, float& sum_qx, float& sum_q2) {
    sum_qx = sum_q2 = 0;
    for (int i = 0; i < 32; ++i) {
      const float q = static_cast<float>(2 * levels[i] + 1);
      sum_qx += w[i] * xval[i] * q;
      sum_q2 += w[i] * q * q;
    }
  };
  float best = 0;
  float scale = max / (2 * kIq3MaxLevel - 1);
  bool on_grid[8] = {};
  int8_t trial[32];
  bool trial_on_grid[8];
  for (int step = -9; step <= 9; ++step) {
    const float inv = (2 * kIq3MaxLevel - 1 + static_cast<float>(step) * 0.2f) / max;
    iq3_levels(grid, xval, waux, inv, 1 / inv, trial, trial_on_grid);
    float sum_qx, sum_q2;
    fit(trial, sum_qx, sum_q2);
    if (sum_q2 > 0 && sum_qx * sum_qx > best * sum_q2) {
      scale = sum_qx / sum_q2;
      best = scale * sum_qx;
      std::copy(trial, trial + 32, L);
      std::copy(trial_on_grid, trial_on_grid + 8, on_grid);
    }
  }
  // Groups that had to move to a neighbour: redo every group at the final scale, then refit it.
  if (std::count(on_grid, on_grid + 8, false) > 0 && scale > 0) {
    iq3_levels(grid, xval, waux, 1 / scale, scale, L, trial_on_grid);
    float sum_qx, sum_q2;
    fit(L, sum_qx, sum_q2);
    if (sum_q2 > 0) scale = sum_qx / sum_q2;
  }
  if (scale < 0) {  // cannot happen for non-negative weights; the stored scale is unsigned
    scale = -scale;
    for (int k = 0; k < 4; ++k) signs[k] = static_cast<uint8_t>(~signs[k]);
  }
  return scale;
}

// f16 d; u8 qs[64]; u8 qh[8]; u8 signs[32]; u8 scales[4] (see dequantize_iq3_s).
void iq3_s_block(const Iq3sGrid& grid, const float* x, const float* importance, uint8_t* out) {
  std::memset(out, 0, 110);
  uint8_t* qs = out + 2;
  uint8_t* qh = out + 66;
  uint8_t* signs = out + 74;
  uint8_t* packed_scales = out + 106;
  float sum_x2 = 0;
  for (int i = 0; i < 256; ++i) sum_x2 += x[i] * x[i];
  const float sigma2 = 2 * sum_x2 / 256;
  float scales[8];
  float max_scale = 0;
  float w[32];
  int8_t L[32];
  for (int ib = 0; ib < 8; ++ib) {
    element_weights(x + 32 * ib, importance ? importance + 32 * ib : nullptr, sigma2, w, 32);
    scales[ib] = iq3_sub_block(grid, x + 32 * ib, w, L, signs + 4 * ib);
    if (scales[ib] == 0) std::memset(signs + 4 * ib, 0, 4);
    for (int k = 0; k < 8; ++k) {
      const int index = scales[ib] == 0 ? 0 : grid.index_of(L + 4 * k);  // every group is on the grid here
      qs[8 * ib + k] = static_cast<uint8_t>(index & 255);
      qh[ib] |= static_cast<uint8_t>((index >> 8) << k);
    }
    max_scale = std::max(max_scale, scales[ib]);
  }
  if (!(max_scale > 0)) {
    std::memset(out, 0, 110);
    return;
  }
  // 4-bit sub-block scales s, decoded as d * (1 + 2s); the 1.033 is ggml's, a measured improvement.
  const float d = max_scale / 31;
  store_u16(out, f32_to_fp16(d * 1.033f));
  const float inv_d = 1 / d;
  for (int ib = 0; ib < 8; ib += 2) {
    const int l1 = std::clamp(nearest_int(0.5f * (inv_d * scales[ib] - 1)), 0, 15);
    const int l2 = std::clamp(nearest_int(0.5f * (inv_d * scales[ib + 1] - 1)), 0, 15);
    packed_scales[ib / 2] = static_cast<uint8_t>(l1 | (l2 << 4));
  }
}

}  // namespace

void quantize_iq4_xs(const float* src, uint8_t* dst, size_t blocks, const float* importance) {
  for (size_t b = 0; b < blocks; ++b) {
    iq4_xs_block(src + 256 * b, importance ? importance + 256 * b : nullptr, dst + 136 * b);
  }
}

void quantize_iq3_s(const float* src, uint8_t* dst, size_t blocks, const float* importance) {
  const Iq3sGrid& grid = iq3s_grid();
  for (size_t b = 0; b < blocks; ++b) {
    iq3_s_block(grid, src + 256 * b, importance ? importance + 256 * b : nullptr, dst + 110 * b);
  }
}

}  // namespace ferry::model::quant_detail
