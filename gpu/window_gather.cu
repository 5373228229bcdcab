// A prefill chunk's gather past the resident window (gpu/window_gather.hpp). A thread per selected
// entry of the group's rows: the first to find a (slot, position) unclaimed takes the next staging row
// for it. The order of the staging rows is whatever the atomics give; the attention reads each
// selection in its own order, so the sums are the all-resident ones whatever row holds a position.
#include <algorithm>
#include <string>

#include "gpu/cuda_check.hpp"
#include "gpu/window_gather.hpp"

namespace ferry::gpu {
namespace {

constexpr uint32_t kThreads = 256;
constexpr int32_t kTaken = -2;  // claimed, its staging row not yet written

// The (slot, position) key of selection i of row r, or false (past the row's count, or out of range).
__device__ bool selected_key(const GatherGroup& g, uint32_t r, uint32_t i, uint32_t& key, bool& bad) {
  bad = false;
  const auto count = static_cast<uint32_t>(min(max(g.counts[r], 0), static_cast<int32_t>(g.stride)));
  if (i >= count) return false;
  const int32_t p = g.tokens[size_t{r} * g.stride + i];
  if (p < 0 || static_cast<uint32_t>(p) >= g.context) {
    bad = true;
    return false;
  }
  key = static_cast<uint32_t>(g.row_slot[r]) * g.context + static_cast<uint32_t>(p);
  return true;
}

__global__ void claim_kernel(GatherGroup g) {
  const uint32_t r = g.first + blockIdx.y, i = blockIdx.x * kThreads + threadIdx.x;
  uint32_t key = 0;
  bool bad = false;
  if (!selected_key(g, r, i, key, bad)) {
    if (bad) atomicAdd(g.counters + 1, 1u);
    return;
  }
  // A chunk's rows share most positions: a plain read turns away most of the claims before the atomic.
  if (*static_cast<volatile int32_t*>(g.map + key) != -1 || atomicCAS(g.map + key, -1, kTaken) != -1) return;
  const uint32_t at = atomicAdd(g.counters, 1u);
  if (at < g.capacity) g.keys[at] = key;
  g.map[key] = at < g.capacity ? static_cast<int32_t>(at) : kTaken;  // past capacity: the host splits the group
}

__global__ void remap_kernel(GatherGroup g, int32_t* out) {
  const uint32_t r = g.first + blockIdx.y, i = blockIdx.x * kThreads + threadIdx.x;
  uint32_t key = 0;
  bool bad = false;
  if (selected_key(g, r, i, key, bad)) {
    out[size_t{blockIdx.y} * g.stride + i] = max(g.map[key], 0);
  } else if (bad) {
    out[size_t{blockIdx.y} * g.stride + i] = 0;  // a row in bounds; the error is counted
  }
}

__global__ void release_kernel(GatherGroup g) {
  const uint32_t r = g.first + blockIdx.y, i = blockIdx.x * kThreads + threadIdx.x;
  uint32_t key = 0;
  bool bad = false;
  if (selected_key(g, r, i, key, bad)) g.map[key] = -1;
}

// Staging row j, by one block: 16-byte words when every row is whole words.
__device__ void copy_one(const GatherCopy& c, uint32_t j, uint32_t& from_tier) {
  const uint32_t key = c.keys[j];
  const uint32_t slot = key / c.context, pos = key % c.context;
  const int32_t f = c.pos_frame[key];
  const uint8_t* from = nullptr;
  float scale = 0.0f;
  if (f >= 0 && static_cast<uint32_t>(f) < c.frames) {
    const uint64_t row = uint64_t{slot} * c.frames + static_cast<uint32_t>(f);
    from = c.window + row * c.row_bytes;
    if (c.dst_scales != nullptr && threadIdx.x == 0) scale = c.window_scales[row];
  } else {
    const uint64_t row = uint64_t{slot} * c.tier_slot_rows + c.tier_row0 + pos;
    from = c.tier + row * c.row_bytes;
    if (c.dst_scales != nullptr && threadIdx.x == 0) scale = c.tier_scales[row];
    ++from_tier;
  }
  uint8_t* to = c.dst + uint64_t{j} * c.row_bytes;
  if (c.row_bytes % 16 == 0) {
    const auto* s = reinterpret_cast<const uint4*>(from);
    auto* d = reinterpret_cast<uint4*>(to);
    for (uint64_t w = threadIdx.x; w < c.row_bytes / 16; w += blockDim.x) d[w] = s[w];
  } else {
    for (uint64_t b = threadIdx.x; b < c.row_bytes; b += blockDim.x) to[b] = from[b];
  }
  if (c.dst_scales != nullptr && threadIdx.x == 0) c.dst_scales[j] = scale;
}

__global__ void copy_kernel(GatherCopy c) {
  const uint32_t n = min(*c.count, c.capacity);
  uint32_t from_tier = 0;
  for (uint32_t j = blockIdx.x; j < n; j += gridDim.x) copy_one(c, j, from_tier);
  if (threadIdx.x != 0) return;
  if (blockIdx.x == 0) atomicAdd(c.totals, static_cast<unsigned long long>(n));
  if (from_tier > 0) atomicAdd(c.totals + 1, static_cast<unsigned long long>(from_tier));
}

dim3 group_grid(const GatherGroup& g) { return dim3((g.stride + kThreads - 1) / kThreads, g.end - g.first); }

bool group_empty(const GatherGroup& g) {
  if (g.end < g.first || g.end - g.first > 65535 || g.stride == 0 || g.context == 0) {
    throw CudaError("prefill gather: rows [" + std::to_string(g.first) + ", " + std::to_string(g.end) + ") of " +
                        std::to_string(g.stride) + " selections over " + std::to_string(g.context) + " positions",
                    ErrorCode::internal);
  }
  return g.end == g.first;
}

// Blocks for a count the device wrote: enough to keep the host link busy.
constexpr uint32_t kCopyBlocks = 2048;

}  // namespace

void gather_claim(const GatherGroup& g, cudaStream_t stream) {
  FERRY_CUDA(cudaMemsetAsync(g.counters, 0, sizeof(uint32_t), stream));
  if (group_empty(g)) return;
  claim_kernel<<<group_grid(g), kThreads, 0, stream>>>(g);
  FERRY_CUDA_LAUNCHED();
}

void gather_remap(const GatherGroup& g, int32_t* out, cudaStream_t stream) {
  if (group_empty(g)) return;
  remap_kernel<<<group_grid(g), kThreads, 0, stream>>>(g, out);
  FERRY_CUDA_LAUNCHED();
}

void gather_release(const GatherGroup& g, cudaStream_t stream) {
  if (group_empty(g)) return;
  release_kernel<<<group_grid(g), kThreads, 0, stream>>>(g);
  FERRY_CUDA_LAUNCHED();
}

void gather_copy(const GatherCopy& c, uint32_t bound, cudaStream_t stream) {
  const uint32_t blocks = std::min({bound, c.capacity, kCopyBlocks});
  if (blocks == 0) return;
  copy_kernel<<<blocks, 128, 0, stream>>>(c);
  FERRY_CUDA_LAUNCHED();
}

}  // namespace ferry::gpu
