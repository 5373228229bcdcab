#pragma once
// sm80's asynchronous copies from global into shared memory (cp.async), for kernels that keep their
// next loads in flight in shared memory rather than registers (gpu/moe_grouped_int8.cu,
// gpu/matvec_mma.cu). Hosts launch such kernels only on sm80+ code (code_built_for, gpu/pdl.hpp).
#include <cuda_runtime.h>

namespace ferry::gpu {

// Copies `bytes` (16, 8 or 4; dst and src aligned to it) from src into dst; 16-byte copies bypass L1.
__device__ __forceinline__ void cp_async(void* dst, const void* src, int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  if (bytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
  } else if (bytes == 8) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(d), "l"(src) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d), "l"(src) : "memory");
  }
#else
  (void)dst;
  (void)src;
  (void)bytes;
  __trap();
#endif
}

// Closes this thread's copies issued since the last commit into one group.
__device__ __forceinline__ void cp_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

// Waits until at most `Pending` of this thread's latest groups are in flight.
template <int Pending>
__device__ __forceinline__ void cp_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(Pending) : "memory");
#endif
}

}  // namespace ferry::gpu
