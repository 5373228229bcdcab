// The resident window's fetches (gpu/kv_window.hpp): host tier rows, read through the device's view
// of pinned memory, into window rows.
#include <algorithm>

#include "gpu/cuda_check.hpp"
#include "gpu/window_copy.hpp"

namespace ferry::gpu {
namespace {

// Entry i, by one block: 16-byte words when every row is whole words (aligned: row i at i * row_bytes).
__device__ void copy_row(const WindowCopy& c, uint32_t i) {
  const uint64_t src_row = c.entries[2 * i], dst_row = c.entries[2 * i + 1];
  const uint8_t* from = c.src + src_row * c.row_bytes;
  uint8_t* to = c.dst + dst_row * c.row_bytes;
  if (c.row_bytes % 16 == 0) {
    const auto* f = reinterpret_cast<const uint4*>(from);
    auto* t = reinterpret_cast<uint4*>(to);
    for (uint64_t w = threadIdx.x; w < c.row_bytes / 16; w += blockDim.x) t[w] = f[w];
  } else {
    for (uint64_t b = threadIdx.x; b < c.row_bytes; b += blockDim.x) to[b] = from[b];
  }
  if (c.src_scales != nullptr && threadIdx.x == 0) c.dst_scales[dst_row] = c.src_scales[src_row];
}

__global__ void copy_window_rows_kernel(WindowCopy c) {
  const uint32_t n = c.count != nullptr ? min(*c.count, c.n) : c.n;
  for (uint32_t i = blockIdx.x; i < n; i += gridDim.x) copy_row(c, i);
}

// A fixed grid for a count the device wrote (a captured step): enough blocks to keep the host link busy.
constexpr uint32_t kCountedBlocks = 256;

}  // namespace

void copy_window_rows(const WindowCopy& c, cudaStream_t stream) {
  if (c.n == 0) return;
  copy_window_rows_kernel<<<c.count != nullptr ? std::min(c.n, kCountedBlocks) : c.n, 128, 0, stream>>>(c);
  FERRY_CUDA_LAUNCHED();
}

}  // namespace ferry::gpu
