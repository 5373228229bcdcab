#pragma once
// A side stream forked from a stream and joined back to it by events (issue 15): what is enqueued on
// it between fork() and join() runs beside what the stream runs meanwhile; in a captured decode step
// it is a branch of the graph, off the chain of kernels that each wait for the one before. A decode
// step's kernels that feed only a later kernel take it (the mHC sites' comb, KDA's convolution).
#include <cuda_runtime_api.h>

#include "gpu/cuda_memory.hpp"

namespace ferry::gpu {

class StreamBranch {
 public:
  // The side stream, ordered after everything enqueued on `stream` so far.
  cudaStream_t fork(cudaStream_t stream);
  // `stream` waits for what the side stream holds (nothing to do when nothing was forked).
  void join(cudaStream_t stream);
  // Forgets an unjoined fork: a step that threw may have left one in a capture that is gone.
  void abandon() { pending_ = false; }

 private:
  Stream side_;
  Event forked_{false}, joined_{false};
  bool pending_ = false;
};

}  // namespace ferry::gpu
