#pragma once
// The resident window's fetch kernel (gpu/window_copy.cu, used by gpu/kv_window.cpp); a header of its
// own so that the kernel's C++17 translation unit sees nothing else.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ferry::gpu {

// Copies `n` rows from the host tier (device view `src`, row i at src_rows[i] rows of `row_bytes`)
// into window rows dst_rows[i] of `dst`; int8 scales alike (null for other formats).
struct WindowCopy {
  const uint8_t* src = nullptr;
  const float* src_scales = nullptr;
  uint8_t* dst = nullptr;
  float* dst_scales = nullptr;
  const uint32_t* entries = nullptr;  // [n][2]: source row, window row
  uint32_t n = 0;
  // When set, the rows to copy are the first *count of the n entries (a count the device wrote).
  const uint32_t* count = nullptr;
  uint64_t row_bytes = 0;
};
void copy_window_rows(const WindowCopy& c, cudaStream_t stream);

}  // namespace ferry::gpu
