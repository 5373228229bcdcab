#pragma once
// A grouped matvec launch's blocks shared out by the groups' steps (issue 15), for the tensor-core
// kernel (gpu/matvec_mma.cu; the dp2a kernel's steps differ in cost by type, and sharing them out
// measured slower: gpu/PERF.md, h72). A block step covers `rows_per_step` rows of one group; the 3-D
// grid gives every (part, group) the same blocks, so that a launch of routed experts and a shared
// expert's single parts (MatvecPart::single) runs two waves where one would do.
// Shared out, a 1-D grid of N blocks gives group u (every part's groups in order; a single part is one
// group) blocks [B(u), B(u + 1)), B(u) = u + (N - U) * (the steps of the groups before u) / S, so that
// every group has a block and the rest go by steps: one wave of about equal shares whatever the
// parts' and groups' sizes. A block's steps then stride over its group's as a block of a 3-D grid's
// do: the same rows computed alike, by other blocks (the same bits).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "gpu/matvec_part.cuh"

namespace ferry::gpu {

struct MatvecShare {
  uint32_t part, g, bx, nb;
};

__host__ __device__ inline uint32_t share_group_steps(const MatvecArgs& a, uint32_t part, uint32_t rows_per_step) {
  return (matvec_part_rows(a, part) + rows_per_step - 1) / rows_per_step;
}
__host__ __device__ inline uint32_t share_part_groups(const MatvecArgs& a, uint32_t part) {
  return matvec_part_single(a, part) ? 1 : a.groups;
}
// U and S.
__host__ __device__ inline void share_totals(const MatvecArgs& a, uint32_t rows_per_step, uint32_t& U, uint64_t& S) {
  U = 0, S = 0;
  for (uint32_t p = 0; p < a.parts && p < kMaxMatvecParts; ++p) {
    U += share_part_groups(a, p);
    S += uint64_t{share_part_groups(a, p)} * share_group_steps(a, p, rows_per_step);
  }
}
// Group u's part and group, and the steps of the groups before it.
__host__ __device__ inline uint64_t share_locate(const MatvecArgs& a, uint32_t rows_per_step, uint32_t u,
                                                 uint32_t& part, uint32_t& g) {
  uint64_t before = 0;
  part = 0;
  for (; part + 1 < a.parts && u >= share_part_groups(a, part); ++part) {
    u -= share_part_groups(a, part);
    before += uint64_t{share_part_groups(a, part)} * share_group_steps(a, part, rows_per_step);
  }
  g = u;
  return before + uint64_t{u} * share_group_steps(a, part, rows_per_step);
}
// B(u) of N blocks (N for u = U).
__host__ __device__ inline uint32_t share_first_block(const MatvecArgs& a, uint32_t rows_per_step, uint32_t u,
                                                      uint32_t U, uint64_t S, uint32_t N) {
  if (u >= U) return N;
  uint32_t part, g;
  const uint64_t extra = N > U ? N - U : 0, product = extra * share_locate(a, rows_per_step, u, part, g);
  // In 32 bits where it fits (a decode launch's: a 64-bit division costs a block's start ~10 times more).
  if (extra * S <= UINT32_MAX) return u + static_cast<uint32_t>(product) / static_cast<uint32_t>(S);
  return u + static_cast<uint32_t>(product / S);
}
// Block b's group and place in it.
__host__ __device__ inline MatvecShare share_of(const MatvecArgs& a, uint32_t rows_per_step, uint32_t b, uint32_t N) {
  uint32_t U;
  uint64_t S;
  share_totals(a, rows_per_step, U, S);
  uint32_t lo = 0, hi = U - 1;  // the last group whose first block is <= b
  while (lo < hi) {
    const uint32_t mid = (lo + hi + 1) / 2;
    if (share_first_block(a, rows_per_step, mid, U, S, N) <= b) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  MatvecShare sh;
  share_locate(a, rows_per_step, lo, sh.part, sh.g);
  const uint32_t from = share_first_block(a, rows_per_step, lo, U, S, N);
  sh.bx = b - from;
  sh.nb = share_first_block(a, rows_per_step, lo + 1, U, S, N) - from;
  return sh;
}

// A grouped launch's choices: the 3-D grid's longest block in steps, a second wave of that grid
// counted as two steps more (a step, its blocks' start and x again); the shared-out grid's blocks
// and longest block (0: not applicable: one group and part, or groups named on the device or
// skipped). The 3-D grid: x blocks a group of every grouped part, x * groups over a single part,
// x = min(the blocks the most rows want, resident / (groups * grouped parts)).
struct SharePlan {
  uint32_t grid_longest = 0, blocks = 0, longest = 0;
};
inline SharePlan share_plan(const MatvecArgs& a, uint32_t resident, uint32_t rows_per_step) {
  SharePlan plan;
  const uint32_t wanted = (matvec_max_rows(a) + rows_per_step - 1) / rows_per_step;
  const uint32_t x = std::min(wanted, std::max<uint32_t>(1, resident / (a.groups * matvec_grouped_parts(a))));
  for (uint32_t p = 0; p < a.parts && p < kMaxMatvecParts; ++p) {
    const uint32_t blocks = matvec_part_single(a, p) ? x * a.groups : x;
    plan.grid_longest = std::max(plan.grid_longest, (share_group_steps(a, p, rows_per_step) + blocks - 1) / blocks);
  }
  if (uint64_t{x} * a.groups * a.parts > resident) plan.grid_longest += 2;
  if ((a.parts < 2 && a.groups < 2) || a.group_count != nullptr || a.skip_negative_index) return plan;
  uint32_t U;
  uint64_t S;
  share_totals(a, rows_per_step, U, S);
  plan.blocks = static_cast<uint32_t>(std::max<uint64_t>(U, std::min<uint64_t>(S, resident)));
  for (uint32_t b = 0; b < plan.blocks;) {
    const MatvecShare sh = share_of(a, rows_per_step, b, plan.blocks);
    const uint32_t steps = share_group_steps(a, sh.part, rows_per_step);
    plan.longest = std::max(plan.longest, (steps + sh.nb - 1) / sh.nb);
    b += sh.nb - sh.bx;
  }
  return plan;
}

// The blocks of a shared-out launch where it applies and its longest block takes fewer steps than
// the 3-D grid's; 0 otherwise. One row's routed down and shared down: 9 steps against 8 and a second
// wave.
inline uint32_t share_blocks(const MatvecArgs& a, uint32_t resident, uint32_t rows_per_step) {
  const SharePlan plan = share_plan(a, resident, rows_per_step);
  return plan.blocks > 0 && plan.longest < plan.grid_longest ? plan.blocks : 0;
}

}  // namespace ferry::gpu
