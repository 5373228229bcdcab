#pragma once
// Decode steps replayed from CUDA graphs: one graph per step shape (its rows, segments and longest
// segment: what the launches' sizes depend on; a verify set is a segment of K + 1 rows), captured on
// the second step of that shape (the first runs eagerly and settles lazy initialisation: cuBLAS
// heuristics, the kernels' attributes). A graph reads its step's inputs from fixed device buffers
// (gpu/step_input.hpp), so a replay needs no new arguments. With `pdl`, the capture's launches may use
// Programmatic Dependent Launch (gpu/pdl.hpp) where their kernels are built for it.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "gpu/cuda_memory.hpp"

namespace ferry::gpu {

class DecodeGraphs {
 public:
  explicit DecodeGraphs(bool enabled, bool pdl = false) : enabled_(enabled), pdl_(pdl) {}
  // A step's shape, as run() takes it.
  // `windowed`: a step past the resident KV window (planned on the device), whose launches differ.
  static uint64_t shape(uint32_t rows, uint32_t segments, uint32_t longest_segment, bool windowed = false) {
    return uint64_t{rows} | uint64_t{segments} << 16 | uint64_t{longest_segment} << 32 | uint64_t{windowed} << 63;
  }
  // Enqueues `body` on `stream` for a step of that shape: replayed, captured, or run eagerly.
  void run(uint64_t shape, cudaStream_t stream, const std::function<void()>& body);
  size_t captured() const { return graphs_.size(); }
  // The PDL edges of every graph captured so far.
  size_t programmatic_edges() const { return edges_; }
  // The kernels of the graph captured for `shape`, in order (gpu/graph_kernels.hpp); empty if none.
  std::vector<std::string> kernels(uint64_t shape) const {
    auto found = kernels_.find(shape);
    return found != kernels_.end() ? found->second : std::vector<std::string>{};
  }

 private:
  bool enabled_, pdl_;
  size_t edges_ = 0;
  std::map<uint64_t, GraphExec> graphs_;
  std::map<uint64_t, int> seen_;
  std::map<uint64_t, std::vector<std::string>> kernels_;
};

}  // namespace ferry::gpu
