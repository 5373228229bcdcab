// What the CUDA timing tests measure with: the replay time of a captured graph and the device's copy
// bandwidth (the figure their GB/s lines are read against). They print; they assert no speed.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "gpu/bandwidth.hpp"
#include "gpu/cuda_memory.hpp"
#include "gpu/pdl.hpp"

namespace ferry::testing {

// Microseconds a replay of the graph of what `body` enqueues: the median of 7 runs of `replays`
// replays after one that warms up, captured under PDL where `pdl` holds and the device has it.
inline double graph_replay_us(const std::function<void(cudaStream_t)>& body, int replays, bool pdl) {
  gpu::Stream s;
  body(s.get());  // eagerly first: kernel attributes and sm90 checks are made outside the capture
  s.synchronize();
  cudaGraph_t g = nullptr;
  cudaGraphExec_t e = nullptr;
  EXPECT_EQ(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
  {
    const gpu::PdlScope scope(pdl && gpu::pdl_device_ready());
    body(s.get());
  }
  EXPECT_EQ(cudaStreamEndCapture(s.get(), &g), cudaSuccess);
  EXPECT_EQ(cudaGraphInstantiate(&e, g, 0), cudaSuccess);
  gpu::Event e0, e1;
  std::vector<float> t;
  for (int run = 0; run < 8; ++run) {
    e0.record(s.get());
    for (int i = 0; i < replays; ++i) cudaGraphLaunch(e, s.get());
    e1.record(s.get());
    s.synchronize();
    if (run > 0) t.push_back(e1.since(e0) * 1000.0f / static_cast<float>(replays));
  }
  cudaGraphExecDestroy(e);
  cudaGraphDestroy(g);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// The device's copy bandwidth in GB/s (read + write, 256 MiB buffers).
inline double copy_gbs() {
  int dev = 0;
  EXPECT_EQ(cudaGetDevice(&dev), cudaSuccess);
  return gpu::measure_copy_bandwidth(dev, 256ull << 20, 5) / 1e9;
}

}  // namespace ferry::testing
