#pragma once
// The many-block sampler's sizes, its per-row scratch in global memory (RowScratch: the summed
// histograms, the barrier's counters, the gathered list) and its block's shared memory (Local), with
// the L2 loads and stores by which a block reads what the row's other blocks wrote. Only
// gpu/sampling_grid.cu includes it.
#include <cstdint>

#include "model/cpu/sampling_rule.hpp"

namespace ferry::gpu::sample_grid {

using model::sampling::u128;
using ull = unsigned long long;

constexpr int kThreads = 512;
constexpr int kPer = 8;  // keys a thread holds
constexpr uint32_t kBlockKeys = uint32_t{kThreads} * kPer;
constexpr uint32_t kMaxRows = 8;  // rows of one launch: the scratch holds this many
// Barriers of one row: the argmax, the value histogram, then either the gather or up to 8 digits of a
// 63-bit key for each of the three selects (top-k, top-p, the draw) and min-p's.
constexpr int kPasses = 2 + 3 * 8 + 1;
constexpr unsigned kMarks = 24;  // phase marks kept (GridRow::mark)
// Keys gathered during the value histogram already: buckets from here up, (value - top) / T > -16.125.
constexpr int kSpecBucket = 255 - 128;
constexpr unsigned kAll = 0xffffffffu;
constexpr uint32_t kCountedBlocks = 64;  // blocks of a row whose value-bucket counts are kept (the walk)
// A list's value bucket of up to this many keys is ordered by counting (each key against all), more by
// the radix passes: the counting is one pass of m steps a key, the passes ~4 block barriers each.
constexpr uint32_t kRankKeys = 128;
constexpr unsigned kRankLanes = 4;  // threads that count one key's measure, each over a share of the keys
static_assert(kRankKeys * kRankLanes <= kThreads, "a counted bucket takes kRankLanes threads a key");
static_assert(32 % kRankLanes == 0, "a key's threads are lanes of one warp");

// One pass's histogram summed over a row's blocks: a block's weight W of a bucket adds W mod 2^32 to lo
// and W >> 32 to hi (the bucket's weight is lo + hi * 2^32); neither sum can wrap for 2^31 keys.
struct Pass {
  uint32_t count[256];
  ull lo[256], hi[256];
  ull top[256];  // a key of the bucket, stored by each block that has one: the key when count is 1
};
struct RowScratch {
  unsigned arrived;  // blocks at a barrier, over the whole launch
  unsigned exited;
  unsigned listed_early, listed;  // keys gathered during the value histogram, and after it
  ull past;  // 1 + the largest key lighter than min-p's threshold (0: none), over the whole row
  Pass pass[kPasses];
  ull list[kBlockKeys];  // the gathered keys, in no order
  // Of the value histogram: per bucket the largest value's order bits and the smallest's complement
  // (maxima, so that zero is empty), and each block's count (at most kBlockKeys).
  uint32_t vmax[256], vlow[256];
  uint16_t block_count[kCountedBlocks][256];
  // The launch's first block (row 0's first): its SM clock at each phase mark of the last launch, and
  // how many marks it made.
  ull mark_clock[kMarks];
  unsigned marks;
};

// A histogram's sums from each bucket up (index 256: none): the count and the weight (mass_lo, mass_hi:
// its low and high 64 bits) of the buckets >= b, and a key of each bucket. A choice on it is a
// bisection, a tally one read.
struct Above {
  ull count[257], mass_lo[257], mass_hi[257];
  ull top[256];
};

// A block's histogram. Shared-memory atomics on 64 bits are compare-and-swap loops, slow when many
// warps hit one bucket, so a bucket's weight is a 96-bit number in three 32-bit words (m0 low) added
// with carries, and its key is stored, not maxed: it is read only when the bucket holds one key.
struct Local {
  uint32_t count[256];
  uint32_t m0[256], m1[256], m2[256];
  ull top[256];
  uint32_t vmax[256], vlow[256];  // the value histogram's value range per bucket, as in RowScratch
  ull group_w[kThreads], group_k[kThreads];  // a warp's weights and keys, for the lowest lane of a bucket
  uint32_t nth_block, warp_total[kThreads / 32];  // nth_key
  ull nth_rank, nth_key;
  // The value histogram summed over the row's blocks, read from L2 once after its barrier (every scan
  // and tally of it reads these), and a radix pass's histogram summed the same way for its choice.
  Above value_sums, pass_sums;
  uint32_t value_max[256], value_low[256];
  ull sum_count[256 / 32], sum_lo[256 / 32], sum_hi[256 / 32];  // sum_above: each warp's sums
  uint32_t rank_n;  // select_in: the bucket's keys gathered, and the key found with its measure
  ull sel_key, sel_n, sel_lo, sel_hi;
  // Read by the bucket walk only, so kept here rather than in registers: the row's logits and a
  // drawn row's weight rule.
  const float* row;
  uint32_t vocab;
  float wr_top;
  double wr_inv_t;
  unsigned marks;  // phase marks made (GridRow::mark)
};

struct Tally {
  ull count;
  u128 mass;
};

// Value buckets to gather: `one`, and lo to hi.
struct Band {
  int one, lo, hi;
  __device__ bool has(int b) const { return b == one || (lo <= b && b <= hi); }
};

// How a drawn row goes on after its value histogram.
enum class Way { all_blocks, list, buckets, elsewhere };

// Reads of what other blocks added: from L2, past this SM's L1 (ld.global.cg).
__device__ inline uint32_t load_l2(const uint32_t& x) {
  uint32_t v;
  asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(&x));
  return v;
}
__device__ inline ull load_l2(const ull& x) {
  ull v;
  asm volatile("ld.global.cg.u64 %0, [%1];" : "=l"(v) : "l"(&x));
  return v;
}
__device__ inline uint16_t load_l2(const uint16_t& x) {
  unsigned short v;
  asm volatile("ld.global.cg.u16 %0, [%1];" : "=h"(v) : "l"(&x));
  return v;
}
__device__ inline void store_l2(ull& x, ull v) { asm volatile("st.global.cg.u64 [%0], %1;" ::"l"(&x), "l"(v) : "memory"); }

}  // namespace ferry::gpu::sample_grid
