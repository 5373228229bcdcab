#pragma once
// The MoE router's choice for one row, as a device function of a whole block: moe_route's kernel
// (gpu/ops.cu) runs it a block a row, and the decode router (gpu/moe_route_decode.cu) in the last
// block of its product.
#include <cuda_runtime.h>

#include <cstdint>

#include "gpu/kernels.hpp"

namespace ferry::gpu {

inline constexpr uint32_t kRouteMaxE = 1024, kRouteMaxGroups = 64, kRouteMaxK = 32;

struct RouteScratch {
  float choice[kRouteMaxE];
  float group_score[kRouteMaxGroups];
  bool kept[kRouteMaxGroups];
  int32_t top_id[kRouteMaxK];
  float top_s[kRouteMaxK];
  float cand_v[kRouteMaxE];
  uint32_t cand_e[kRouteMaxE];
  float cand_s[kRouteMaxE];
  uint32_t n_cand;
};

// A load from L2, past this SM's L1: a logit another block of the launch may have written.
__device__ __forceinline__ float load_from_l2(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
  return v;
}

// Row `row` of a.logits into a.ids / a.weights, by a block of at least a.E threads (one an expert; E <=
// 1024), all of which call it. Each expert's place in the CPU's order (higher choice first, ties to the
// lower index: model::HigherValueFirst) is the count of experts before it, found by every thread at
// once instead of k rounds of an arg-max (first within its warp, then among the warps' top k, 4 lanes a
// candidate); the groups rule the same way. Weights as model::route_token makes them: the chosen
// sigmoids summed in f64 in rank order. The logits are read from L2 (another block may have written
// them in this launch).
__device__ __forceinline__ void route_row(const RouterArgs& a, uint32_t row, RouteScratch& s) {
  const uint32_t e = threadIdx.x;
  const bool mine = e < a.E;
  float sig = 0.0f, ch = -INFINITY;
  if (mine) {
    sig = 1.0f / (1.0f + expf(-load_from_l2(a.logits + static_cast<size_t>(row) * a.E + e)));
    ch = sig + a.bias[e];
    s.choice[e] = ch;
  }
  if (e < kRouteMaxK) {  // NaN scores leave places unfilled: a valid expert there, not garbage
    s.top_id[e] = 0;
    s.top_s[e] = 0.0f;
  }
  if (e == 0) s.n_cand = 0;
  __syncthreads();
  // The place of v at index i among n values: how many come before it in the CPU's order.
  auto place = [](const float* vals, uint32_t n, float v, uint32_t i) {
    uint32_t before = 0;
#pragma unroll 8
    for (uint32_t j = 0; j < n; ++j) before += (vals[j] > v || (vals[j] == v && j < i)) ? 1u : 0u;
    return before;
  };
  if (a.n_group > 1 && a.topk_group < a.n_group) {
    // A group's score is the sum of its two best choices; experts of groups not kept are masked out.
    const uint32_t per = a.E / a.n_group;
    if (e < a.n_group) {
      float b1 = -INFINITY, b2 = -INFINITY;
      for (uint32_t i = e * per; i < (e + 1) * per; ++i) {
        const float v = s.choice[i];
        if (v > b1) {
          b2 = b1;
          b1 = v;
        } else if (v > b2) {
          b2 = v;
        }
      }
      s.group_score[e] = b1 + b2;
    }
    __syncthreads();
    if (e < a.n_group) s.kept[e] = place(s.group_score, a.n_group, s.group_score[e], e) < a.topk_group;
    __syncthreads();
    if (mine && !s.kept[e / per]) {
      ch = -INFINITY;
      s.choice[e] = ch;
    }
    __syncthreads();
  }
  // An expert of the top k is among its warp's top k, and every expert before it is too: so the
  // places among the warps' top k (the candidates) are the places among all, for the first k.
  uint32_t in_warp = 0;
#pragma unroll
  for (uint32_t j = 0; j < 32; ++j) {
    const float o = __shfl_sync(0xffffffffu, ch, j);
    const uint32_t oe = (e & ~31u) + j;
    in_warp += (o > ch || (o == ch && oe < e)) ? 1u : 0u;
  }
  const bool candidate = mine && in_warp < a.k;
  if (candidate) {
    const uint32_t slot = atomicAdd(&s.n_cand, 1u);  // any order: a place depends only on the values
    s.cand_v[slot] = ch;
    s.cand_e[slot] = e;
    s.cand_s[slot] = sig;
  }
  __syncthreads();
  // A candidate's place among the candidates, counted by kParts lanes of one warp over a share of
  // them each and summed by shuffles: the same count as one thread's loop over all, a quarter as long.
  constexpr uint32_t kParts = 4;
  static_assert(kParts == 4, "two shuffles sum a candidate's parts");
  const uint32_t nc = s.n_cand, share = (nc + kParts - 1) / kParts;
  for (uint32_t t0 = 0; t0 < nc * kParts; t0 += blockDim.x) {  // the same trips for every lane
    const uint32_t c = (t0 + e) / kParts, part = (t0 + e) % kParts;
    uint32_t r = 0, ce = 0;
    if (c < nc) {
      const float v = s.cand_v[c];
      ce = s.cand_e[c];
      const uint32_t end = min(nc, (part + 1) * share);
      for (uint32_t j = part * share; j < end; ++j) {
        r += (s.cand_v[j] > v || (s.cand_v[j] == v && s.cand_e[j] < ce)) ? 1u : 0u;
      }
    }
    r += __shfl_xor_sync(0xffffffffu, r, 1);
    r += __shfl_xor_sync(0xffffffffu, r, 2);
    if (c < nc && part == 0 && r < a.k) {
      s.top_id[r] = static_cast<int32_t>(ce);
      s.top_s[r] = s.cand_s[c];
    }
  }
  __syncthreads();
  if (e < a.k) {
    double sum = 0.0;
    for (uint32_t j = 0; j < a.k; ++j) sum += s.top_s[j];
    const float denom = a.norm_topk_prob ? static_cast<float>(sum) + 1e-20f : 1.0f;
    a.ids[row * a.k + e] = s.top_id[e];
    a.weights[row * a.k + e] = s.top_s[e] / denom * a.scaling;
  }
}

}  // namespace ferry::gpu
