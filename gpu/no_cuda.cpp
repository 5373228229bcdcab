// The gpu folder's answers in a build without CUDA: no devices, and a reason that says so.
#include "gpu/device_info.hpp"

namespace ferry::gpu {

bool built_with_cuda() { return false; }

std::vector<DeviceInfo> list_devices(std::string* why) {
  if (why) *why = "ferry was built without CUDA (configure with FERRY_CUDA=ON and a CUDA toolkit)";
  return {};
}

}  // namespace ferry::gpu
