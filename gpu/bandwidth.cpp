#include "gpu/bandwidth.hpp"

#include <algorithm>
#include <functional>
#include <vector>

#include "gpu/cuda_memory.hpp"

namespace ferry::gpu {
namespace {

// Median milliseconds of `reps` runs of `copy(i)` on one stream, after three untimed ones.
double median_ms(int reps, Stream& st, const std::function<void(int)>& copy) {
  for (int i = 0; i < 3; ++i) copy(i);
  std::vector<float> ms;
  Event e0, e1;
  for (int i = 0; i < std::max(reps, 1); ++i) {
    e0.record(st.get());
    copy(i);
    e1.record(st.get());
    st.synchronize();
    ms.push_back(e1.since(e0));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

double measure_copy_bandwidth(int device, uint64_t bytes, int reps) {
  FERRY_CUDA(cudaSetDevice(device));
  DeviceBuffer a(bytes), b(bytes);
  Stream st;
  FERRY_CUDA(cudaMemsetAsync(a.get(), 1, bytes, st.get()));
  const double ms = median_ms(reps, st, [&](int i) {
    FERRY_CUDA(cudaMemcpyAsync(i % 2 ? a.get() : b.get(), i % 2 ? b.get() : a.get(), bytes, cudaMemcpyDeviceToDevice,
                               st.get()));
  });
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3);
}

double measure_host_to_device_bandwidth(int device, uint64_t bytes, int reps) {
  FERRY_CUDA(cudaSetDevice(device));
  PinnedBuffer host(bytes);
  DeviceBuffer dev(bytes);
  Stream st;
  const double ms = median_ms(reps, st, [&](int) {
    FERRY_CUDA(cudaMemcpyAsync(dev.get(), host.get(), bytes, cudaMemcpyHostToDevice, st.get()));
  });
  return static_cast<double>(bytes) / (ms * 1e-3);
}

}  // namespace ferry::gpu
