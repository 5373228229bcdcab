#pragma once
// What CUDA devices this process can use, asked of the runtime once; empty without CUDA or a GPU.
#include <cstdint>
#include <string>
#include <vector>

namespace ferry::gpu {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int compute_major = 0;
  int compute_minor = 0;
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;
  int multiprocessors = 0;
};

// False when ferry was built without CUDA.
bool built_with_cuda();
// The devices visible now; an empty list (and `why` set) when there are none or the driver fails.
std::vector<DeviceInfo> list_devices(std::string* why = nullptr);

}  // namespace ferry::gpu
