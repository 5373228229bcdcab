#include "gpu/decode_graphs.hpp"

#include "gpu/pdl.hpp"

namespace ferry::gpu {

void DecodeGraphs::run(uint64_t shape, cudaStream_t stream, const std::function<void()>& body) {
  if (!enabled_) {
    body();
    return;
  }
  auto found = graphs_.find(shape);
  if (found != graphs_.end()) {
    found->second.launch(stream);
    return;
  }
  if (seen_[shape]++ == 0) {
    body();
    return;
  }
  // Thread-local capture: the other stages' threads keep making CUDA calls meanwhile.
  FERRY_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    PdlScope pdl(pdl_);
    body();
  } catch (...) {
    cudaGraph_t broken = nullptr;
    cudaStreamEndCapture(stream, &broken);
    if (broken != nullptr) cudaGraphDestroy(broken);
    throw;
  }
  GraphExec& g = graphs_[shape];
  size_t edges = 0;
  g.end_capture(stream, &edges, &kernels_[shape]);
  edges_ += edges;
  g.launch(stream);
}

}  // namespace ferry::gpu
