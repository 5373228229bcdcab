#pragma once
// The device side of Programmatic Dependent Launch (gpu/pdl.hpp), and a launch with it. Both device
// functions are no-ops in code built for architectures before sm90 and in a kernel launched without
// the attribute.
#include <cuda_runtime.h>

#include <utility>

#include "gpu/cuda_check.hpp"
#include "gpu/pdl.hpp"

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

// kernel<<<grid, block, smem, stream>>>(args...), with PDL where pdl_configure gives it (inside a
// PdlScope, sm90 code): for kernels that run pdl_wait() before they read what the kernels ahead write.
template <class... Params, class... Args>
void launch_with_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                     Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr{};
  pdl_configure(cfg, attr, reinterpret_cast<const void*>(kernel));
  FERRY_CUDA(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// A launch configuration of `grid` x `block` in clusters of `cluster` blocks, with PDL where `pdl` asks
// for it and pdl_configure gives it. cfg points at the attributes held beside it: not copyable.
struct ClusterLaunch {
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attrs[2] = {};

  ClusterLaunch(const void* kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, dim3 cluster, bool pdl) {
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    if (pdl) pdl_configure(cfg, attrs[0], kernel);
    const unsigned n = cfg.numAttrs;
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = cluster.x;
    attrs[n].val.clusterDim.y = cluster.y;
    attrs[n].val.clusterDim.z = cluster.z;
    cfg.attrs = attrs;
    cfg.numAttrs = n + 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

}  // namespace ferry::gpu
