#pragma once
// The two ceilings a decode step is measured against: device memory (a device-to-device copy) and
// the host link (pinned host memory to the device), each the median of `reps` timed copies of
// `bytes` after a warm-up. Both throw CudaError.
#include <cstdint>

namespace ferry::gpu {

// Bytes read + bytes written per second.
double measure_copy_bandwidth(int device, uint64_t bytes, int reps);
// Bytes moved per second from pinned host memory to the device.
double measure_host_to_device_bandwidth(int device, uint64_t bytes, int reps);

}  // namespace ferry::gpu
