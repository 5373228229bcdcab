#include "gpu/device_info.hpp"

#include <cuda_runtime.h>

#include <atomic>

#include "gpu/cuda_check.hpp"
#include "gpu/kernels.hpp"

namespace ferry::gpu {
namespace {

// Compiled like every kernel of the build, so the driver loads it the same way: it exists to be asked
// how (cudaFuncGetAttributes).
__global__ void probe_kernel() {}

// An attribute of the current device, asked once per device (a value of 0 is asked again).
int cached_attribute(std::atomic<int> (&cached)[64], cudaDeviceAttr attr) {
  int dev = 0;
  FERRY_CUDA(cudaGetDevice(&dev));
  std::atomic<int>& slot = cached[dev & 63];
  int n = slot.load(std::memory_order_relaxed);
  if (n == 0) {
    FERRY_CUDA(cudaDeviceGetAttribute(&n, attr, dev));
    slot.store(n, std::memory_order_relaxed);
  }
  return n;
}

}  // namespace

std::string kernel_image() {
  cudaFuncAttributes a{};
  FERRY_CUDA(cudaFuncGetAttributes(&a, probe_kernel));
  std::string image = "sm_" + std::to_string(a.binaryVersion);
  if (a.ptxVersion != a.binaryVersion) image += " from compute_" + std::to_string(a.ptxVersion) + " PTX";
  return image;
}

int current_sm_count() {
  static std::atomic<int> cached[64];
  return cached_attribute(cached, cudaDevAttrMultiProcessorCount);
}

int current_smem_optin() {
  static std::atomic<int> cached[64];
  return cached_attribute(cached, cudaDevAttrMaxSharedMemoryPerBlockOptin);
}

bool built_with_cuda() { return true; }

std::vector<DeviceInfo> list_devices(std::string* why) {
  std::vector<DeviceInfo> devices;
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    if (why) *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
    return devices;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaError_t e = cudaGetDeviceProperties(&prop, i); e != cudaSuccess) {
      if (why) *why = std::string("cudaGetDeviceProperties: ") + cudaGetErrorString(e);
      continue;
    }
    DeviceInfo info;
    info.index = i;
    info.name = prop.name;
    info.compute_major = prop.major;
    info.compute_minor = prop.minor;
    info.total_bytes = prop.totalGlobalMem;
    info.multiprocessors = prop.multiProcessorCount;
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaSetDevice(i) == cudaSuccess && cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
      info.free_bytes = free_bytes;
    }
    devices.push_back(info);
  }
  if (devices.empty() && why && why->empty()) *why = "no CUDA device is visible";
  return devices;
}

}  // namespace ferry::gpu
