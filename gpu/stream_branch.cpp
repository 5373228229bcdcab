#include "gpu/stream_branch.hpp"

#include "gpu/cuda_check.hpp"

namespace ferry::gpu {

cudaStream_t StreamBranch::fork(cudaStream_t stream) {
  forked_.record(stream);
  FERRY_CUDA(cudaStreamWaitEvent(side_.get(), forked_.get(), 0));
  pending_ = true;
  return side_.get();
}

void StreamBranch::join(cudaStream_t stream) {
  if (!pending_) return;
  joined_.record(side_.get());
  FERRY_CUDA(cudaStreamWaitEvent(stream, joined_.get(), 0));
  pending_ = false;
}

}  // namespace ferry::gpu
