// The resident window's CLOCK on the device (gpu/window_plan.hpp). One block per segment (a slot's
// rows of the step; a block per row is launched, those not first in their segment return) walks the
// segment's rows in order, as kv::ResidentWindow::plan does. Per row:
// - hits: every selected position that has a frame pins and references it;
// - misses, k of them in selection order, take the first k of: the free frames, lowest first; then
//   by offset from the hand the unpinned frames without a reference bit (the first sweep); then the
//   unpinned ones that had one (the second sweep, after the first cleared every bit it passed). The
//   bits the hand passed before its last victim are cleared and the hand stops after it: what k
//   calls of kv::ClockPolicy::place do one by one, as block-wide prefix sums over the frames.
// A row's selection holds distinct positions (the indexer's top-k); the host planner also takes a
// repeated one, as a hit.
#include <algorithm>
#include <cub/block/block_scan.cuh>
#include <string>

#include "gpu/cuda_check.hpp"
#include "gpu/window_plan.hpp"

namespace ferry::gpu {
namespace {

constexpr uint32_t kPlanThreads = 1024;
using PlanScan = cub::BlockScan<uint32_t, kPlanThreads>;

// The exclusive prefix of `v` over the block's threads (thread order), and the block's total.
__device__ uint32_t block_prefix(uint32_t v, uint32_t& total, PlanScan::TempStorage& tmp) {
  uint32_t prefix = 0;
  PlanScan(tmp).ExclusiveSum(v, prefix, total);
  __syncthreads();  // tmp is used again
  return prefix;
}

// Each thread owns a contiguous range of [0, n) so that thread order is index order.
__device__ void thread_range(uint32_t n, uint32_t& begin, uint32_t& end) {
  const uint32_t chunk = (n + kPlanThreads - 1) / kPlanThreads;
  begin = min(n, threadIdx.x * chunk);
  end = min(n, begin + chunk);
}

__global__ void __launch_bounds__(kPlanThreads) plan_window_kernel(WindowPlanArgs a) {
  extern __shared__ uint32_t cand[];  // [stride]: the frames a row's misses take, in order
  __shared__ PlanScan::TempStorage tmp;
  __shared__ uint32_t s_hand, s_last, s_free;
  const WindowTables& t = a.t;
  const uint32_t F = t.frames;
  const uint32_t row0 = blockIdx.x;
  if (a.row_first[row0] != static_cast<int32_t>(row0)) return;  // not a segment's first row: the whole block
  uint32_t row_end = row0 + 1;
  while (row_end < a.rows && a.row_first[row_end] == static_cast<int32_t>(row0)) ++row_end;
  const auto slot = static_cast<uint32_t>(a.row_slot[row0]);
  int32_t* pos_frame = t.pos_frame + size_t{slot} * t.context;
  int32_t* frame_pos = t.frame_pos + size_t{slot} * F;
  uint8_t* ref = t.ref + size_t{slot} * F;
  uint8_t* pin = t.pin + size_t{slot} * F;
  uint32_t f0 = 0, f1 = 0;
  thread_range(F, f0, f1);
  uint32_t hits = 0, errors = 0, fetched = 0;
  for (uint32_t r = row0; r < row_end; ++r) {
    const auto count = static_cast<uint32_t>(min(max(a.counts[r], 0), static_cast<int32_t>(a.stride)));
    const int32_t* sel = a.tokens + size_t{r} * a.stride;
    int32_t* out = a.rows_out + size_t{r} * a.stride;
    uint32_t i0 = 0, i1 = 0;
    thread_range(count, i0, i1);
    uint32_t miss = 0;
    for (uint32_t i = i0; i < i1; ++i) {
      const int32_t p = sel[i];
      if (p < 0 || static_cast<uint32_t>(p) >= t.context) {
        ++errors;
        out[i] = static_cast<int32_t>(slot * F);  // a row in bounds; stats() reports the error
        continue;
      }
      const int32_t f = pos_frame[p];
      if (f >= 0) {
        ref[f] = 1;
        pin[f] = 1;
        out[i] = static_cast<int32_t>(slot * F + static_cast<uint32_t>(f));
        ++hits;
      } else {
        out[i] = -1;
        ++miss;
      }
    }
    if (threadIdx.x == 0) {
      s_hand = t.hand[slot];
      s_free = F - min(F, t.resident[slot]);
    }
    uint32_t k = 0;
    const uint32_t miss_first = block_prefix(miss, k, tmp);
    if (k == 0) continue;
    // Free frames, lowest first (a full window, the usual case, skips the pass: the count says so).
    uint32_t total_free = 0, j = 0;
    if (s_free > 0) {
      uint32_t n_free = 0;
      for (uint32_t f = f0; f < f1; ++f) n_free += frame_pos[f] < 0;
      j = block_prefix(n_free, total_free, tmp);
      for (uint32_t f = f0; f < f1; ++f) {
        if (frame_pos[f] >= 0) continue;
        if (j < k) cand[j] = f;
        ++j;
      }
      __syncthreads();  // cand[] before the misses read it
    }
    uint32_t avail = min(k, total_free);
    if (k > total_free) {
      const uint32_t want = k - total_free, h = s_hand;
      // The first sweep's victims: by offset o from the hand, resident, unpinned, unreferenced.
      uint32_t n1 = 0;
      for (uint32_t o = f0; o < f1; ++o) {
        const uint32_t f = h + o < F ? h + o : h + o - F;
        n1 += frame_pos[f] >= 0 && !pin[f] && !ref[f];
      }
      uint32_t total1 = 0;
      j = block_prefix(n1, total1, tmp);
      for (uint32_t o = f0; o < f1; ++o) {
        const uint32_t f = h + o < F ? h + o : h + o - F;
        if (!(frame_pos[f] >= 0 && !pin[f] && !ref[f])) continue;
        if (j < want) cand[total_free + j] = f;
        if (j + 1 == want) s_last = o;
        ++j;
      }
      const bool second = want > total1;
      uint32_t total2 = 0;
      if (second) {
        // The second sweep's: those the first passed with their bit set.
        const uint32_t want2 = want - total1;
        uint32_t n2 = 0;
        for (uint32_t o = f0; o < f1; ++o) {
          const uint32_t f = h + o < F ? h + o : h + o - F;
          n2 += frame_pos[f] >= 0 && !pin[f] && ref[f];
        }
        j = block_prefix(n2, total2, tmp);
        for (uint32_t o = f0; o < f1; ++o) {
          const uint32_t f = h + o < F ? h + o : h + o - F;
          if (!(frame_pos[f] >= 0 && !pin[f] && ref[f])) continue;
          if (j < want2) cand[total_free + total1 + j] = f;
          if (j + 1 == want2) s_last = o;
          ++j;
        }
      }
      __syncthreads();
      avail = min(k, total_free + total1 + total2);
      if (avail == k) {
        const uint32_t last = s_last;
        for (uint32_t o = f0; o < f1; ++o) {
          const uint32_t f = h + o < F ? h + o : h + o - F;
          if (frame_pos[f] >= 0 && !pin[f] && ref[f] && (second || o < last)) ref[f] = 0;
        }
        if (threadIdx.x == 0) t.hand[slot] = h + last + 1 < F ? h + last + 1 : h + last + 1 - F;
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) t.resident[slot] += min(avail, total_free);  // a victim's frame stays resident
    // The misses take their frames: the victims' old positions lose theirs.
    j = miss_first;
    for (uint32_t i = i0; i < i1; ++i) {
      if (out[i] != -1) continue;
      if (j < avail) {
        const uint32_t f = cand[j];
        const int32_t p = sel[i];
        const int32_t old = frame_pos[f];
        if (old >= 0) pos_frame[old] = -1;
        frame_pos[f] = p;
        pos_frame[p] = static_cast<int32_t>(f);
        ref[f] = 1;
        pin[f] = 1;
        out[i] = static_cast<int32_t>(slot * F + f);
        const uint32_t at = atomicAdd(a.fetch_count, 1u);
        if (at < a.fetch_capacity) {
          a.fetches[2 * at] = slot * a.tier_slot_rows + a.tier_row0 + static_cast<uint32_t>(p);
          a.fetches[2 * at + 1] = slot * F + f;
          ++fetched;
        } else {
          ++errors;
        }
      } else {
        out[i] = static_cast<int32_t>(slot * F);  // more than the window could pin: reported
        ++errors;
      }
      ++j;
    }
    __syncthreads();
  }
  for (uint32_t f = f0; f < f1; ++f) pin[f] = 0;
  uint32_t total_hits = 0, total_errors = 0, total_fetched = 0;
  block_prefix(hits, total_hits, tmp);
  block_prefix(errors, total_errors, tmp);
  block_prefix(fetched, total_fetched, tmp);
  if (threadIdx.x == 0) {
    atomicAdd(&a.counts_out->hits, static_cast<unsigned long long>(total_hits));
    atomicAdd(&a.counts_out->misses, static_cast<unsigned long long>(total_fetched));
    atomicAdd(&a.counts_out->step_fetched, static_cast<unsigned long long>(total_fetched));
    if (total_errors > 0) atomicAdd(&a.counts_out->errors, static_cast<unsigned long long>(total_errors));
  }
}

__global__ void adopt_identity_kernel(WindowTables t, uint32_t slot, uint32_t n) {
  const size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < t.context) t.pos_frame[size_t{slot} * t.context + i] = i < n ? static_cast<int32_t>(i) : -1;
  if (i < t.frames) {
    const size_t f = size_t{slot} * t.frames + i;
    t.frame_pos[f] = i < n ? static_cast<int32_t>(i) : -1;
    t.ref[f] = i < n;
    t.pin[f] = 0;
  }
  if (i == 0) {
    t.hand[slot] = 0;
    t.resident[slot] = n;
  }
}

__global__ void invalidate_kernel(WindowTables t, uint32_t slot, uint32_t cut) {
  const uint32_t f = blockIdx.x * blockDim.x + threadIdx.x;
  if (f >= t.frames) return;
  const size_t at = size_t{slot} * t.frames + f;
  const int32_t p = t.frame_pos[at];
  if (p < 0 || static_cast<uint32_t>(p) < cut) return;
  t.pos_frame[size_t{slot} * t.context + static_cast<uint32_t>(p)] = -1;
  t.frame_pos[at] = -1;
  t.ref[at] = 0;
  atomicSub(t.resident + slot, 1u);
}

__global__ void map_positions_kernel(WindowTables t, uint32_t slot, bool map) {
  const uint32_t f = blockIdx.x * blockDim.x + threadIdx.x;
  if (f >= t.frames) return;
  const int32_t p = t.frame_pos[size_t{slot} * t.frames + f];
  if (p < 0 || static_cast<uint32_t>(p) >= t.context) return;
  t.pos_frame[size_t{slot} * t.context + static_cast<uint32_t>(p)] = map ? static_cast<int32_t>(f) : -1;
}

uint32_t blocks_for(uint64_t n) { return static_cast<uint32_t>((n + 255) / 256); }

}  // namespace

void plan_window(const WindowPlanArgs& a, cudaStream_t stream) {
  FERRY_CUDA(cudaMemsetAsync(a.fetch_count, 0, sizeof(uint32_t), stream));
  if (a.rows == 0) return;
  const size_t smem = size_t{a.stride} * sizeof(uint32_t);
  if (smem > 48 * 1024 || a.t.frames == 0) {
    throw CudaError("window plan: a selection of " + std::to_string(a.stride) + " rows over " +
                        std::to_string(a.t.frames) + " frames",
                    ErrorCode::internal);
  }
  plan_window_kernel<<<a.rows, kPlanThreads, smem, stream>>>(a);
  FERRY_CUDA_LAUNCHED();
}

void window_adopt_identity(const WindowTables& t, uint32_t slot, uint32_t n, cudaStream_t stream) {
  adopt_identity_kernel<<<blocks_for(std::max(t.context, t.frames)), 256, 0, stream>>>(t, slot, std::min(n, t.frames));
  FERRY_CUDA_LAUNCHED();
}

void window_invalidate(const WindowTables& t, uint32_t slot, uint32_t cut, cudaStream_t stream) {
  invalidate_kernel<<<blocks_for(t.frames), 256, 0, stream>>>(t, slot, cut);
  FERRY_CUDA_LAUNCHED();
}

void window_unmap_positions(const WindowTables& t, uint32_t slot, cudaStream_t stream) {
  map_positions_kernel<<<blocks_for(t.frames), 256, 0, stream>>>(t, slot, false);
  FERRY_CUDA_LAUNCHED();
}

void window_map_positions(const WindowTables& t, uint32_t slot, cudaStream_t stream) {
  map_positions_kernel<<<blocks_for(t.frames), 256, 0, stream>>>(t, slot, true);
  FERRY_CUDA_LAUNCHED();
}

}  // namespace ferry::gpu
