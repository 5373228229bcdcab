#include "gpu/decode_graphs.hpp"

namespace ferry::gpu {

void DecodeGraphs::run(uint32_t rows, cudaStream_t stream, const std::function<void()>& body) {
  if (!enabled_) {
    body();
    return;
  }
  auto found = graphs_.find(rows);
  if (found != graphs_.end()) {
    found->second.launch(stream);
    return;
  }
  if (seen_[rows]++ == 0) {
    body();
    return;
  }
  // Thread-local capture: the other stages' threads keep making CUDA calls meanwhile.
  FERRY_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    body();
  } catch (...) {
    cudaGraph_t broken = nullptr;
    cudaStreamEndCapture(stream, &broken);
    if (broken != nullptr) cudaGraphDestroy(broken);
    throw;
  }
  GraphExec& g = graphs_[rows];
  g.end_capture(stream);
  g.launch(stream);
}

}  // namespace ferry::gpu
