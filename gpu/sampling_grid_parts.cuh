#pragma once
// The many-block sampler's block-wide parts (gpu/sampling_grid.cu) that its executor reaches from
// many call sites, out of line: one copy each. A launch runs each of its paths once, on code its SM
// has not cached, so the kernel's size is time (717 KB of SASS with every call site inlined, 195 KB
// so). Only gpu/sampling_grid.cu includes it.
#include <cstdint>

#include "gpu/sampling_grid_state.cuh"
#include "gpu/warp_u128.cuh"
#include "model/cpu/sampling_rule.hpp"

namespace ferry::gpu::sample_grid {

namespace rule = model::sampling;

// The block's shared memory, at namespace scope so that the out-of-line parts below address it as
// shared memory.
__shared__ Local block_sh;

// Adds `count` keys of weight lo + hi * 2^32 (lo, hi < 2^37) and one of their keys to bucket b; when
// `ranged`, their largest and smallest value too (top, low: their largest and smallest key).
__device__ inline void add_local(int b, uint32_t count, ull lo, ull hi, ull top, ull low, bool ranged, uint32_t bits) {
  Local& sh = block_sh;
  atomicAdd(&sh.count[b], count);
  sh.top[b] = top;
  if (ranged) {
    atomicMax(&sh.vmax[b], static_cast<uint32_t>(top >> (bits - 32)));
    atomicMax(&sh.vlow[b], ~static_cast<uint32_t>(low >> (bits - 32)));
  }
  if ((lo | hi) == 0) return;
  const auto v0 = static_cast<uint32_t>(lo);
  const ull rest = (lo >> 32) + hi;
  const auto v1 = static_cast<uint32_t>(rest);
  uint32_t v2 = static_cast<uint32_t>(rest >> 32);
  if (v0 != 0 && atomicAdd(&sh.m0[b], v0) > ~v0) {  // the low word wrapped: carry 1 into m1
    if (atomicAdd(&sh.m1[b], 1u) == ~0u) ++v2;
  }
  if (v1 != 0 && atomicAdd(&sh.m1[b], v1) > ~v1) ++v2;
  if (v2 != 0) atomicAdd(&sh.m2[b], v2);
}

// Adds key k (bucket b, -1 for none, weight w) of every lane to the block's histogram. Lanes of one
// bucket are summed in the warp first, since the first digits put most of a row in a few buckets: a
// whole-warp bucket by shuffles, smaller groups by their lowest lane reading its peers' weights from
// shared memory. `ranged` also keeps the bucket's value range (keys of `bits` bits).
__device__ __noinline__ void add_grouped(int b, ull w, ull k, bool ranged, uint32_t bits) {
  Local& sh = block_sh;
  if (__ballot_sync(kAll, b >= 0) == 0) return;
  const unsigned peers = __match_any_sync(kAll, b);
  const int lane = static_cast<int>(threadIdx.x & 31);
  if (__all_sync(kAll, peers == kAll)) {  // every lane in bucket b
    const ull lo = warp_sum_u64(w & 0xffffffffull), hi = warp_sum_u64(w >> 32), top = warp_max_u64(k);
    const ull low = ranged ? warp_min_u64(k) : k;
    if (lane == 0) add_local(b, 32, lo, hi, top, low, ranged, bits);
    return;
  }
  const unsigned base = threadIdx.x & ~31u;
  sh.group_w[threadIdx.x] = w;
  sh.group_k[threadIdx.x] = k;
  __syncwarp();
  if (b >= 0 && lane == __ffs(peers) - 1) {
    ull lo = 0, hi = 0, top = 0, low = ~0ull;
    for (unsigned m = peers; m != 0; m &= m - 1) {
      const unsigned i = base + static_cast<unsigned>(__ffs(m) - 1);
      const ull wi = sh.group_w[i], ki = sh.group_k[i];
      lo += wi & 0xffffffffull;
      hi += wi >> 32;
      top = ki > top ? ki : top;
      low = ki < low ? ki : low;
    }
    add_local(b, static_cast<uint32_t>(__popc(peers)), lo, hi, top, low, ranged, bits);
  }
  __syncwarp();
}

__device__ __noinline__ void clear_local() {
  Local& sh = block_sh;
  __syncthreads();  // the previous choice has been read
  for (int b = threadIdx.x; b < 256; b += kThreads) {
    sh.count[b] = sh.m0[b] = sh.m1[b] = sh.m2[b] = 0;
    sh.vmax[b] = sh.vlow[b] = 0;
  }
  __syncthreads();
}

// Warp 0 scans the buckets from the highest, 8 per lane: the block's own histogram (`local`) or the
// pass's sums, by count or weight, those below the floor counting nothing and the floor's counting
// floor_measure; the lane holding the goal writes the choice to shared memory, which every thread
// reads after the barrier at the end.
__device__ __noinline__ void choose_bucket(const Pass& p, bool local, bool by_mass, rule::Goal goal) {
  Local& sh = block_sh;
  if (threadIdx.x < 32) {
    const int lane = static_cast<int>(threadIdx.x);
    u128 mine = 0;
    ull mine_count = 0;
    // The lane's buckets are kept in shared memory for the one lane that looks again.
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int b = 255 - 8 * lane - j;
      uint32_t c;
      u128 m;
      if (local) {
        c = sh.count[b];
        m = by_mass ? static_cast<u128>(sh.m0[b]) + (static_cast<u128>(sh.m1[b]) << 32) +
                          (static_cast<u128>(sh.m2[b]) << 64)
                    : u128{c};
      } else {
        c = load_l2(p.count[b]);
        m = by_mass ? static_cast<u128>(load_l2(p.lo[b])) + (static_cast<u128>(load_l2(p.hi[b])) << 32) : u128{c};
      }
      if (b < sh.floor) {
        c = 0;
        m = 0;
      } else if (b == sh.floor) {
        m = (static_cast<u128>(sh.floor_hi) << 64) | sh.floor_lo;
      }
      sh.pick_count[b] = c;
      sh.pick_lo[b] = static_cast<ull>(m);
      sh.pick_hi[b] = static_cast<ull>(m >> 64);
      mine += m;
      mine_count += c;
    }
    u128 incl = mine;
    ull incl_count = mine_count;
    for (int o = 1; o < 32; o <<= 1) {
      const u128 up = shfl_up128(incl, o);
      const ull cu = __shfl_up_sync(kAll, incl_count, o);
      if (lane >= o) {
        incl += up;
        incl_count += cu;
      }
    }
    const u128 want = goal.of(shfl128(incl, 31));
    u128 before = incl - mine;
    ull count_before = incl_count - mine_count;
    if (before < want && want <= incl) {
      for (int j = 0; j < 8; ++j) {
        const int b = 255 - 8 * lane - j;
        const u128 m = (static_cast<u128>(sh.pick_hi[b]) << 64) | sh.pick_lo[b];
        if (want <= before + m) {
          const u128 need = want - before;
          sh.bucket = static_cast<uint32_t>(b);
          sh.bucket_count = sh.pick_count[b];
          sh.count_before = count_before;
          sh.need_lo = static_cast<ull>(need);
          sh.need_hi = static_cast<ull>(need >> 64);
          sh.only = local ? sh.top[b] : load_l2(p.top[b]);
          break;
        }
        before += m;
        count_before += sh.pick_count[b];
      }
    }
  }
  __syncthreads();
}

// Value buckets a tally sums from (none for 256).
struct Froms {
  int b[kTallies];
};

// The count and weight of the keys in value buckets from.b[i] and above, into shared memory.
__device__ __noinline__ void tally_sums(const Pass& p, Froms from) {
  Local& sh = block_sh;
  if (threadIdx.x < 32) {
    const int lane = static_cast<int>(threadIdx.x);
    ull c[kTallies] = {};
    u128 m[kTallies] = {};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int b = 8 * lane + j;
      const ull cb = load_l2(p.count[b]);
      const u128 mb = static_cast<u128>(load_l2(p.lo[b])) + (static_cast<u128>(load_l2(p.hi[b])) << 32);
#pragma unroll
      for (int i = 0; i < kTallies; ++i) {
        if (b >= from.b[i]) {
          c[i] += cb;
          m[i] += mb;
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kTallies; ++i) {
      for (int o = 16; o > 0; o >>= 1) {
        c[i] += __shfl_xor_sync(kAll, c[i], o);
        m[i] += shfl_xor128(m[i], o);
      }
      if (lane == 0) {
        sh.tally_count[i] = c[i];
        sh.tally_lo[i] = static_cast<ull>(m[i]);
        sh.tally_hi[i] = static_cast<ull>(m[i] >> 64);
      }
    }
  }
  __syncthreads();
}

// The barrier of pass `pass` among a row's `blocks` blocks. The first block clears the next pass's
// sums before arriving: nobody adds into them until all have arrived.
__device__ __noinline__ void grid_barrier(RowScratch& g, bool first, int pass, unsigned blocks) {
  if (first && pass + 1 < kPasses) {
    Pass& n = g.pass[pass + 1];
    for (int b = threadIdx.x; b < 256; b += kThreads) {
      n.count[b] = 0;
      n.lo[b] = n.hi[b] = n.top[b] = 0;
      if (pass == 0) g.vmax[b] = g.vlow[b] = 0;  // the value histogram's ranges, too
    }
  }
  // The block's writes are ordered before thread 0's release by the block barrier, and the other
  // blocks' before this block's reads by its acquire and the barrier after it.
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(&g.arrived) : "memory");
    const unsigned target = blocks * static_cast<unsigned>(pass + 1);
    unsigned seen = 0;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(&g.arrived) : "memory");
    } while (seen < target);
  }
  __syncthreads();
}

// Adds the block's histogram into pass p's sums (the block is `part` of its row). The value histogram
// also keeps each bucket's value range and this block's counts.
__device__ __noinline__ void publish_sums(RowScratch& g, Pass& p, bool value_pass, uint32_t part) {
  const Local& sh = block_sh;
  __syncthreads();
  for (int b = threadIdx.x; b < 256; b += kThreads) {
    if (value_pass && part < kCountedBlocks) {
      *reinterpret_cast<volatile uint16_t*>(&g.block_count[part][b]) = static_cast<uint16_t>(sh.count[b]);
    }
    if (sh.count[b] == 0) continue;
    if (value_pass) {
      atomicMax(&g.vmax[b], sh.vmax[b]);
      atomicMax(&g.vlow[b], sh.vlow[b]);
    }
    atomicAdd(&p.count[b], sh.count[b]);
    if (sh.m0[b] != 0) atomicAdd(&p.lo[b], ull{sh.m0[b]});
    const ull hi = sh.m1[b] | (ull{sh.m2[b]} << 32);
    if (hi != 0) atomicAdd(&p.hi[b], hi);
    *reinterpret_cast<volatile ull*>(&p.top[b]) = sh.top[b];  // the one writer when the row's count is 1
  }
}

// A drawn row's weight of value v (the exp of the rule, out of line: it is called from many sites).
__device__ __noinline__ uint64_t weight_of(rule::WeightRule w, float v) { return w(v); }

// The i-th largest key of one-value bucket b (1-based): the i-th lowest id of its value. The block
// holding it from the per-block counts of b, then its rank there from the block's logits. Every
// thread of the first block calls it.
__device__ __noinline__ uint64_t find_nth(RowScratch& g, int b, uint64_t i, uint32_t blocks, uint32_t bits) {
  Local& sh = block_sh;
  __syncthreads();  // the previous answer has been read
  if (threadIdx.x < 32) {
    const uint32_t lane = threadIdx.x, p0 = 2 * lane, p1 = p0 + 1;
    const ull c0 = p0 < blocks ? load_l2(g.block_count[p0][b]) : 0;
    const ull c1 = p1 < blocks ? load_l2(g.block_count[p1][b]) : 0;
    ull incl = c0 + c1;
    for (int o = 1; o < 32; o <<= 1) {
      const ull up = __shfl_up_sync(kAll, incl, o);
      if (static_cast<int>(lane) >= o) incl += up;
    }
    const ull before = incl - c0 - c1;
    if (before < i && i <= incl) {
      const bool second = i > before + c0;
      sh.nth_block = second ? p1 : p0;
      sh.nth_rank = i - before - (second ? c0 : 0);
    }
  }
  __syncthreads();
  const uint32_t vbits = load_l2(g.vmax[b]);
  const uint64_t rank = sh.nth_rank;
  const uint32_t first_id = sh.nth_block * kBlockKeys + threadIdx.x * kPer;
  const float* row = sh.row;
  const uint32_t vocab = sh.vocab;
  unsigned match = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const uint32_t id = first_id + static_cast<uint32_t>(j);
    if (id < vocab && rule::order_bits(row[id]) == vbits) match |= 1u << j;
  }
  const auto c = static_cast<unsigned>(__popc(match));
  const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  unsigned incl = c;
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned up = __shfl_up_sync(kAll, incl, o);
    if (static_cast<int>(lane) >= o) incl += up;
  }
  if (lane == 31) sh.warp_total[warp] = incl;
  __syncthreads();
  uint64_t before = incl - c;
  for (unsigned w = 0; w < warp; ++w) before += sh.warp_total[w];
  if (before < rank && rank <= before + c) {
    unsigned m = match;
    for (uint64_t k = rank - before; k > 1; --k) m &= m - 1;  // drop the lower matches
    const uint32_t id = first_id + static_cast<uint32_t>(__ffs(m) - 1);
    const ull id_mask = (ull{1} << (bits - 32)) - 1;
    sh.nth_key = (ull{vbits} << (bits - 32)) | (id_mask - id);
  }
  __syncthreads();
  return sh.nth_key;
}

}  // namespace ferry::gpu::sample_grid
