#pragma once
// The device side of Programmatic Dependent Launch (gpu/pdl.hpp). Both are no-ops in code built for
// architectures before sm90 and in a kernel launched without the attribute.
#include <cuda_runtime.h>

namespace ferry::gpu {

// Blocks until the kernels this one depends on have completed and their writes are visible.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel in the stream (if launched with PDL) start its blocks now; it still waits for
// this kernel's completion before it reads what this kernel writes.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace ferry::gpu
